"""The fake passes (used by ``course_utils.memory.planner``): one training step followed on fake tensors, fast.

:func:`full_fake_step` is the definition: the step that
``training_memory.measure_training_step_peak`` measures (``step.training_step``:
a warm-up step, then the measured step under MemTracker), run on a fake copy of
the model (``fake_tensors.fake_copy``). It is exact and slow. The planner instead composes the same numbers
from two smaller fake runs, each kept in the planner's one cache
(``plan_cache.cache``) under the model's ``Fingerprint`` (taken once per estimate) and the
:class:`~course_utils.memory.setup.TrainingSetup`'s choices it depends on, so
that changing one choice re-runs only what that choice changes:

- :func:`passes`: the forward and backward passes of the measured step's
  micro-batches (``step.training_step`` with no optimizer). Its numbers depend on the model, batch,
  length, precision and accumulation; not on the optimizer.
- :func:`optimizer_phase`: the optimizer's warm-up step, then the measured
  ``optimizer.step()`` and ``zero_grad()`` under MemTracker, on zero
  gradients given to exactly the parameters the backward pass reaches. Its
  numbers depend on the parameters and the optimizer; not on the batch.
- :func:`compose`: during forward and backward the optimizer's state is
  there and unchanged (added to every byte count of those phases); the
  optimizer step starts from what the backward pass left and rises by what
  the step allocates on top. So forward peak = passes' forward peak + state,
  backward likewise, step peak = memory after backward + state + the step's
  rise.

Shortcuts inside :func:`passes`: accumulated micro-batches stop once one (from
the second on) leaves memory exactly as it found it (the next would start
from that same memory and repeat it), and a run that stopped that way serves
any larger number of micro-batches. (A stack of identical blocks is run with
1, 2 and 3 blocks and extrapolated: ``probes``.) Value reads (``.item()``) are answered only inside the optimizer
step (``fake_tensors.ScalarsInOptimizerStep``); in the passes, the two questions
transformers' mask builder reads values for (is there padding? are sequences
packed?) get the answer the course's unpadded batch gives
(``fake_tensors.an_unpadded_batch``), and any other value read is refused.

Checked on torch 2.13.0 (FakeTensorMode, MemTracker through
``course_utils.memory._step_tracker``), transformers 5.24, accelerate 1.15,
bitsandbytes 0.50 and peft 0.21. After upgrading any of them, rerun
``pytest tests/memory/test_planner.py tests/memory/test_training_memory.py
tests/memory/test_planner_families.py`` (test_planner holds every composition
and shortcut here equal, to the byte, to :func:`full_fake_step`, and the
planner to real measured steps; test_planner_families each family of model,
QLoRA included), part 3 of ``benchmarks/bench_memory.py`` and
``benchmarks/planner_sweep.py`` (120 set-ups over more than 30 architectures
and heads). Where torch's fake kernels differ from its CPU kernels (fp32
grouped matrix products of mixture-of-experts layers, the fp32 statistics of
a norm fed bf16 with fp32 weights), the passes run under
``course_utils.memory.fake_kernels.CpuKernels``, which answers as the CPU does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from course_utils.memory._step_tracker import StepTracker, cpu_snapshot, recording_timeline
from course_utils.memory.deepening import segments
from course_utils.memory.fake_kernels import cpu_kernels_for
from course_utils.memory.fake_tensors import (
    ScalarsInOptimizerStep, an_unpadded_batch, fake_copy, fake_optimizer, modules_cast_in_forward, quietly,
    refusing_what_needs_values,
)
from course_utils.memory.plan_cache import Fingerprint, PlannerRefused, cache, model_fingerprint
from course_utils.memory.qlora import track_quant_states
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import PHASES, default_loss, training_step
from course_utils.memory.training_memory import TrainingMemory, _measure_step, training_batch


@dataclass(frozen=True)
class Passes:
    """The forward and backward passes of one step's micro-batches, without optimizer state (bytes)."""

    weights: int  # parameters and buffers
    gradients: int  # after the last backward pass
    activations: int  # after the last forward pass
    after_backward: int  # everything held after the last backward pass
    micro_batch_peaks: tuple[tuple[int, int], ...]  # (forward, backward) of each micro-batch run
    gets_gradient: tuple[bool, ...]  # per parameter of model.parameters()
    repeated: bool  # the last micro-batch run (from the second on) left memory as it found it
    # The passes' bytes after each operation, all parts together, by micro-batch and pass:
    # ((label, operations, totals), ...), see ``deepening.segments``. The probes extrapolate each moment.
    timeline: tuple = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class OptimizerPhase:
    """The optimizer step of a training step, on top of whatever else is held (bytes)."""

    state_before: int  # optimizer state held during forward and backward
    state_after: int
    weights: int
    rise: int  # peak of optimizer.step() and zero_grad() over the memory they start from


