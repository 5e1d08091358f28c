"""The planner's machinery (used by ``course_utils.memory.planner``): one training step followed on fake tensors, fast.

:func:`full_fake_step` is the definition: the step that
``training_memory.measure_training_step_peak`` measures (``step.training_step``:
a warm-up step, then the measured step under MemTracker), run on a fake copy of
the model. It is exact and slow. The planner instead composes the same numbers
from two smaller fake runs, each kept in the planner's one :data:`cache` under
the model's :class:`Fingerprint` (taken once per estimate) and the
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
step (:class:`ScalarsInOptimizerStep`); in the passes, the two questions
transformers' mask builder reads values for (is there padding? are sequences
packed?) get the answer the course's unpadded batch gives
(:func:`an_unpadded_batch`), and any other value read is refused.

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
import copy
import json
import warnings
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.memory._step_tracker import StepTracker, cpu_snapshot, recording_timeline
from course_utils.memory.deepening import segments
from course_utils.memory.fake_kernels import cpu_kernels_for
from course_utils.memory.qlora import fake_quant_states, quant_state_tensors, track_quant_states
from course_utils.optimizers import make_optimizer
from course_utils.memory.probes import config_with_layers, repeated_layers
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import PHASES, default_loss, training_step
from course_utils.memory.training_memory import TrainingMemory, _measure_step, training_batch

_BNB_OPTIMIZERS = ("adam8bit", "adamw8bit", "paged_adamw8bit", "paged_adamw32bit")
# The planner's one cache: whole estimates (planner.py), passes and optimizer steps (here), each keyed by
# a tuple whose first item says which, then the model's fingerprint and the set-up's choices it depends on.
cache: dict[tuple, object] = {}


class PlannerRefused(ValueError):
    """The planner cannot follow this step; the message names what and why."""


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
                  fingerprint: Fingerprint | None = None) -> tuple[TrainingMemory, list]:
    """Return the memory of ``step`` on the first ``layers`` blocks of ``model`` (all if None), composed, cached.

    ``fingerprint`` is :func:`fingerprint` of ``model``, taken once by the caller (taken here if None).
    """
    fingerprint = fingerprint or model_fingerprint(model)
    ran = passes(model, step, layers, fingerprint)
    phase = optimizer_phase(model, step, layers, ran.gets_gradient, fingerprint)
    return compose(ran, phase, step.gradient_accumulation_steps)


def passes(model: torch.nn.Module, step: TrainingSetup, layers: int | None,
           fingerprint: Fingerprint | None = None) -> Passes:
    """Return the forward and backward passes of ``step`` on a fake copy of ``model`` (cached)."""
    steps = step.gradient_accumulation_steps
    key = ("passes", (fingerprint or model_fingerprint(model)).passes, layers, step.batch_size, step.seq_len,
           step.mixed_precision, steps > 1)
    for cached in cache.get(key, []):
        # A run of n micro-batches that stopped at a repeat is also the run of any more.
        if len(cached.micro_batch_peaks) == steps or (cached.repeated and len(cached.micro_batch_peaks) <= steps):
            return cached
    ran = quietly(_run_passes, model, step, layers)
    cache.setdefault(key, []).append(ran)
    return ran


def optimizer_phase(model: torch.nn.Module, step: TrainingSetup, layers: int | None, gets_gradient: tuple,
                    fingerprint: Fingerprint | None = None) -> OptimizerPhase:
    """Return the optimizer step of ``step`` on a fake copy of ``model`` whose reached parameters have gradients (cached)."""
    key = ("optimizer step", (fingerprint or model_fingerprint(model)).parameters, layers, step.optimizer,
           step.options, gets_gradient)
    if key not in cache:
        cache[key] = quietly(_run_optimizer_phase, model, step, layers, gets_gradient)
    return cache[key]


def _run_passes(model, step, layers) -> Passes:
    mode = FakeTensorMode()
    fake = fake_copy(model, mode, layers)
    _check_trainable(fake)
    fake.train()
    with mode, cpu_kernels_for(fake, step.mixed_precision), _refusing_what_needs_values(), an_unpadded_batch(), \
            modules_cast_in_forward():
        batch = training_batch(fake, step.batch_size, step.seq_len)
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


def _run_optimizer_phase(model, step, layers, gets_gradient) -> OptimizerPhase:
    mode = FakeTensorMode()
    fake = fake_copy(model, mode, layers)
    with _refusing_what_needs_values():
        optimizer = _fake_optimizer(fake, step, mode)
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
    _check_trainable(fake)
    with _refusing_what_needs_values():
        optimizer = _fake_optimizer(fake, step, mode)
        with mode, cpu_kernels_for(fake, step.mixed_precision), an_unpadded_batch(), modules_cast_in_forward():
            batch = training_batch(fake, step.batch_size, step.seq_len)
            return quietly(
                _measure_step, fake, optimizer, batch, default_loss, step.mixed_precision,
                step.gradient_accumulation_steps, ScalarsInOptimizerStep,
            )


def _check_trainable(fake: torch.nn.Module) -> None:
    if not any(p.requires_grad for p in fake.parameters()):
        raise PlannerRefused("model: no parameter requires grad, so there is no training step to follow")


def _fake_optimizer(fake: torch.nn.Module, step: TrainingSetup, mode: FakeTensorMode) -> torch.optim.Optimizer:
    """Return the step's optimizer over ``fake``'s trainable parameters, its tensors fake."""
    trainable = [p for p in fake.parameters() if p.requires_grad]
    if step.optimizer not in _BNB_OPTIMIZERS:
        with mode:
            return make_optimizer(step.optimizer, trainable, **step.optimizer_options)
    # bitsandbytes computes its quantisation tables from values when it is built: build it
    # outside fake mode, then give it fake twins of its 1 KiB tables.
    optimizer = make_optimizer(step.optimizer, trainable, **step.optimizer_options)
    with mode:
        optimizer.name2qmap = {key: _fake_twin(table) for key, table in optimizer.name2qmap.items()}
    return optimizer


@contextlib.contextmanager
def modules_cast_in_forward():
    """Let a model cast one of its modules inside its forward pass (``module.to(dtype)``) where the cast changes nothing.

    Switch Transformers' router calls ``self.classifier.to(router_dtype)`` on
    every forward pass. On real weights of that dtype it is a no-op; on a fake
    copy torch's ``Module._apply`` tries to swap each fake parameter for
    itself, and fails ("Couldn't swap Linear.weight"). Here a cast that returns
    every tensor unchanged leaves the module as it is; one that would convert
    the weights (a bf16 router asked for fp32) is refused: the real step would
    change the model's own weights on its first call.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.nn.Module._apply

    def _apply(module, fn, recurse=True):
        tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
        if not any(isinstance(t, FakeTensor) for t in tensors):
            return original(module, fn, recurse)
        if all(fn(t) is t for t in tensors):
            return module
        changed = sorted({f"{t.dtype} to {fn(t).dtype}" for t in tensors if fn(t) is not t})
        raise PlannerRefused(
            f"model: its forward pass converts its own {type(module).__name__}'s weights ({', '.join(changed)}) "
            f"on its first call, which changes the model the plan is of (Switch Transformers' router casts its "
            f"classifier to config.router_dtype). Build the model with those weights in that dtype already (train "
            f"in fp32, or under bf16 autocast), or measure the step for real with measure_training_step_peak"
        )

    torch.nn.Module._apply = _apply
    try:
        yield
    finally:
        torch.nn.Module._apply = original


