"""The planner's probes: a deep model followed as copies with 1, 2 and 3 blocks, and extrapolated to its depth.

A stack of identical blocks (:func:`repeated_layers`) costs a fixed amount
plus the same amount per block. :func:`plan_by_probes` follows copies with
:data:`PROBE_LAYERS` blocks (each made by :func:`config_with_layers`'s
trimmed config), checks that every quantity grows by the same bytes per block
and extrapolates (:func:`extrapolate`); while a shallow copy peaks elsewhere,
it slides the probes one block deeper. How each copy is followed (one process
on fake tensors, or one of several under FSDP) is the caller's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from course_utils.memory.step import PHASES
from course_utils.memory.training_memory import TrainingMemory

__all__ = ["PROBE_LAYERS", "config_with_layers", "extrapolate", "plan_by_probes", "repeated_layers"]

PROBE_LAYERS = (1, 2, 3)
_FIELDS = ("weights", "gradients", "optimizer_state", "activations")
_LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "n_layers")


def plan_by_probes(layers: int, follow: Callable[[int], tuple[TrainingMemory, list]],
                   expect_one_more: Callable[[], None]) -> TrainingMemory | None:
    """Return the memory at ``layers`` blocks extrapolated from ``follow(k)`` of copies with k blocks, or None.

    ``follow(k)`` returns a copy's memory and each of its micro-batches'
    (forward, backward) peaks; ``expect_one_more()`` is called before each
    copy beyond the first three. None when the probes never grow linearly
    while they cost less than the whole model: then follow it whole.
    """
    runs = [follow(k) for k in PROBE_LAYERS]
    first = min(PROBE_LAYERS)
    planned = extrapolate([r[0] for r in runs], layers, first, [r[1] for r in runs])
    # A shallow model can peak where a deeper one does not (BERT's backward peaks by its head
    # with one block, in its first block from two on; an accumulated GPT-2 backward moves until
    # three): slide the probes one block deeper, while they cost less than the whole model.
    while planned is None and layers > sum(range(min(PROBE_LAYERS), first + len(runs) + 1)):
        first += 1
        expect_one_more()
        runs = [*runs[1:], follow(first + len(PROBE_LAYERS) - 1)]
        planned = extrapolate([r[0] for r in runs], layers, first, [r[1] for r in runs])
    return planned


def extrapolate(
    probes: list[TrainingMemory], layers: int, first: int = 1, micro_batch_peaks: list[list] | None = None
) -> TrainingMemory | None:
    """Return the memory at ``layers`` blocks from runs with ``first`` to ``first + 2`` blocks, or None unless linear.

    With ``micro_batch_peaks`` (each probe's (forward, backward) peak of every
    micro-batch), each of those is extrapolated on its own and a phase's peak
    is their largest: the first micro-batch (no gradients yet) and the later
    ones grow by different bytes per block, so their largest need not be linear.
    """
    series = {f: [getattr(p, f) for p in probes] for f in _FIELDS}
    series.update({phase: [p.peak_by_phase[phase] for p in probes] for phase in PHASES})
    if micro_batch_peaks is not None:
        for phase in PHASES[:2]:
            del series[phase]
        for index, pairs in enumerate(zip(*micro_batch_peaks)):
            for phase, peaks in zip(PHASES[:2], zip(*pairs)):
                series[phase, index] = list(peaks)
    at_depth = {}
    for quantity, (one, two, three) in series.items():
        if two - one != three - two:
            return None
        at_depth[quantity] = one + (layers - first) * (two - one)
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