def compose(passes: Passes, optimizer: OptimizerPhase, steps: int) -> tuple[TrainingMemory, list]:
    """Return the step's memory and each micro-batch's (forward, backward) peak, from its two parts (bytes)."""
    state = optimizer.state_before
    ran = [(forward + state, backward + state) for forward, backward in passes.micro_batch_peaks]
    micro_batch_peaks = ran + ran[-1:] * (steps - len(ran))  # those not run repeat the last one
    peaks = {
        "forward": max(forward for forward, _ in ran),
        "backward": max(backward for _, backward in ran),
        "optimizer step": passes.after_backward + state + optimizer.rise,
    }
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    memory = TrainingMemory(
        weights=optimizer.weights, gradients=passes.gradients, optimizer_state=optimizer.state_after,
        activations=passes.activations, peak=peaks[phase_of_peak], phase_of_peak=phase_of_peak,
        peak_by_phase=peaks,
    )
    return memory, micro_batch_peaks


def planned_probe(model: torch.nn.Module, step: TrainingSetup, layers: int | None,
                  fingerprint: Fingerprint | None = None, process=None) -> tuple[TrainingMemory, list]:
    """Return the memory of ``step`` on the first ``layers`` blocks of ``model`` (all if None), composed, cached.

    ``fingerprint`` is :func:`fingerprint` of ``model``, taken once by the caller (taken here if None);
    ``process``: see :func:`passes`.
    """
    fingerprint = fingerprint or model_fingerprint(model)
    ran = passes(model, step, layers, fingerprint, process)
    phase = optimizer_phase(model, step, layers, ran.gets_gradient, fingerprint, process)
    return compose(ran, phase, step.gradient_accumulation_steps)


def passes(model: torch.nn.Module, step: TrainingSetup, layers: int | None,
           fingerprint: Fingerprint | None = None, process=None) -> Passes:
    """Return the forward and backward passes of ``step`` on a fake copy of ``model`` (cached).

    ``process``: None (one process), or one process of a layout whose every
    process holds the whole model (``context_parallel.ContextProcess``,
    hashable): the passes then run within its ``laid_out(copy)`` (its process
    group, the copy laid out) on its ``batch_of(batch)``.
    """
    steps = step.gradient_accumulation_steps
    key = ("passes", (fingerprint or model_fingerprint(model)).passes, layers, step.batch_size, step.seq_len,
           step.mixed_precision, steps > 1, process)
    for cached in cache.get(key, []):
        # A run of n micro-batches that stopped at a repeat is also the run of any more.
        if len(cached.micro_batch_peaks) == steps or (cached.repeated and len(cached.micro_batch_peaks) <= steps):
            return cached
    ran = quietly(_run_passes, model, step, layers, process)
    cache.setdefault(key, []).append(ran)
    return ran


def optimizer_phase(model: torch.nn.Module, step: TrainingSetup, layers: int | None, gets_gradient: tuple,
                    fingerprint: Fingerprint | None = None, process=None) -> OptimizerPhase:
    """Return the optimizer step of ``step`` on a fake copy of ``model`` whose reached parameters have gradients (cached).

    ``process``: as in :func:`passes`, the copy laid out within its ``laid_out(copy)``
    (under expert parallelism a process holds only its own experts).
    """
    key = ("optimizer step", (fingerprint or model_fingerprint(model)).parameters, layers, step.optimizer,
           step.options, gets_gradient, process)
    if key not in cache:
        cache[key] = quietly(_run_optimizer_phase, model, step, layers, gets_gradient, process)
    return cache[key]