@contextlib.contextmanager
def an_unpadded_batch():
    """Let transformers' mask builder find what the real step finds by reading values: no padding, no packing.

    Before building an attention mask, transformers reads values to see whether
    it can skip the mask (SDPA's ``is_causal``): whether a padding mask the
    model made itself is all ones (BART's decoder makes one), and, with no cache
    (checkpointing turns it off), whether the position ids pack several
    sequences in a row. A fake tensor has no values, so transformers assumes it
    is being traced and builds a (batch, 1, seq, seq) mask the real step skips
    (and checkpointing keeps alive). The course's batch has no attention mask,
    no padding token and no position ids (the model numbers each row 0, 1,
    2... itself): any padding mask is all ones and each row one sequence, which
    is what the real step finds and what these answer.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils

    def all_ones_when_fake(decide):
        def decision(padding_mask, *args, **kwargs):
            return decide(None if isinstance(padding_mask, FakeTensor) else padding_mask, *args, **kwargs)
        return decision

    answers = {
        "find_packed_sequence_indices": lambda original: lambda position_ids: None,
        "_ignore_causal_mask_sdpa": all_ones_when_fake,
        "_ignore_bidirectional_mask_sdpa": all_ones_when_fake,
    }
    # A transformers release without one of these functions does not make that decision.
    originals = {name: getattr(masking_utils, name) for name in answers if hasattr(masking_utils, name)}
    for name, original in originals.items():
        setattr(masking_utils, name, answers[name](original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(masking_utils, name, original)


@contextlib.contextmanager
def _refusing_what_needs_values():
    """Turn an error of an operation that needs real values (a data-dependent shape, a custom kernel), or of the model itself, into a refusal."""
    try:
        yield
    except PlannerRefused:
        raise
    except (DynamicOutputShapeException, DataDependentOutputException) as error:
        raise PlannerRefused(
            f"the planner cannot follow this step on fake tensors: the model's forward or loss calls {error.func}, "
            f"whose result depends on tensor values, which fake tensors do not have (a shape or a branch taken "
            f"from the data: in a mixture-of-experts layer, which tokens each expert gets). Measure the step for "
            f"real instead (measure_training_step_peak on a small config of the same family)"
        ) from error
    except (RuntimeError, NotImplementedError, ArithmeticError) as error:
        # The library's own words are the cause (chained), not the reason: they name torch's internals.
        raise PlannerRefused(
            f"the planner could not follow this step on fake tensors: an operation of the model's step has no "
            f"fake-tensor counterpart the planner can run (torch raised {type(error).__name__}; its message is this "
            f"refusal's cause). Measure the step for real instead (measure_training_step_peak on a small config of "
            f"the same family)"
        ) from error
    except (AttributeError, TypeError, ValueError, LookupError) as error:
        # Raised by the model's own code, which a real step on the same batch runs too.
        raise PlannerRefused(
            f"model: its forward pass fails on the course's batch ({type(error).__name__}, its message is this "
            f"refusal's cause): it needs an input or an option that batch (training_batch: the model's main input "
            f"and its head's labels) does not give it. Measure the step for real on your own batch with "
            f"measure_training_step_peak"
        ) from error


def quietly(function, *args):
    """Return ``function(*args)`` with transformers' config notes and MemTracker's skipped-hook warning silenced."""
    from transformers.utils import logging as transformers_logging

    # The copy runs the model's forward, and transformers logs its notes about the config there
    # ("loss_type=None ... default loss", "use_cache=True is incompatible with gradient
    # checkpointing"): the user's own run of the model says them; the planner has nothing to add.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            # transformers builds some modules inside forward (the classifier's ReLU,
            # CrossEntropyLoss); they are gone by backward, and MemTracker warns that it
            # skips their hooks. Totals are unaffected.
            warnings.filterwarnings("ignore", message="Module is None. Skipping", category=UserWarning)
            return function(*args)
    finally:
        transformers_logging.set_verbosity(verbosity)


class ScalarsInOptimizerStep(TorchDispatchMode):
    """Answer a fake tensor's value read as a Python number (0.5, or 1 for integers); entered around ``optimizer.step()`` only.

    A fake tensor has no values. Both Adafactors and NAdam read numbers back
    (the step count, a root mean square, a product of betas) to compute scalar
    factors; no tensor's size depends on them, so the step's allocations are
    the same whatever the number. Outside the optimizer step a value read is
    still refused, because a model's shapes may depend on it; and forward and
    backward do not pay for one more dispatch layer on every operation.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            # 0.5, not 1: optimizers divide by 1 - a product of betas or by a step count.
            return False if dtype == torch.bool else 0.5 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


