"""One training step's memory over time, operation by operation, from the planner's own record of it (lesson 4).

The planner follows the step on fake tensors under the course's tracker
(``course_utils.memory.fake_step``); with the tracker's timeline record on
(``_step_tracker.recording_timeline``) the same fake step also
says how much each part held after every operation and every free.
:func:`plan_step_timeline` returns that record as a :class:`StepTimeline`:
the forward pass's ramp, the backward pass's saw-tooth, the optimizer step's
bump, in bytes, for any model the planner plans.

A deep model is planned from copies with a few blocks, and so is its timeline:
the deeper of two copies one block apart, with that block's operations repeated
up to the model's depth (``course_utils.memory.deepening`` says how). As the planner checks that its
probes grow linearly, the timeline checks its copies: two copies extended by
one block must give the next copy's timeline exactly, point for point.
Where a shallow copy behaves differently (BERT's first block), deeper copies
are tried, and failing that the timeline is the deepest copy's, and says so
(``blocks_drawn``). A run of tensors freed together (autocast's cache of
bf16 weights, freed in an order no copy repeats) is one point, after the run.
``tests/memory/test_step_timeline.py`` holds the extrapolated timeline equal
to the byte to a whole model's.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import torch

from course_utils.memory import fake_step, plan_cache, probes
from course_utils.memory._step_tracker import PARTS, recording_timeline
from course_utils.memory.deepening import deepen, same, segments
from course_utils.memory.planner import plan
from course_utils.memory.setup import TrainingSetup
from course_utils.validation import check_bool, check_instance

__all__ = ["DRAWN_PARTS", "StepTimeline", "plan_step_timeline", "plan_timeline"]

# The parts a timeline is split into, from the tracker's categories.
DRAWN_PARTS = ("weights", "optimizer state", "gradients", "activations", "temporaries")
_DEEPEST_COPY = 8  # blocks: deeper copies cost as much as following the model whole


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
    gradient_accumulation_steps: int = 1, whole: bool = False, **optimizer_options: object,
) -> StepTimeline:
    """Return the :class:`StepTimeline` of the step :func:`course_utils.memory.estimate_training_memory` plans (cached).

    Same arguments, meaning and refusals as the planner (one process only).
    Its highest point is the peak of the whole step followed on fake tensors
    (``fake_step.full_fake_step``), the planner's for a model it follows
    whole. Built once per set-up; asked again, it is returned from a cache at once.
    ``whole=True`` follows the whole model however deep, no copies
    extrapolated: exact and slower, to check an extrapolated timeline.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    setup = TrainingSetup(optimizer, batch_size, seq_len, mixed_precision, gradient_accumulation_steps,
                          optimizer_options)
    return plan_timeline(model, setup, whole=whole)


def plan_timeline(model: torch.nn.Module, setup: TrainingSetup, *, whole: bool = False) -> StepTimeline:
    """Return :func:`plan_step_timeline` of ``model`` with ``setup`` (a :class:`TrainingSetup`): its choices in one value."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(setup, "setup", TrainingSetup, "a TrainingSetup")
    check_bool(whole, "whole")
    plan(model, setup)  # refuses what the planner cannot follow, with the reason
    # In the planner's one cache, beside its runs: the same model fingerprint and set-up.
    key = ("timeline", plan_cache.model_fingerprint(model).passes, setup, whole)
    if key not in plan_cache.cache:
        gc.freeze()  # as the planner does: the step's collections skip what exists already
        try:
            plan_cache.cache[key] = _timeline(model, setup, whole)
        finally:
            gc.unfreeze()
    return plan_cache.cache[key]


def _timeline(model: torch.nn.Module, step: TrainingSetup, whole: bool) -> StepTimeline:
    layers, layer_list = probes.repeated_layers(model)
    if whole or layer_list is None or layers <= sum(probes.PROBE_LAYERS):
        return _as_timeline(_record(model, step, None), layers, layers, False)
    records = {depth: _record(model, step, depth) for depth in (1, 2)}
    for depth in range(3, min(layers, _DEEPEST_COPY) + 1):
        records[depth] = _record(model, step, depth)
        # Two copies extrapolated one block deeper must give the third exactly: then every
        # block beyond repeats the last one.
        if same(deepen(records[depth - 2], records[depth - 1], 1), records[depth]):
            return _as_timeline(deepen(records[depth - 1], records[depth], layers - depth), layers, layers, True)
    deepest = max(records)
    return _as_timeline(records[deepest], layers, deepest, False)


def _record(model: torch.nn.Module, step: TrainingSetup, layers: int | None) -> list[tuple[str, str, tuple]]:
    """Return the tracker's timeline record of the planner's whole fake step on the first ``layers`` blocks, by segment."""
    with recording_timeline() as record:
        fake_step.full_fake_step(model, step, layers)
    return segments(record)


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
