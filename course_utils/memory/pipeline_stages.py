"""The planner per process under pipeline parallelism: what one stage holds through its step (lesson 9).

A process of a pipeline-parallel :class:`course_utils.layouts.Layout` runs one
stage (``layouts.pipeline_stage``: the first the embeddings, each a range of
blocks, the last the norm and head) in torch's ``PipelineStage``, driven by
``ScheduleGPipe`` or ``Schedule1F1B`` over ``layout.microbatches``
micro-batches (``layouts.pipeline_schedule``). Its step (:func:`stage_step`):
the schedule's ``step`` (every micro-batch's forward and backward passes, in
the schedule's order, their activations sent to the next stage and their
gradients to the one before), then the optimizer's step over the stage's
parameters.

What the stage holds through it, in bytes (a :class:`TrainingMemory`):

- ``weights``, ``gradients``, ``optimizer_state``: the stage's own, as one
  process's step holds them;
- ``activations``: the most the stage holds when a backward pass begins, the
  schedule's worst moment. GPipe runs every forward pass first, so the first
  backward finds all ``microbatches`` micro-batches' saved activations; 1F1B
  runs ``pp - stage`` forward passes before its first backward (torch's
  ``Schedule1F1B``) and then one forward per backward, so a stage holds at most
  that many. The stage's receive buffers (one per micro-batch for what it
  receives, made at its first step and kept) are in it too;
- ``peak`` and ``peak_by_phase``: "forward" is the most held from the start of
  any forward pass to the next pass (the loss, on the last stage, included),
  "backward" the same from the start of any backward pass, "optimizer step"
  the update.

Measured for real in a launched worker (:func:`measure_stage_step`, gloo) and
planned on fake tensors (:func:`stage_probe`): the same stage module on the
meta device then given fake storage, the same ``PipelineStage`` and schedule,
in a fake process group of ``pp`` processes as process ``rank`` (every send and
receive returns at once, nothing is sent), under the same tracker
(``_step_tracker.StepTracker``), entered before a warm-up step (so that it sees
the receive buffers made then) and measuring the second step. A deep stage is
planned from copies holding 1, 2 and 3 of its blocks, extrapolated to its
share (``probes``), as one process's model is. Checked to the byte against
two gloo processes in ``tests/memory/test_planner_pipeline.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from course_utils.layouts import Layout, pipeline_schedule, pipeline_stage, stage_blocks
from course_utils.memory._step_tracker import StepTracker
from course_utils.memory.fake_tensors import an_unpadded_batch, fake_optimizer, quietly, refusing_what_needs_values
from course_utils.memory.plan_cache import PlannerRefused, cache, model_fingerprint
from course_utils.memory.probes import config_with_layers, repeated_layers
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import PHASES
from course_utils.memory.training_memory import TrainingMemory, training_batch
from course_utils.optimizers import make_optimizer
from course_utils.validation import check_instance, check_int_in_range

__all__ = [
    "causal_lm_loss", "check_stage_setup", "measure_stage_step", "micro_batch_shapes", "stage_block_count", "stage_probe",
    "stage_step",
]


def stage_block_count(model: torch.nn.Module, layout: Layout, rank: int) -> int:
    """Return how many of ``model``'s blocks process ``rank``'s stage of ``layout`` holds (``layouts.stage_blocks``)."""
    check_instance(layout, "layout", Layout, "a Layout")
    check_int_in_range(rank, "rank", 0, layout.pp - 1)
    count, layer_list = repeated_layers(model)
    if layer_list is None:
        raise PlannerRefused(f"model: the pipeline planner divides a stack of identical blocks between stages, and "
                             f"{type(model).__name__}'s blocks differ (or it has none)")
    return len(stage_blocks(count, layout.pp)[rank])


def causal_lm_loss(model: torch.nn.Module):
    """Return the loss the last stage computes from its logits and the labels: ``model``'s own (transformers' causal LM loss)."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    loss_function = getattr(model, "loss_function", None)
    if not callable(loss_function):
        raise TypeError(f"model must be a transformers causal LM (its loss_function), got {type(model).__name__}")
    return functools.partial(_loss, loss_function, model.config.vocab_size)


def _loss(loss_function, vocab_size, logits, labels):
    return loss_function(logits=logits, labels=labels, vocab_size=vocab_size)


# --------------------------------------------------------------------------- one stage's step


