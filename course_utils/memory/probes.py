"""The planner's probes: a deep model followed as copies with 1, 2 and 3 blocks, and extrapolated to its depth.

A stack of identical blocks (:func:`repeated_layers`) costs a fixed amount
plus the same amount per block. :func:`plan_by_probes` follows copies with
:data:`PROBE_LAYERS` blocks (each made by :func:`config_with_layers`'s
trimmed config), checks that every quantity grows by the same bytes per block
and extrapolates (:func:`extrapolate`); while a shallow copy peaks elsewhere,
it slides the probes one block deeper. Each moment of a pass grows linearly,
but a pass's peak is its highest moment, which can move as blocks are added
(GPT-2's backward, bf16, 4 x 128: to its head's softmax gradient, which grows
faster per block): given the passes' timelines, each moment is extrapolated
too (``deepening.deepen``), and where the two answers differ the moments'
answer is taken, checked against a third copy. How each copy is followed (one
process on fake tensors, or one of several under FSDP, whose timelines are
not recorded) is the caller's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from course_utils.memory.deepening import deepen, same
from course_utils.memory.step import PHASES
from course_utils.memory.training_memory import TrainingMemory

__all__ = ["PROBE_LAYERS", "config_with_layers", "extrapolate", "plan_by_probes", "repeated_layers"]

PROBE_LAYERS = (1, 2, 3)
_FIELDS = ("weights", "gradients", "optimizer_state", "activations")
_LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "n_layers")


def plan_by_probes(layers: int, follow: Callable[[int], tuple[TrainingMemory, list]],
                   expect_one_more: Callable[[], None],
                   timeline_of: Callable[[int], tuple | None] | None = None) -> TrainingMemory | None:
    """Return the memory at ``layers`` blocks extrapolated from ``follow(k)`` of copies with k blocks, or None.

    ``follow(k)`` returns a copy's memory and each of its micro-batches'
    (forward, backward) peaks; ``expect_one_more()`` is called before each
    copy beyond the first three; ``timeline_of(k)``, when given, returns the
    timeline of the copy's passes that ``follow(k)`` recorded (``Passes.timeline``),
    or None. None when the probes never grow linearly while they cost less
    than the whole model: then follow it whole.
    """
    def probe(k):
        memory, peaks = follow(k)
        return memory, peaks, timeline_of(k) if timeline_of is not None else None

    def extrapolated(runs, first, checked=True):
        timelines = [r[2] for r in runs]
        return extrapolate([r[0] for r in runs], layers, first, [r[1] for r in runs],
                           None if any(t is None for t in timelines) else timelines, checked)

    runs = [probe(k) for k in PROBE_LAYERS]
    first = min(PROBE_LAYERS)
    planned = _by_peaks_or_moments(runs, first, extrapolated)
    # A shallow model can peak where a deeper one does not (BERT's backward peaks by its head
    # with one block, in its first block from two on; an accumulated GPT-2 backward moves until
    # three), and copies too shallow may not line up moment by moment: slide the probes one
    # block deeper, while they cost less than the whole model.
    while planned is None and layers > sum(range(min(PROBE_LAYERS), first + len(runs) + 1)):
        first += 1
        expect_one_more()
        runs = [*runs[1:], probe(first + len(PROBE_LAYERS) - 1)]
        planned = _by_peaks_or_moments(runs, first, extrapolated)
    return planned


def _by_peaks_or_moments(runs: list, first: int, extrapolated: Callable) -> TrainingMemory | None:
    """Return the probes extrapolated peak by peak where no pass's highest moment moves, else moment by moment, or None.

    Each pass's peak extrapolated alone is checked against each of its moments
    extrapolated from the two deepest copies (quick, unchecked): where they
    agree, no highest moment moves as blocks are added. Where they differ (a
    pass's highest moment moves: GPT-2's backward, to its head), the moments
    are extrapolated checked (the first two copies extended by a block give
    the third); None if they do not line up.
    """
    planned = extrapolated(runs, first, checked=None)
    if planned is None:
        return None
    moment_by_moment = extrapolated(runs, first, checked=False)
    if moment_by_moment is None or moment_by_moment == planned:
        return planned
    return extrapolated(runs, first, checked=True)


def extrapolate(
    probes: list[TrainingMemory], layers: int, first: int = 1, micro_batch_peaks: list[list] | None = None,
    timelines: list[tuple] | None = None, checked: bool | None = True,
) -> TrainingMemory | None:
    """Return the memory at ``layers`` blocks from runs with ``first`` to ``first + 2`` blocks, or None unless linear.

    With ``micro_batch_peaks`` (each probe's (forward, backward) peak of every
    micro-batch), each of those is extrapolated on its own and a phase's peak
    is their largest: the first micro-batch (no gradients yet) and the later
    ones grow by different bytes per block, so their largest need not be linear.
    With ``timelines`` too (each probe's ``Passes.timeline``), each pass's
    peak is the highest of its moments, each extrapolated on its own
    (``deepening.deepen``): a pass's highest moment can move, as blocks are
    added, to one that grows faster per block (GPT-2's backward, from inside
    a block to its head's softmax gradient), so its peak need not be linear either.
    """
    series = {f: [getattr(p, f) for p in probes] for f in _FIELDS}
    series.update({phase: [p.peak_by_phase[phase] for p in probes] for phase in PHASES})
    highest = None
    if micro_batch_peaks is not None:
        for phase in PHASES[:2]:
            del series[phase]
        if timelines is not None and checked is not None:
            highest = _highest_moments(timelines, layers - first - 2, checked)
            if highest is None:
                return None
        for index, pairs in enumerate(zip(*micro_batch_peaks)):
            for phase, peaks in zip(PHASES[:2], zip(*pairs)):
                series[phase, index] = list(peaks)
                if highest is not None:
                    # What the passes do not hold (the optimizer state) over their highest moment.
                    series[phase, index] = [peak - _moments_peak(timeline, phase, index)
                                            for peak, timeline in zip(peaks, timelines)]
    at_depth = {}
    for quantity, (one, two, three) in series.items():
        if two - one != three - two:
            return None
        at_depth[quantity] = one + (layers - first) * (two - one)
    if highest is not None:
        for key in [key for key in at_depth if isinstance(key, tuple)]:
            at_depth[key] += _moments_peak(highest, *key)
    peaks = {
        phase: at_depth[phase] if phase in at_depth
        else max(value for key, value in at_depth.items() if isinstance(key, tuple) and key[0] == phase)
        for phase in PHASES
    }
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    return TrainingMemory(
        **{f: at_depth[f] for f in _FIELDS}, peak=peaks[phase_of_peak], phase_of_peak=phase_of_peak,
        peak_by_phase=peaks,
    )


def _highest_moments(timelines: list[tuple], more: int, checked: bool) -> list | None:
    """Return the deepest probe's timeline ``more`` blocks deeper, or None unless the probes line up.

    ``checked``: the first two probes extended by one block must give the third exactly.
    """
    one, two, three = (list(timeline) for timeline in timelines)
    if checked and not same(deepen(one, two, 1), three):
        return None
    return deepen(two, three, more)


def _moments_peak(timeline: tuple, phase: str, index: int) -> int:
    """Return the most bytes held in micro-batch ``index``'s ``phase`` ("forward" or "backward") of a passes' timeline.

    A micro-batch not run (the passes stopped at a repeat) repeats the last
    one run; the pass starts from what the one before it left.
    """
    labels = [label for label, *_ in timeline]
    runs = [i for i, label in enumerate(labels) if label.startswith(phase + " ")]
    at = runs[min(index, len(runs) - 1)]
    highest = int(timeline[at][2].max()) if len(timeline[at][2]) else 0
    return max(highest, int(timeline[at - 1][2][-1])) if at > 0 and len(timeline[at - 1][2]) else highest


def _layer_count(config) -> int | None:
    """Return the number of repeated blocks the config declares, or None."""
    for name in _LAYER_COUNT_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def config_with_layers(config, layers: int, count: int):
    """Return a copy of ``config`` describing only its first ``layers`` of ``count`` blocks (per-layer types too)."""
    config = copy.deepcopy(config)
    _set_layer_count(config, layers)
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == count:
        config.layer_types = layer_types[:layers]
    return config


def _set_layer_count(config, layers: int) -> None:
    for name in _LAYER_COUNT_NAMES:
        if isinstance(getattr(config, name, None), int):
            setattr(config, name, layers)
            return


def repeated_layers(model: torch.nn.Module) -> tuple[int | None, torch.nn.ModuleList | None]:
    """Return (number of blocks, their ModuleList) when the model is a stack of identical blocks, else (n, None).

    Identical: one ModuleList as long as the config's layer count, every block
    the same class with the same parameter names, shapes, dtypes and
    ``requires_grad``, the same checkpointing flag, and the same layer type.
    """
    count = _layer_count(model.config)
    if count is None:
        return None, None
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count and count > 0]
    if len(lists) != 1:
        return count, None
    layer_list = lists[0]
    signatures = {_block_signature(block) for block in layer_list}
    layer_types = getattr(model.config, "layer_types", None)
    if len(signatures) != 1 or (isinstance(layer_types, list) and len(set(layer_types)) > 1):
        return count, None
    return count, layer_list


def _block_signature(block: torch.nn.Module) -> str:
    """Return what makes one block cost what it costs: its modules, parameters and checkpointing."""
    parts = [
        (name, type(m).__name__, bool(getattr(m, "gradient_checkpointing", False)))
        for name, m in block.named_modules()
    ]
    parts += [
        (name, tuple(p.shape), str(p.dtype), p.requires_grad) for name, p in block.named_parameters()
    ]
    return repr(parts)