def fake_copy(model: torch.nn.Module, mode: FakeTensorMode, layers: int | None) -> torch.nn.Module:
    """Return a copy of ``model`` whose tensors are fake CPU tensors, keeping only the first ``layers`` blocks.

    ``copy.deepcopy`` with a memo that maps each parameter, buffer and tensor
    attribute to a fake twin: ties stay tied, ``requires_grad``, checkpointing
    flags and wrappers (LoRA, checkpoint wrappers) are copied with the modules.
    """
    memo: dict[int, object] = {}
    dropped: set[int] = set()
    if layers is not None:
        count, layer_list = repeated_layers(model)
        # The blocks left out need no fake twins: most of a deep model's tensors.
        dropped = {id(m) for block in list(layer_list)[layers:] for m in block.modules()}
    with mode:
        for module in model.modules():
            if id(module) in dropped:
                continue
            for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                    memo[id(tensor)] = _fake_twin(tensor)
        # A 4-bit (QLoRA) weight's quantisation state is not a tensor attribute of its module.
        fake_quant_states(model, memo, _fake_twin, dropped)
    if layers is not None:
        memo[id(model.config)] = config_with_layers(model.config, layers, count)
        memo[id(layer_list)] = copy.deepcopy(torch.nn.ModuleList(list(layer_list)[:layers]), memo)
    return copy.deepcopy(model, memo)


def _fake_twin(tensor: torch.Tensor) -> torch.Tensor:
    """Return a fake CPU tensor shaped like ``tensor`` (a Parameter stays a Parameter, with its requires_grad)."""
    twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
    return twin


@dataclass(frozen=True)
class Fingerprint:
    """What of a model decides a fake run's bytes, as two strings: equal exactly when two models run the same.

    ``parameters``: the model's class, its parameters and buffers (names,
    shapes, dtypes, requires_grad) and its 4-bit weights' quantisation states
    (shapes, dtypes), all the optimizer step sees. ``passes``:
    that, its config, every module's class and checkpointing flag and the
    attention kernel, what the forward and backward passes run.
    """

    parameters: str
    passes: str


def model_fingerprint(model: torch.nn.Module) -> Fingerprint:
    """Return the :class:`Fingerprint` of ``model``; the planner takes it once per estimate."""
    tensors = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    tensors += [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    # Two 4-bit bases with the same packed weights can differ in their quantisation states (double quantisation).
    tensors += [(tuple(t.shape), str(t.dtype)) for t in quant_state_tensors(model)]
    parameters = [type(model).__name__, repr(tensors)]
    try:
        config = model.config.to_json_string(use_diff=False)
    except (TypeError, ValueError):
        config = repr(model.config)
    modules = [(n, type(m).__name__, bool(getattr(m, "gradient_checkpointing", False)))
               for n, m in model.named_modules()]
    # The attention kernel ("eager", "sdpa") changes what the passes keep, and
    # to_json_string leaves it out: an eager model would get an sdpa model's plan.
    attention = getattr(model.config, "_attn_implementation", None)
    return Fingerprint(json.dumps(parameters), json.dumps([*parameters, config, repr(modules), attention], default=str))