def stage_step(schedule, optimizer, batch: dict, layout: Layout, rank: int, tracker=None, warm_up: bool = False) -> dict:
    """Run one step of process ``rank``'s stage: ``schedule.step`` on ``batch``'s micro-batches, then ``optimizer``; with ``tracker``, return what it saw.

    ``schedule``: ``layouts.pipeline_schedule``'s; ``batch``: the whole batch
    (``input_ids`` and ``labels``, read by the first and the last stage). What
    it saw, in bytes: ``peak_by_phase``, ``activations`` (the most held when a
    backward pass begins), ``after_backward`` and ``after_step`` (the tracker's
    snapshots once the schedule has run and once the optimizer has).
    ``warm_up``: a step run under ``tracker`` that it does not report on.
    """
    first, last = rank == 0, rank == layout.pp - 1
    phases = _Phases(tracker, warm_up)
    piped = schedule._stage  # torch 2.13's schedules keep their stage there
    forward_one, backward_one = piped.forward_one_chunk, piped.backward_one_chunk

    def forward_chunk(*args, **kwargs):
        phases.begin("forward")
        return forward_one(*args, **kwargs)

    def backward_chunk(*args, **kwargs):
        phases.begin("backward")
        return backward_one(*args, **kwargs)

    piped.forward_one_chunk, piped.backward_one_chunk = forward_chunk, backward_chunk
    try:
        args = (batch["input_ids"],) if first else ()
        schedule.step(*args, target=batch["labels"] if last else None, return_outputs=False)
    finally:
        del piped.forward_one_chunk, piped.backward_one_chunk
    phases.begin("optimizer step")
    optimizer.step()
    optimizer.zero_grad()
    phases.begin(None)
    return phases.seen


class _Phases:
    """The peak of each phase of a stage's step, which the schedule interleaves (1F1B), and its activations when each backward begins."""

    def __init__(self, tracker, warm_up: bool = False) -> None:
        self.tracker, self.warm_up, self.current = tracker, warm_up, None
        self.seen = {"peak_by_phase": dict.fromkeys(PHASES, 0), "activations": 0}

    def begin(self, phase: str | None) -> None:
        """End the phase running (its peak kept), and begin ``phase`` (None: the step is over)."""
        tracker = self.tracker
        if tracker is None:
            return
        if phase == "forward":
            # MemTracker refuses a second call of the module it tracks before a backward; forgetting its
            # per-module statistics (not its totals) allows the micro-batches' forward passes.
            tracker.reset_mod_stats()
        if self.warm_up:
            return
        if self.current is not None:
            peaks = self.seen["peak_by_phase"]
            peaks[self.current] = max(peaks[self.current], tracker.total("peak"))
        now = tracker.snapshot("current")
        if phase == "backward":
            self.seen["activations"] = max(self.seen["activations"], now["Activation"])
        if self.current == "backward" and phase != "backward":
            self.seen["after_backward"] = now
        if phase is None:
            self.seen["after_step"] = now
        tracker.start_phase()
        self.current = phase


def _memory(seen: dict) -> TrainingMemory:
    peaks = seen["peak_by_phase"]
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    after_step = seen["after_step"]
    return TrainingMemory(
        weights=after_step["Parameter"] + after_step["Buffer"], gradients=seen["after_backward"]["Gradient"],
        optimizer_state=after_step["Optstate"], activations=seen["activations"], peak=peaks[phase_of_peak],
        phase_of_peak=phase_of_peak, peak_by_phase=peaks,
    )


def micro_batch_shapes(stage_module, layout: Layout, rank: int, setup: TrainingSetup, dtype):
    """Return meta tensors shaped as what process ``rank``'s stage receives and sends for one micro-batch."""
    config = stage_module.config
    rows = setup.batch_size // layout.microbatches
    # What a stage sends and receives between stages is part of the graph: autograd sends its gradient back.
    hidden = torch.empty(rows, setup.seq_len, config.hidden_size, dtype=dtype, device="meta", requires_grad=True)
    received = torch.empty(rows, setup.seq_len, dtype=torch.long, device="meta") if rank == 0 else hidden
    sent = torch.empty(rows, setup.seq_len, config.vocab_size, dtype=dtype, device="meta",
                       requires_grad=True) if rank == layout.pp - 1 else hidden
    return received, sent


