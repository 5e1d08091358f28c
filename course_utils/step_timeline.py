"""One training step's memory over time, operation by operation, from the planner's own record of it (lesson 4).

The planner follows the step on fake tensors under the course's tracker
(``course_utils._fake_step``); with the tracker's timeline record on
(``course_utils._step_tracker.recording_timeline``) the same fake step also
says how much each part held after every operation and every free.
:func:`plan_step_timeline` returns that record as a :class:`StepTimeline`:
the forward pass's ramp, the backward pass's saw-tooth, the optimizer step's
bump, in bytes, for any model the planner plans.

A deep model is planned from copies with a few blocks, and so is its timeline.
Two copies one block apart line up operation by operation, except for the
operations of the one block the deeper copy has more (in each pass and in a
per-parameter optimizer step). Every operation's bytes change linearly with
depth and with how many blocks ran before it, so the full depth's timeline is
the deeper copy's with that block's operations repeated as many times as the
model has blocks more, each repetition and everything after it shifted by the
bytes one more block adds (:func:`_deepen`). As the planner checks that its
probes grow linearly, the timeline checks its copies: two copies extended by
one block must give the next copy's timeline exactly, point for point, and
the full depth's highest point must be the planner's peak. Where a shallow
copy behaves differently (BERT's first block), deeper copies are tried, and
failing that the timeline is the deepest copy's, and says so (``blocks_drawn``).
``tests/test_step_timeline.py`` holds the extrapolated timeline equal to the
byte to a whole model's.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import torch

from course_utils import _fake_step, planner
from course_utils._step_tracker import PARTS, recording_timeline

__all__ = ["DRAWN_PARTS", "StepTimeline", "plan_step_timeline"]

# The parts a timeline is split into, from the tracker's categories.
DRAWN_PARTS = ("weights", "optimizer state", "gradients", "activations", "temporaries")
_DEEPEST_COPY = 8  # blocks: deeper copies cost as much as following the model whole
_cache: dict[str, StepTimeline] = {}


@dataclass(frozen=True, eq=False)
class StepTimeline:
    """The memory of one training step after each of its operations, by part (bytes).

    - ``phases``: for each point, "forward 1", "backward 1", ... (one pair per
      micro-batch), "optimizer step", or "zero_grad" (the gradients freed).
    - ``operations``: for each point, the aten operation that ran ("mm",
      "add_"...), or "free" when a tensor was freed; only those that changed
      the memory held.
    - ``held``: an int64 array of shape (points, len(DRAWN_PARTS)), bytes of
      each of :data:`DRAWN_PARTS` after each point. Optimizer state is the
      state held between steps; what ``optimizer.step()`` allocates beyond it,
      and whatever the backward pass allocates that is not a gradient, are
      temporaries.
    - ``blocks``: the model's repeated blocks (None if it has none);
      ``blocks_drawn``: the blocks of the copy the timeline is of (equal to
      ``blocks`` unless the timeline is a shallow copy's, see the module).
    - ``extrapolated``: True when the points were extrapolated from copies with
      fewer blocks, False when followed whole.
    """

    phases: tuple[str, ...]
    operations: tuple[str, ...]
    held: np.ndarray
    blocks: int | None
    blocks_drawn: int | None
    extrapolated: bool

    @property
    def totals(self) -> np.ndarray:
        """Bytes held after each point, all parts together."""
        return self.held.sum(axis=1)

    @property
    def peak_index(self) -> int:
        """The point where the most is held (the first, if several)."""
        return int(np.argmax(self.totals))

    @property
    def peak(self) -> int:
        """The most bytes held at once over the step."""
        return int(self.totals[self.peak_index])


def plan_step_timeline(
    model: torch.nn.Module, optimizer: str, batch_size: int, seq_len: int, *, mixed_precision: str = "no",
    gradient_accumulation_steps: int = 1, **optimizer_options: object,
) -> StepTimeline:
    """Return the :class:`StepTimeline` of the step :func:`course_utils.planner.estimate_training_memory` plans (cached).

    Same arguments, meaning and refusals as the planner (one process only);
    the timeline's peak is the planner's. Built once per set-up; asked again,
    it is returned from a cache at once.
    """
    planned = planner.estimate_training_memory(
        model, optimizer, batch_size, seq_len, mixed_precision=mixed_precision,
        gradient_accumulation_steps=gradient_accumulation_steps, **optimizer_options,
    )  # checks every argument, refuses what it cannot follow, and gives the peak to meet
    step = {
        "optimizer": optimizer.lower(), "options": optimizer_options, "batch_size": batch_size,
        "seq_len": seq_len, "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps, "world_size": 1, "strategy": "none",
    }
    step["optimizer"] = planner._check_optimizer_name(optimizer)
    key = planner._cache_key(model, step)
    if key not in _cache:
        gc.freeze()  # as the planner does: the step's collections skip what exists already
        try:
            _cache[key] = _timeline(model, step, planned.peak)
        finally:
            gc.unfreeze()
    return _cache[key]


def _timeline(model: torch.nn.Module, step: dict, peak: int) -> StepTimeline:
    layers, layer_list = _fake_step.repeated_layers(model)
    if layer_list is None or layers <= sum(_fake_step.PROBE_LAYERS):
        return _as_timeline(_record(model, step, None), layers, layers, False)
    records = {depth: _record(model, step, depth) for depth in (1, 2)}
    for depth in range(3, min(layers, _DEEPEST_COPY) + 1):
        records[depth] = _record(model, step, depth)
        # Two copies extrapolated one block deeper must give the third exactly, and the full
        # depth the planner's peak: then every block beyond repeats the last one.
        if _same(_deepen(records[depth - 2], records[depth - 1], 1), records[depth]):
            deepened = _as_timeline(_deepen(records[depth - 1], records[depth], layers - depth), layers, layers, True)
            if deepened.peak == peak:
                return deepened
    deepest = max(records)
    return _as_timeline(records[deepest], layers, deepest, False)


def _same(segments: list | None, others: list) -> bool:
    """Return True when two recorded timelines have the same phases, operations and bytes."""
    return segments is not None and len(segments) == len(others) and all(
        label == other_label and names == other_names and np.array_equal(held, other_held)
        for (label, names, held), (other_label, other_names, other_held) in zip(segments, others)
    )


def _record(model: torch.nn.Module, step: dict, layers: int | None) -> list[tuple[str, str, tuple]]:
    """Return the tracker's timeline record of the planner's whole fake step on the first ``layers`` blocks, by segment."""
    with recording_timeline() as record:
        _fake_step.full_fake_step(model, step, layers)
    return _segments(record)


def _segments(record: list) -> list[tuple[str, list[str], np.ndarray]]:
    """Return ``record`` cut where the phase changes: (phase numbered by micro-batch, operations, bytes by PARTS)."""
    segments, passes, current = [], 0, None
    for phase, operation, held in record:
        if phase != current:
            current = phase
            passes += phase == "forward"
            numbered = phase in ("forward", "backward")
            segments.append((f"{phase} {passes}" if numbered else phase, [], []))
        segments[-1][1].append(operation)
        segments[-1][2].append(held)
    return [(label, operations, np.array(held, dtype=np.int64).reshape(-1, len(PARTS)))
            for label, operations, held in segments]


def _deepen(shallow: list, deeper: list, more: int) -> list | None:
    """Return ``deeper`` (a copy one block deeper than ``shallow``) extended by ``more`` blocks, or None if they do not line up.

    In each segment the deeper copy's operations are the shallow copy's with
    one block's ``d`` operations inserted after a common beginning of ``p``
    points (taken just before the shallow copy's last block). With ``D(i)`` the change from the shallow to the deeper copy at
    the i-th shared point (one block more in the model), and ``B(k)`` the
    change from the block's k-th operation in the block before to the same
    operation in the inserted block (one block more has run before it):
    shared points before the insert move by ``more * D``, the inserted block
    is repeated ``more + 1`` times, the r-th copy moved by ``r * B + more * D``
    of its match in the block before, and the points after move by ``more * D``.
    """
    if [label for label, *_ in shallow] != [label for label, *_ in deeper]:
        return None
    out = []
    for (label, names_1, held_1), (_, names_2, held_2) in zip(shallow, deeper):
        n1, d = len(names_1), len(names_2) - len(names_1)
        if d < 0:
            return None
        p = 0
        while p < n1 and names_1[p] == names_2[p]:
            p += 1
        # Insert before the shallow copy's last block, not after it: a last block can differ (what
        # follows it frees or keeps its output), so the two copies' last blocks are lined up.
        p = max(p - d, 0)
        # The inserted block must follow a whole block like it, and what follows must line up.
        if names_2[p + d:] != names_1[p:] or (d and (p < d or names_2[p - d:p] != names_2[p:p + d])):
            return None
        depth_shift = np.concatenate([held_2[:p] - held_1[:p], held_2[p + d:] - held_1[p:]])
        before, after = held_2[:p] + more * depth_shift[:p], held_2[p + d:] + more * depth_shift[p:]
        copies = []
        if d:
            block = held_2[p:p + d]
            block_shift = block - held_2[p - d:p]
            block_depth_shift = depth_shift[p - d:p]
            copies = [block + r * block_shift + more * block_depth_shift for r in range(more + 1)]
        held = np.concatenate([before, *copies, after]) if copies else np.concatenate([before, after])
        out.append((label, names_2[:p] + names_2[p:p + d] * (more + 1) + names_2[p + d:], held))
    return out


def _as_timeline(segments: list, blocks: int | None, blocks_drawn: int | None, extrapolated: bool) -> StepTimeline:
    """Return the segments as a :class:`StepTimeline`, the tracker's categories gathered into :data:`DRAWN_PARTS`."""
    phases = tuple(label for label, names, _ in segments for _ in names)
    operations = tuple(name for _, names, _ in segments for name in names)
    by_category = np.concatenate([held for *_, held in segments]) if segments else np.zeros((0, len(PARTS)), np.int64)
    column = {part: by_category[:, index] for index, part in enumerate(PARTS)}
    state = column["Optstate"].copy()
    in_step = np.array([phase in ("optimizer step", "zero_grad") for phase in phases], dtype=bool)
    if in_step.any():
        # Inside optimizer.step() MemTracker files everything allocated as optimizer state:
        # the state is what was held when the step began, the rest the step's temporaries.
        held_before = state[np.argmax(in_step) - 1] if np.argmax(in_step) > 0 else state[in_step][0]
        state[in_step] = np.minimum(state[in_step], held_before)
    temporaries = column["Temp"] + column["Other"] + column["Optstate"] - state
    held = np.stack([column["Parameter"] + column["Buffer"], state, column["Gradient"], column["Activation"],
                     temporaries], axis=1)
    return StepTimeline(phases, operations, held, blocks, blocks_drawn, extrapolated)
