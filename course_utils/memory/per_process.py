"""The planner per process: what one process of a layout holds through its training step, on fake tensors (lesson 7).

The one place that decides what each process of a
:class:`course_utils.layouts.Layout` holds, for ``memory.planner``:
:func:`process_copy` follows one copy of the model (all its blocks, or the
probes' first few) as process ``rank`` holds it, :func:`whole_process` adds
what the copies leave out (ZeRO-1's optimizer, DDP's buckets), and
:func:`records_timelines` says whose passes the probes can deepen moment by
moment. A new layout is a new branch in these three.

- "none" and "ddp": one process's step (``fake_step``), every process the
  same; DDP adds its gradient buckets (:func:`with_ddp_buckets`).
- "zero2" and "zero3" (FSDP2: ``reshard_after_forward`` False and True)
  follow the public recipe of torchtitan's ``scripts/estimate/estimation.py``:
  a *fake* process group (``torch.testing._internal.distributed.fake_pg``:
  every collective returns at once, nothing is sent) of ``world_size``
  processes in this one process, as process ``rank``; the model copied to the
  meta device and laid out there by :func:`course_utils.layouts.apply_layout`,
  the function the lessons' launched runs call (:func:`sharded_fake_copy`);
  then its storage made fake (``to_empty`` inside ``FakeTensorMode``) and the
  step of ``training_memory.measure_training_step_peak`` run on it (a warm-up
  step, then the measured step) under torch's ``FSDPMemTracker``
  (:func:`fsdp_tracker`; the warm-up step's passes skipped: see :func:`fsdp_step`).
- tensor parallelism (``tp`` > 1, lesson 9): the same fake process group and
  laid-out copy, the one-process step's measurement followed on it
  (``tensor_parallel_step``).
- context parallelism (``cp > 1``): one process's step on its part of each
  sequence, the copy laid out in a fake process group (``context_parallel``).
- "zero1" (torch's ``ZeroRedundancyOptimizer`` over a model wrapped in DDP):
  every process runs one process's forward and backward passes, on the whole
  model, with DDP's gradient buckets; only the optimizer differs: each process
  holds the state, and runs the update, of the parameter tensors torch assigns
  it (largest first, each to the process with the fewest elements so far),
  then broadcasts them in place. So the passes are the one-process planner's
  (probed and extrapolated, cached with its own), with no optimizer state
  (:func:`passes_without_state`), and the optimizer phase is followed once, on
  fake twins of the whole model's parameters: a real ``ZeroRedundancyOptimizer``
  (``layouts.layout_optimizer``) built on them in a fake process group, as
  process ``rank`` (:func:`zero1_optimizer_phase`); :func:`with_zero1_optimizer`
  adds the two up.
- ``pp`` > 1 (lesson 9): process ``rank`` runs pipeline stage ``rank``;
  its step, planned in ``memory.pipeline_stages`` (:func:`blocks_followed`
  gives the probes the stage's share of the blocks), leaves nothing out.

Checked on torch 2.13 against real gloo runs of the same step (``tests/memory/test_planner_sharding.py``,
``tests/memory/test_planner_pipeline.py``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools

import torch
from torch.distributed._tools.mem_tracker import get_untyped_storages
from torch.utils.weak import WeakIdKeyDictionary

from course_utils.layouts import Layout, apply_layout, block_lists, layout_optimizer
from course_utils.memory._step_tracker import ViewsNotCounted
from course_utils.memory.context_parallel import context_process
from course_utils.memory.fake_step import OptimizerPhase, compose, follow_optimizer_step, passes, planned_probe
from course_utils.memory.fake_tensors import (
    BNB_OPTIMIZERS, an_unpadded_batch, fake_optimizer, fake_process_group, fake_twin, quietly,
    refusing_what_needs_values,
)
from course_utils.memory.pipeline_stages import check_stage_setup, stage_block_count, stage_probe
from course_utils.memory.plan_cache import Fingerprint, PlannerRefused, cache
from course_utils.memory.probes import PROBE_LAYERS, config_with_layers, repeated_layers
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import PHASES, default_loss, training_step
from course_utils.memory.tensor_parallel_step import refuse_what_is_not_split, tensor_parallel_probe
from course_utils.memory.training_memory import TrainingMemory, _measure_step, training_batch
from course_utils.optimizers import SUPPORTED_OPTIMIZERS, make_optimizer
from course_utils.validation import check_choice, check_instance, check_int_in_range, check_positive_int


# --------------------------------------------------------------------------- what each process holds


def process_copy(model: torch.nn.Module, setup: TrainingSetup, layout: Layout, rank: int, layers: int | None,
                 fingerprint: Fingerprint) -> tuple[TrainingMemory, list]:
    """Return process ``rank``'s step under ``layout`` on the first ``layers`` blocks of ``model`` (all if None), cached.

    The second element is each micro-batch's (forward peak, backward peak), for
    :func:`course_utils.memory.probes.extrapolate`. Under ZeRO-1 the optimizer
    is left out (:func:`whole_process` adds it, once, to the whole model's
    extrapolated passes); under DDP its buckets are.
    """
    if layout.pp > 1:
        deeper = layers is not None and _middle_stage(layout, rank)  # see blocks_followed
        return stage_probe(model, setup, layout, rank, layers + 1 if deeper else layers, fingerprint)
    if layout.tp > 1:
        refuse_what_is_not_split(model, layout)
    if layout.cp > 1:
        return planned_probe(model, setup, layers, fingerprint,
                             context_process(model, layout, rank, setup.mixed_precision))
    if layout.shards_with_fsdp:
        # With tensor parallelism too (a 2-D mesh): FSDP2 over the "dp" dimension of the split model, after a
        # whole warm-up step (fsdp_step's shortcut, exact on one dimension, planned 2,304 bytes more than the
        # real 2 x 2 run's backward peak on tests/memory/test_planner_tensor_parallel.py's Llama).
        _check_model(model)
        return quietly(_fsdp_probe, model, setup, layers, layout, rank, layout.tp > 1)
    if layout.tp > 1:
        return tensor_parallel_probe(model, setup, layers, layout, rank, fingerprint)
    if layout.strategy == "zero1":
        return passes_without_state(model, setup, layers, fingerprint)
    return planned_probe(model, setup, layers, fingerprint)


def whole_process(planned: TrainingMemory, model: torch.nn.Module, setup: TrainingSetup, layout: Layout, rank: int,
                  fingerprint: Fingerprint) -> TrainingMemory:
    """Return process ``rank``'s step from ``planned`` (the whole model's :func:`process_copy`, extrapolated), in bytes.

    With what the copies leave out: ZeRO-1's optimizer (:func:`with_zero1_optimizer`)
    and DDP's buckets (:func:`with_ddp_buckets`, under DDP and ZeRO-1).
    A pipeline stage's copies, and those under tensor or context parallelism,
    followed the whole layout: nothing is left out (``context_parallel``).
    """
    if layout.pp > 1 or layout.tp > 1:
        return planned
    if layout.strategy == "zero1":
        planned = with_zero1_optimizer(planned, model, setup, layout.world_size, rank, fingerprint)
    if layout.wraps_in_ddp:
        planned = with_ddp_buckets(planned, model, setup.gradient_accumulation_steps)
    return planned


def records_timelines(layout: Layout) -> bool:
    """Return whether the copies :func:`process_copy` follows under ``layout`` record their passes' timelines (one process's passes do)."""
    return layout.tp == 1 and layout.pp == 1 and layout.cp == 1 and not layout.shards_with_fsdp and layout.strategy != "zero1"


def blocks_followed(model: torch.nn.Module, layout: Layout, rank: int) -> tuple[int | None, torch.nn.ModuleList | None]:
    """Return how many identical blocks process ``rank`` holds under ``layout``, and the model's list of them (None if they differ).

    The model's blocks (``probes.repeated_layers``), or under pipeline
    parallelism its stage's share (``layouts.stage_blocks``): what the
    planner's probes extrapolate to. A stage between the first and the last
    counts one block fewer, its first block held in every copy of it
    (:func:`process_copy` follows ``k + 1`` blocks for the probes' ``k``):
    its copy with one block peaks in the forward pass one micro-batch of
    hidden states above the line its deeper copies draw (measured on a tiny
    Llama and on a 70B-shaped one), so its probes would otherwise never line
    up and the planner would follow the whole stage.
    """
    count, layer_list = repeated_layers(model)
    if layout.pp > 1:
        return stage_block_count(model, layout, rank) - _middle_stage(layout, rank), layer_list
    return count, layer_list


def _middle_stage(layout: Layout, rank: int) -> bool:
    return 0 < rank < layout.pp - 1


def checked_layout(layout: Layout, setup: TrainingSetup, world_size: int, sharding: str, rank: int) -> Layout:
    """Return ``layout``, given to the planner instead of ``world_size`` and ``sharding``, once the planner follows it for process ``rank``.

    Refused (:class:`PlannerRefused`): a layout that combines splits the
    planner does not yet follow together (tensor with pipeline parallelism,
    either with context parallelism, a pipeline with data parallelism).
    """
    check_instance(layout, "layout", Layout, "a course_utils.layouts.Layout")
    if world_size != 1 or sharding != "none":
        raise ValueError(f"layout replaces world_size and sharding: pass either layout= or world_size=/sharding=, "
                         f"not both (got layout={layout}, world_size={world_size}, sharding={sharding!r})")
    check_int_in_range(rank, "rank", 0, layout.world_size - 1)
    if len(layout.splits) > 1:
        raise PlannerRefused(f"layout: {' with '.join(f'{name}={degree}' for name, degree in layout.splits.items())} "
                             f"together are not planned yet; plan each split alone (with data parallelism where it "
                             f"is planned)")
    if layout.pp > 1:
        if layout.dp > 1:
            raise PlannerRefused(f"layout: pipeline stages with data parallelism over them (dp={layout.dp}) are not "
                                 f"planned; plan one pipeline (world_size = pp)")
        check_stage_setup(layout, setup)
    return layout


def with_ddp_buckets(single: TrainingMemory, model: torch.nn.Module,
                     gradient_accumulation_steps: int) -> TrainingMemory:
    """Return ``single`` (one process's plan) with DDP's gradient buckets added to every moment of the step, in bytes.

    DDP (``gradient_as_bucket_view=False``, its default) holds flat buckets as
    large as all the trainable parameters' gradients together, for the whole
    training: the same bytes at every moment of every phase. It allocates them
    again once, in the forward pass of its second iteration (rebuilt in the
    order the gradients became ready); with one micro-batch per step that is the
    measured step's first forward pass, and the tracker files them with what is
    alive after it (``activations``). Nothing else in the step differs from one
    process's (checked against launched runs in ``tests/memory/test_planner_sharding.py``).
    """
    buckets = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    in_activations = buckets if gradient_accumulation_steps == 1 else 0
    return dataclasses.replace(
        single, activations=single.activations + in_activations, peak=single.peak + buckets,
        peak_by_phase={phase: peak + buckets for phase, peak in single.peak_by_phase.items()},
    )


# --------------------------------------------------------------------------- ZeRO-2 and ZeRO-3: FSDP2


def fsdp_probe(model: torch.nn.Module, step: TrainingSetup, layers: int | None, world_size: int,
               strategy: str, rank: int = 0, warm_up_step: bool = False) -> tuple[TrainingMemory, list]:
    """Return process ``rank``'s step under ``strategy`` ("zero2"/"zero3") on ``world_size`` processes, on the first ``layers`` blocks.

    The second element is each micro-batch's (forward peak, backward peak), for
    :func:`course_utils.memory.probes.extrapolate`. ``warm_up_step``: the slow
    way, a whole warm-up step then the measured one (the tests hold the fast
    way, :func:`fsdp_step`'s ``state_comes_later``, equal to it).
    """
    _check_model(model)
    check_instance(step, "step", TrainingSetup, "a TrainingSetup")
    check_positive_int(world_size, "world_size")
    check_choice(strategy, "strategy", ("zero2", "zero3"))
    return quietly(_fsdp_probe, model, step, layers, Layout(strategy, world_size), rank, warm_up_step)


@contextlib.contextmanager
def sharded_fake_copy(model: torch.nn.Module, layout: Layout, rank: int = 0, layers: int | None = None):
    """Within this block, yield (copy, mode): process ``rank``'s copy of ``model`` laid out as ``layout``, its storage fake tensors of ``mode``.

    In a fake process group of ``layout.world_size`` (:func:`fake_process_group`):
    the model copied to the meta device (the first ``layers`` blocks only, all
    if None), laid out by :func:`course_utils.layouts.apply_layout` as the
    lessons' launched runs lay out the real model, then given fake storage
    (``to_empty`` inside ``mode``, a ``FakeTensorMode``). What the block runs
    on it that needs real values is refused (``fake_tensors.refusing_what_needs_values``).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    _check_model(model)
    check_instance(layout, "layout", Layout, "a Layout")
    with fake_process_group(layout.world_size, rank):
        meta = _meta_copy(model, layers)
        apply_layout(meta, layout, _blocks(meta))
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with refusing_what_needs_values():
            with mode:
                meta.to_empty(device="cpu")
            yield meta, mode


def _fsdp_probe(model, step, layers, layout, rank, warm_up_step):
    with sharded_fake_copy(model, layout, rank, layers) as (meta, mode):
        optimizer = fake_optimizer(meta, step, mode)
        with mode, an_unpadded_batch():
            batch = training_batch(meta, step.batch_size, step.seq_len)
            meta.train()
            if warm_up_step:
                fsdp_step(meta, optimizer, batch, step, None)
            else:
                # What FSDP does before its first forward pass (torch 2.13's FSDPState._lazy_init): a
                # shard padded to a multiple of the processes gets new storage there, which the tracker
                # would file as activations. A warm-up step does it before the tracker starts.
                meta._get_fsdp_state()._lazy_init()
            tracker = fsdp_tracker(meta, optimizer)
            with tracker:
                seen = fsdp_step(meta, optimizer, batch, step, tracker, state_comes_later=not warm_up_step)
    return fsdp_memory(seen), seen["micro_batch_peaks"]


def fsdp_tracker(model, optimizer):
    """Return torch's FSDPMemTracker of ``model`` and ``optimizer`` as the course's step uses it: true to the allocator, its own peak only.

    As ``_step_tracker.StepTracker`` does for MemTracker: a view of a storage
    made before the step (the batch's labels: :func:`fsdp_step` tells the tracker
    of the batch) is not counted (``_step_tracker.ViewsNotCounted``), and only the tracker's own peak is
    kept, not each module's (torch's tracker walks every module it tracks after
    every operation to update their own peaks, which nothing here reads).
    """
    _check_model(model)
    return _fsdp_tracker_class()(model, optimizer)


@functools.cache
def _fsdp_tracker_class() -> type:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class CourseFSDPMemTracker(ViewsNotCounted, FSDPMemTracker):
        # FSDP allocates storage outside any torch operation (it resizes the storage of the
        # gathered parameters), so a storage this tracker does not know may be the step's:
        # it is told which ones were made before the step (the batch's, by fsdp_step).
        def made_before_step(self, tensors) -> None:
            self._before_step = WeakIdKeyDictionary(
                {storage: True for tensor in tensors for storage in get_untyped_storages(tensor)})

        def _made_before_step(self, storage) -> bool:
            return storage in getattr(self, "_before_step", {})

        def _update_peak_stats(self, peak_state) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

    return CourseFSDPMemTracker


def measure_fsdp_step(model, optimizer, batch, step: TrainingSetup) -> TrainingMemory:
    """Return the step of :func:`fsdp_probe`, measured for real on a model sharded in a launched process."""
    _check_model(model)
    check_instance(step, "step", TrainingSetup, "a TrainingSetup")
    model.train()
    fsdp_step(model, optimizer, batch, step, None)
    tracker = fsdp_tracker(model, optimizer)
    with tracker:
        seen = fsdp_step(model, optimizer, batch, step, tracker)
    return fsdp_memory(seen)


# --------------------------------------------------------------------------- ZeRO-1


def zero1_optimizer(parameters, optimizer: str, **options: object) -> torch.optim.Optimizer:
    """Return torch's ``ZeroRedundancyOptimizer`` over ``parameters``, each process's own optimizer ``make_optimizer(optimizer, ..., **options)``.

    ZeRO-1's optimizer as ``course_utils.layouts.layout_optimizer`` builds it
    (torch's defaults: whole tensors assigned to processes, updated parameters
    broadcast one tensor at a time), as lesson 7's runs use it. Call it in a
    process group (a launched worker, or the planner's fake group).
    """
    import torch.distributed as dist

    parameters = list(parameters)
    if not parameters:
        raise ValueError("parameters must hold at least one parameter, got none")
    check_choice(optimizer, "optimizer", SUPPORTED_OPTIMIZERS)
    return layout_optimizer(Layout("zero1", dist.get_world_size()), parameters,
                            functools.partial(make_optimizer, optimizer), **options)


def passes_without_state(model: torch.nn.Module, step: TrainingSetup, layers: int | None,
                         fingerprint: Fingerprint | None = None) -> tuple[TrainingMemory, list]:
    """Return the one-process planner's step on the first ``layers`` blocks with no optimizer state and a step that allocates nothing.

    What :func:`with_zero1_optimizer` adds a ZeRO-1 process's optimizer to;
    its forward and backward passes are the one-process planner's, from the
    same cache. The second element is each micro-batch's (forward, backward)
    peak, for :func:`course_utils.memory.probes.extrapolate`.
    """
    ran = passes(model, step, layers, fingerprint)
    nothing = OptimizerPhase(state_before=0, state_after=0, weights=ran.weights, rise=0)
    return compose(ran, nothing, step.gradient_accumulation_steps)


def with_zero1_optimizer(without_state: TrainingMemory, model: torch.nn.Module, step: TrainingSetup, world_size: int,
                         rank: int, fingerprint: Fingerprint) -> TrainingMemory:
    """Return ``without_state`` (the whole model's :func:`passes_without_state`) with process ``rank``'s ZeRO-1 optimizer, in bytes.

    As :func:`course_utils.memory.fake_step.compose` adds an optimizer: its
    state is there during the passes, and the step rises from what the
    backward pass left (``without_state``'s optimizer-step peak) by what it
    allocates. DDP's buckets are not in it (:func:`with_ddp_buckets`).
    """
    gets_gradient = _gets_gradient(model, step, fingerprint)
    phase = zero1_optimizer_phase(model, step, world_size, rank, gets_gradient, fingerprint)
    state, peaks = phase.state_before, without_state.peak_by_phase
    peaks = {"forward": peaks["forward"] + state, "backward": peaks["backward"] + state,
             "optimizer step": peaks["optimizer step"] + state + phase.rise}
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    return dataclasses.replace(without_state, optimizer_state=phase.state_after, peak=peaks[phase_of_peak],
                               phase_of_peak=phase_of_peak, peak_by_phase=peaks)


def zero1_optimizer_phase(model: torch.nn.Module, step: TrainingSetup, world_size: int, rank: int,
                          gets_gradient: tuple[bool, ...], fingerprint: Fingerprint) -> OptimizerPhase:
    """Return process ``rank``'s ZeRO-1 optimizer step, on fake twins of ``model``'s parameters (cached).

    ``gets_gradient``: per parameter of ``model.parameters()``, whether the
    backward pass gives it a gradient. The step is a warm-up step, then the
    measured ``optimizer.step()`` (the local update, then the broadcasts, which
    the fake group answers at once: they write into the parameters in place)
    and ``zero_grad()``. ``weights`` counts the parameters only (no buffers).
    """
    key = ("zero1 optimizer step", fingerprint.parameters, step.optimizer, step.options, gets_gradient, world_size,
           rank)
    if key not in cache:
        cache[key] = quietly(_run_zero1_optimizer_phase, model, step, world_size, rank, gets_gradient)
    return cache[key]


def _run_zero1_optimizer_phase(model, step, world_size, rank, gets_gradient) -> OptimizerPhase:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        parameters = [fake_twin(parameter) for parameter in model.parameters()]
    held = torch.nn.ParameterList(parameters)  # a module, for the tracker to file them as parameters
    with fake_process_group(world_size, rank), refusing_what_needs_values():
        optimizer = _fake_zero1_optimizer([p for p in parameters if p.requires_grad], step, mode)
        # The state is the local optimizer's.
        return follow_optimizer_step(held, gets_gradient, optimizer, mode, state_held_by=optimizer.optim)


def _fake_zero1_optimizer(parameters, step: TrainingSetup, mode):
    """Return :func:`zero1_optimizer` over the fake ``parameters``, its tensors fake (as ``fake_tensors.fake_optimizer``)."""
    if step.optimizer not in BNB_OPTIMIZERS:
        with mode:
            return zero1_optimizer(parameters, step.optimizer, **step.optimizer_options)
    # bitsandbytes computes its quantisation tables from values when it is built (see fake_tensors.fake_optimizer).
    optimizer = zero1_optimizer(parameters, step.optimizer, **step.optimizer_options)
    with mode:
        optimizer.optim.name2qmap = {key: fake_twin(table) for key, table in optimizer.optim.name2qmap.items()}
    return optimizer


def _gets_gradient(model: torch.nn.Module, step: TrainingSetup, fingerprint: Fingerprint) -> tuple[bool, ...]:
    """Return, per parameter of ``model.parameters()``, whether the backward pass gives it a gradient.

    From the passes the planner followed (cached): the whole model's, or for a
    stack of identical blocks the deepest probe's, each block beyond it taken
    as that probe's last block.
    """
    count, layer_list = repeated_layers(model)
    if layer_list is None or count <= sum(PROBE_LAYERS):
        return passes(model, step, None, fingerprint).gets_gradient
    layers = max(PROBE_LAYERS)
    block_of = {id(p): (index, name) for index, block in enumerate(layer_list) for name, p in block.named_parameters()}
    everything = list(model.parameters())
    # The probe's parameters are the model's in the same order, less those of the blocks it leaves out.
    kept = [p for p in everything if block_of.get(id(p), (0, ""))[0] < layers]
    probed = passes(model, step, layers, fingerprint).gets_gradient
    if len(probed) != len(kept):  # not the copy this expects: follow the whole model's passes
        return passes(model, step, None, fingerprint).gets_gradient
    flags = dict(zip((block_of.get(id(p), id(p)) for p in kept), probed))
    return tuple(flags[(min(block_of[id(p)][0], layers - 1), block_of[id(p)][1]) if id(p) in block_of else id(p)]
                 for p in everything)


def measure_zero1_step(model, optimizer, batch, step: TrainingSetup) -> TrainingMemory:
    """Return the step :func:`with_zero1_optimizer` plans, measured for real in a launched process (bytes).

    ``model`` wrapped in DDP, ``optimizer`` a :func:`zero1_optimizer`: the step
    of ``training_memory.measure_training_step_peak`` (a warm-up step, then the
    measured one under MemTracker), the tracker told of the *local* optimizer,
    which holds this process's state (told of the ``ZeroRedundancyOptimizer``,
    MemTracker would find no state in it until the step, and miss the state
    in the forward and backward peaks). DDP's buckets are in it.
    """
    _check_model(model)
    check_instance(step, "step", TrainingSetup, "a TrainingSetup")
    return _measure_step(model, optimizer, batch, default_loss, step.mixed_precision, step.gradient_accumulation_steps,
                         state_held_by=optimizer.optim)


def fsdp_memory(seen: dict) -> TrainingMemory:
    """Return the TrainingMemory of what :func:`fsdp_step` saw under FSDPMemTracker."""
    check_instance(seen, "seen", dict, "the dict fsdp_step returns")
    peaks = seen["peak_by_phase"]
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    after_step, after_backward = seen["after_step"], seen["after_backward"]
    return TrainingMemory(
        weights=after_step["Sharded Param"] + after_step["Unsharded Param"] + after_step["Buffer"],
        gradients=after_backward["Sharded Grad"] + after_backward["Unsharded Grad"],
        optimizer_state=after_step["OptState"], activations=seen["after_forward"]["Activation"],
        peak=peaks[phase_of_peak], phase_of_peak=phase_of_peak, peak_by_phase=peaks,
    )


def fsdp_step(model, optimizer, batch, step, tracker, state_comes_later: bool = False) -> dict:
    """Run :func:`course_utils.memory.step.training_step` on the step's micro-batches; with ``tracker`` (a :func:`fsdp_tracker`), return what it saw.

    ``state_comes_later``: the model's first step, returning what its second
    step (the measured one, after a warm-up step) would see, for the planner's
    probes, at the cost of one forward and backward pass instead of two. The
    second step differs from the first only by the optimizer state, which the
    first optimizer step creates and which then keeps its size: so the passes
    are followed without it, and its bytes are added to each of their peaks;
    then the optimizer steps twice on the gradients they left, the first time
    creating the state, the second time followed (:class:`_StateFirst`). (Held
    equal to the byte to a warm-up step then a measured one by
    ``tests/memory/test_planner_sharding.py``.)
    """
    _check_model(model)
    followed = _FollowedFSDP(tracker) if tracker is not None else None
    if followed is not None:
        tracker.made_before_step(batch.values())
        followed.start_phase()
    stepping = _StateFirst(optimizer, followed) if state_comes_later else optimizer
    seen = training_step(model, stepping, batch, default_loss, step.mixed_precision, step.gradient_accumulation_steps,
                         followed)
    if state_comes_later:
        state = stepping.state
        for phase in PHASES[:2]:
            seen["peak_by_phase"][phase] += state
        seen["micro_batch_peaks"] = [(forward + state, backward + state)
                                     for forward, backward in seen["micro_batch_peaks"]]
    return seen


class _FollowedFSDP:
    """Torch's FSDPMemTracker with what ``step.training_step`` asks of a tracker (``_step_tracker.StepTracker``'s methods)."""

    def __init__(self, tracker) -> None:
        self.tracker = tracker

    def snapshot(self, kind: str) -> dict[str, int]:
        """Return the tracker's ``kind`` snapshot of the CPU as {category name: bytes}."""
        return fsdp_snapshot(self.tracker, kind)

    def total(self, kind: str) -> int:
        """Return the tracker's ``kind`` total on the CPU, in bytes."""
        return self.snapshot(kind)["Total"]

    def start_phase(self) -> None:
        """Forget the tracker's peak so far."""
        _start_phase(self.tracker)

    def reset_mod_stats(self) -> None:
        """Forget the tracker's per-module statistics (a second forward pass of the root is then allowed)."""
        self.tracker.reset_mod_stats()


class _StateFirst:
    """The optimizer of :func:`fsdp_step`'s shortcut: each ``step()`` creates the state, then steps again, followed from there."""

    def __init__(self, optimizer, followed: _FollowedFSDP) -> None:
        self.optimizer, self.followed = optimizer, followed
        self.state = 0
        """The optimizer state's bytes once created."""

    def step(self) -> None:
        self.optimizer.step()
        self.state = self.followed.snapshot("current")["OptState"]
        self.followed.start_phase()
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


_CATEGORIES = ("Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad", "Activation", "Temp",
               "All Gather", "Reduce Scatter", "OptState", "Inputs", "Total")


def fsdp_snapshot(tracker, kind: str) -> dict[str, int]:
    """Return FSDPMemTracker's ``kind`` snapshot of the CPU as {category name: bytes}."""
    check_choice(kind, "kind", ("current", "peak"))
    snapshot = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    by_name = {str(getattr(key, "value", key)): int(value) for key, value in snapshot.items()}
    return {name: by_name.get(name, 0) for name in _CATEGORIES}


def _start_phase(tracker) -> None:
    """Forget the tracker's peak so far (as ``_step_tracker.StepTracker.start_phase``, on torch 2.13's internals)."""
    current = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {device: snapshot["Total"] for device, snapshot in current.items()}
    tracker._peak_mem_snap = current


def _blocks(model) -> list:
    """Return the blocks FSDP shards one at a time: the stack of identical blocks, else the one ModuleList of blocks that differ, or refuse."""
    _, layer_list = repeated_layers(model)
    if layer_list is not None:
        return list(layer_list)
    lists = block_lists(model)
    if len(lists) != 1:
        raise PlannerRefused(
            f"model: the per-process planner shards each block, and {type(model).__name__} has "
            f"{len(lists)} lists of modules instead of one list of blocks"
        )
    return list(lists[0])


def _meta_copy(model: torch.nn.Module, layers: int | None) -> torch.nn.Module:
    """Return a copy of ``model`` on the meta device, keeping only the first ``layers`` blocks (all if None)."""
    memo: dict[int, object] = {}
    if layers is not None:
        count, layer_list = repeated_layers(model)
        memo[id(model.config)] = config_with_layers(model.config, layers, count)
        kept = torch.nn.ModuleList(list(layer_list)[:layers])
        memo[id(layer_list)] = _meta_twin_module(kept, memo)
    return _meta_twin_module(model, memo)


def _meta_twin_module(module: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """Return ``copy.deepcopy(module)`` with every parameter and buffer replaced by a meta tensor (ties kept)."""
    for sub in module.modules():
        for name, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
                if isinstance(tensor, torch.nn.Parameter):
                    twin = torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = twin
    return copy.deepcopy(module, memo)


def _check_model(model) -> None:
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