def _run_passes(model, step, layers, process=None) -> Passes:
    mode = FakeTensorMode()
    fake = fake_copy(model, mode, layers)
    check_trainable(fake)
    fake.train()
    laid_out = process.laid_out(fake) if process is not None else contextlib.nullcontext()
    with laid_out, mode, cpu_kernels_for(fake, step.mixed_precision), refusing_what_needs_values(), \
            an_unpadded_batch(), modules_cast_in_forward():
        batch = training_batch(fake, step.batch_size, step.seq_len)
        if process is not None:
            batch = process.batch_of(batch)
        with recording_timeline() as record:
            tracker = StepTracker()
        tracker.track_external(fake)
        track_quant_states(tracker, fake)  # as the measurement does
        with tracker:
            tracker.start_phase()
            # The course's training step without its optimizer step (followed apart, see optimizer_phase).
            seen = training_step(fake, None, batch, default_loss, step.mixed_precision,
                                 step.gradient_accumulation_steps, tracker, stop_at_repeat=True)
    after_backward = seen["after_backward"]
    return Passes(
        weights=after_backward["Parameter"] + after_backward["Buffer"], gradients=after_backward["Gradient"],
        activations=seen["after_forward"]["Activation"], after_backward=after_backward["Total"],
        micro_batch_peaks=tuple(seen["micro_batch_peaks"]),
        gets_gradient=tuple(p.grad is not None for p in fake.parameters()), repeated=seen["repeated"],
        timeline=tuple((label, names, held.sum(axis=1)) for label, names, held in segments(record)),
    )


def _run_optimizer_phase(model, step, layers, gets_gradient, process=None) -> OptimizerPhase:
    mode = FakeTensorMode()
    fake = fake_copy(model, mode, layers)
    laid_out = process.laid_out(fake) if process is not None else contextlib.nullcontext()
    with laid_out, refusing_what_needs_values():
        optimizer = fake_optimizer(fake, step, mode)
        return follow_optimizer_step(fake, gets_gradient, optimizer, mode)


def follow_optimizer_step(module: torch.nn.Module, gets_gradient: tuple, optimizer, mode,
                          state_held_by=None) -> OptimizerPhase:
    """Return ``optimizer``'s step over the fake parameters of ``module``, after a warm-up step that creates its state (bytes).

    ``gets_gradient``: per parameter of ``module.parameters()``, whether the
    backward pass gives it a gradient (each step gets zeros). The step runs
    the optimizer's ``step()`` then ``zero_grad()`` under a StepTracker told of
    ``module`` and of ``state_held_by`` (the optimizer holding the state:
    ``optimizer`` unless it wraps another, as ZeRO-1's does).
    """
    parameters = list(module.parameters())

    def give_gradients():
        # What the backward pass leaves: a gradient for exactly the parameters it reaches.
        for parameter, reached in zip(parameters, gets_gradient):
            if reached:
                parameter.grad = torch.zeros_like(parameter)

    def optimizer_step():
        with ScalarsInOptimizerStep():
            optimizer.step()
        optimizer.zero_grad()

    with mode:
        give_gradients()
        optimizer_step()  # the warm-up step: it creates the optimizer state
        give_gradients()
        tracker = StepTracker()
        tracker.track_external(module, state_held_by or optimizer)  # the gradients with them, as Gradient
        track_quant_states(tracker, module)
        with tracker:
            tracker.start_phase()
            before = cpu_snapshot(tracker, "current")
            optimizer_step()
            peak = tracker.total("peak")
            after = cpu_snapshot(tracker, "current")
    return OptimizerPhase(
        state_before=before["Optstate"], state_after=after["Optstate"],
        weights=after["Parameter"] + after["Buffer"], rise=peak - before["Total"],
    )


def full_fake_step(model: torch.nn.Module, step: TrainingSetup, layers: int | None = None) -> TrainingMemory:
    """Return ``measure_training_step_peak``'s measurement of ``step`` run whole on a fake copy of ``model``: no shortcut."""
    mode = FakeTensorMode()
    fake = fake_copy(model, mode, layers)
    check_trainable(fake)
    with refusing_what_needs_values():
        optimizer = fake_optimizer(fake, step, mode)
        with mode, cpu_kernels_for(fake, step.mixed_precision), an_unpadded_batch(), modules_cast_in_forward():
            batch = training_batch(fake, step.batch_size, step.seq_len)
            return quietly(
                _measure_step, fake, optimizer, batch, default_loss, step.mixed_precision,
                step.gradient_accumulation_steps, ScalarsInOptimizerStep,
            )


def check_trainable(fake: torch.nn.Module) -> None:
    if not any(p.requires_grad for p in fake.parameters()):
        raise PlannerRefused("model: no parameter requires grad, so there is no training step to follow")