def _tracked_steps(stage_module, schedule, optimizer, batch, layout, rank, warm_up_step: bool = True) -> TrainingMemory:
    """Return the second step of ``stage_module``, the tracker entered before the first (a warm-up step).

    ``warm_up_step`` False: the planner's shortcut, the first step followed
    as the second would be, at the cost of one step instead of two. The two
    differ only by the optimizer state, which the first optimizer step makes
    and which then keeps its size: so the passes are followed without it and
    its bytes added to their peaks, and the optimizer steps twice on the
    gradients they left, the first time making the state, the second time
    followed (:class:`_StateFirst`). The stage's receive buffers are made at
    the first step, before its first pass, either way. (Held equal to the byte
    to the two steps by ``tests/memory/test_planner_pipeline.py``.)
    """
    stage_module.train()
    tracker = StepTracker()
    tracker.track_external(stage_module, optimizer)
    stepping = optimizer if warm_up_step else _StateFirst(optimizer, tracker)
    with tracker:
        if warm_up_step:
            # The warm-up step makes the stage's receive buffers, kept from then on: the tracker sees them made.
            stage_step(schedule, optimizer, batch, layout, rank, tracker, warm_up=True)
        tracker.start_phase()
        seen = stage_step(schedule, stepping, batch, layout, rank, tracker)
    if not warm_up_step:
        for phase in PHASES[:2]:
            seen["peak_by_phase"][phase] += stepping.state
    return _memory(seen)


class _StateFirst:
    """The optimizer of :func:`_tracked_steps`' shortcut: its ``step()`` makes the state, then steps again, followed from there."""

    def __init__(self, optimizer, tracker) -> None:
        self.optimizer, self.tracker, self.state = optimizer, tracker, 0

    def step(self) -> None:
        self.optimizer.step()
        self.state = self.tracker.snapshot("current")["Optstate"]
        self.tracker.start_phase()
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


# --------------------------------------------------------------------------- measured for real


def measure_stage_step(model: torch.nn.Module, layout: Layout, setup: TrainingSetup, seed: int = 0) -> TrainingMemory:
    """In a launched worker of ``layout.pp`` gloo processes: return this process's stage's step, measured, in bytes.

    ``model``: the whole causal LM (the same in every process); this process
    keeps its stage (``layouts.pipeline_stage``), trains it with ``setup``'s
    optimizer on a batch of ``setup.batch_size`` sequences (the same in every
    process, drawn from ``seed``) cut into ``layout.microbatches``, and
    measures the second step as :func:`stage_step` reports it.
    """
    import torch.distributed as dist

    _check(model, layout, setup)
    if not dist.is_initialized() or dist.get_world_size() != layout.pp:
        raise RuntimeError(f"measure_stage_step runs in a launched worker of {layout.pp} processes in a gloo group "
                           f"(sharding.gloo_group())")
    rank = dist.get_rank()
    stage_module = pipeline_stage(model, layout, rank)
    dtype = next(model.parameters()).dtype
    schedule = pipeline_schedule(stage_module, layout, rank, causal_lm_loss(model),
                                 *micro_batch_shapes(stage_module, layout, rank, setup, dtype))
    optimizer = make_optimizer(setup.optimizer, [p for p in stage_module.parameters() if p.requires_grad],
                               **setup.optimizer_options)
    generator = torch.Generator().manual_seed(seed)
    batch = training_batch(model, setup.batch_size, setup.seq_len, generator)
    return _tracked_steps(stage_module, schedule, optimizer, batch, layout, rank)


# --------------------------------------------------------------------------- planned on fake tensors


def stage_probe(model: torch.nn.Module, setup: TrainingSetup, layout: Layout, rank: int,
                layers: int | None, fingerprint=None, warm_up_step: bool = False) -> tuple[TrainingMemory, list]:
    """Return process ``rank``'s stage's step under ``layout``, holding ``layers`` of its blocks (all its share if None), on fake tensors (cached).

    The second element is the stage's (forward peak, backward peak), for
    :func:`course_utils.memory.probes.extrapolate`: the phases' peaks, which
    a stage's blocks raise linearly (its activations held when a backward
    begins are the schedule's, whatever the depth). ``fingerprint``: the
    model's (``plan_cache.model_fingerprint``), if the caller has it.
    ``warm_up_step``: the slow way, a whole warm-up step then the measured one,
    as :func:`measure_stage_step` runs it (the tests hold the fast way equal to it).
    """
    _check(model, layout, setup)
    check_int_in_range(rank, "rank", 0, layout.pp - 1)
    if layers is not None:
        check_int_in_range(layers, "layers", 1, stage_block_count(model, layout, rank))
    fingerprint = model_fingerprint(model) if fingerprint is None else fingerprint
    key = ("pipeline stage", fingerprint.passes, setup, layout, rank, layers, warm_up_step)
    if key not in cache:
        cache[key] = quietly(_fake_stage_step, model, setup, layout, rank, layers, warm_up_step)
    planned = cache[key]
    return planned, [(planned.peak_by_phase["forward"], planned.peak_by_phase["backward"])]


def _fake_stage_step(model, setup, layout, rank, layers, warm_up_step) -> TrainingMemory:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from course_utils.memory.fake_tensors import fake_process_group
    from course_utils.memory.per_process import _meta_copy

    count = stage_block_count(model, layout, rank)
    layers = count if layers is None else layers
    with fake_process_group(layout.pp, rank):
        # A model with the stage's blocks only (the first ``layers``): the stage built from it as the real run builds
        # its own, as the first, a middle or the last stage.
        meta = _meta_copy(model, layers)
        stage_module = pipeline_stage(meta, layout, rank, blocks=range(layers))
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with refusing_what_needs_values():
            with mode:
                stage_module.to_empty(device="cpu")
            dtype = next(model.parameters()).dtype
            with _stage_votes_static(), _sends_held_as_gloo_holds_them():
                schedule = pipeline_schedule(stage_module, layout, rank, causal_lm_loss(meta),
                                             *micro_batch_shapes(stage_module, layout, rank, setup, dtype))
                optimizer = fake_optimizer(stage_module, setup, mode)
                with mode, an_unpadded_batch():
                    batch = training_batch(meta, setup.batch_size, setup.seq_len)
                    return _tracked_steps(stage_module, schedule, optimizer, batch, layout, rank, warm_up_step)


@contextlib.contextmanager
def _stage_votes_static():
    """Within this block, torch's schedules skip the stages' vote on how to learn their shapes, each stage taking "static".

    At its first step a schedule has the stages vote, over sends and receives,
    whether they all know the shapes they send and receive ("static") or must
    learn them by sending objects ("dynamic"). A stage built by
    ``layouts.pipeline_schedule`` is told its shapes and votes static, so the
    real vote's answer is static (``tests/memory/test_planner_pipeline.py``
    checks it on gloo); the fake process group's receives return nothing, so
    its vote would read zero, "dynamic".
    """
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._utils import InferenceMode

    vote = schedules.PipelineScheduleSingle._warmup_p2p

    def static(self, stages, has_backward, p2p_done):
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedules.PipelineScheduleSingle._warmup_p2p = static
    try:
        yield
    finally:
        schedules.PipelineScheduleSingle._warmup_p2p = vote


class _HeldWork:
    """A fake process group's finished send or receive, holding its tensor as long as a gloo one does (until the schedule drops it)."""

    def __init__(self, work, tensor) -> None:
        self.work, self.tensor = work, tensor

    def wait(self, *args, **kwargs):
        return self.work.wait(*args, **kwargs)


@contextlib.contextmanager
def _sends_held_as_gloo_holds_them():
    """Within this block, each send or receive a schedule starts holds its tensor until the schedule drops the work.

    A gloo send or receive (``ProcessGroupGloo``'s work) keeps the tensor it
    was given until the work itself is freed, and torch's schedules keep the
    works of a pass's sends in a list until later (GPipe: every forward send
    until the end of the forward passes, their list until the step returns).
    So a micro-batch's output, sent on, outlives its backward pass there; the
    fake group's works hold nothing, and it would be freed at once. Held as
    gloo holds it, the plan equals the gloo run to the byte
    (``tests/memory/test_planner_pipeline.py``; without it the first stage
    plans one micro-batch's output too little).
    """
    from torch.distributed.pipelining import schedules

    batch_p2p = schedules._batch_p2p

    def holding(p2p_ops, desc=None):
        return [_HeldWork(work, op.tensor) for work, op in zip(batch_p2p(p2p_ops, desc), p2p_ops, strict=True)]

    schedules._batch_p2p = holding
    try:
        yield
    finally:
        schedules._batch_p2p = batch_p2p


def _check(model, layout, setup) -> None:
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_stage_setup(layout, setup)


def check_stage_setup(layout: Layout, setup: TrainingSetup) -> None:
    """Refuse a pipeline layout and set-up the stage's step cannot run or the planner does not follow, naming the argument."""
    check_instance(layout, "layout", Layout, "a Layout")
    check_instance(setup, "setup", TrainingSetup, "a TrainingSetup")
    if layout.pp == 1:
        raise ValueError("layout must be pipeline-parallel (pp >= 2), got pp=1")
    if setup.batch_size % layout.microbatches:
        raise ValueError(f"batch_size must be divisible by microbatches: {setup.batch_size} sequences do not divide "
                         f"into {layout.microbatches} micro-batches")
    if setup.mixed_precision != "no" or setup.gradient_accumulation_steps != 1:
        raise PlannerRefused("the pipeline planner follows fp32 steps of one batch (mixed_precision='no', "
                             "gradient_accumulation_steps=1): the schedule's micro-batches are its accumulation")
