"""The memory planner: the peak of one training step of any model, by running the step on fake tensors (lesson 4).

:func:`estimate_training_memory` rebuilds the model under torch's
``FakeTensorMode`` (tensors with shapes, dtypes and devices but no data: no
memory is allocated, no arithmetic is done) and lets
:func:`course_utils.training_memory.measure_training_step_peak` follow one
full training step on it, exactly as it measures a real one: warm-up step,
then the measured step under torch's MemTracker. So it applies to any model
and optimizer the real step applies to, and what it follows is what runs:
torch's optimizers (their foreach and fused variants included), both
Adafactors, and bitsandbytes' 8-bit Adam and AdamW (their CPU update, written
in torch operations, is followed inside; see ``training_memory``).

A stack of identical blocks costs a fixed amount plus the same amount per
block, so for a deep model it runs copies with 1, 2 and 3 blocks (one block
deeper each, 2, 3 and 4, then 3, 4 and 5..., while a shallow copy peaks
elsewhere), checks that each quantity (each micro-batch's peaks, when
accumulating) grows by the same number of bytes per block, and extrapolates to
the model's depth (``tests/test_planner.py`` holds this exact against full
fake runs). A model whose blocks differ (some frozen, a mix of attention
types) is run whole, which is exact but slower (minutes at 7B). Results are
cached by configuration: a repeated estimate costs milliseconds.

Two shortcuts of the fake step give the numbers of the full one (see
``training_memory._measure_step``): the warm-up step gives the trainable
parameters zero gradients instead of running forward and backward (checked:
when the backward pass leaves a parameter without a gradient, the step is run
again with the real warm-up), and accumulated micro-batches stop once one
leaves memory exactly as it found it.

Version notes: written against torch 2.13 (FakeTensorMode, MemTracker
internals, see ``course_utils._step_tracker``), transformers 5.24 and
bitsandbytes 0.50; after upgrading, rerun ``pytest tests/test_planner.py``.
"""

from __future__ import annotations

import copy
import gc
import json

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.optimizers import _check_optimizer_name, _resolve_options, make_optimizer
from course_utils.training_memory import (
    PHASES,
    TrainingMemory,
    WarmUpDiffers,
    _check_mixed_precision,
    _default_loss,
    _measure_step,
    head_kind,
    training_batch,
)
from course_utils.validation import check_instance, check_positive_int

__all__ = ["DEVICE_NOTE", "estimate_training_memory", "PlannerRefused"]

DEVICE_NOTE = (
    "Follows the CPU's kernels and allocator, as the course's machine runs them: PyTorch's CPU attention "
    "kernels, optimizers updating one parameter at a time unless foreach=True or fused=True is passed, every "
    "tensor counted at its exact size. On a CUDA GPU the attention kernel differs (flash or memory-efficient "
    "attention keep less than the math kernel), torch.optim defaults to foreach (one extra copy of the "
    "parameters during the step), bitsandbytes runs fused CUDA kernels without the CPU update's fp32 working "
    "copies, the caching allocator rounds sizes up and keeps freed blocks, and CUDA itself takes a few hundred "
    "MiB: plan some headroom."
)

_FIELDS = ("weights", "gradients", "optimizer_state", "activations")
_PROBE_LAYERS = (1, 2, 3)
_LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "n_layers")
_cache: dict[str, TrainingMemory] = {}


class PlannerRefused(ValueError):
    """The planner cannot follow this step; the message names what and why."""


def estimate_training_memory(
    model: torch.nn.Module,
    optimizer: str,
    batch_size: int,
    seq_len: int,
    *,
    mixed_precision: str = "no",
    gradient_accumulation_steps: int = 1,
    **optimizer_options: object,
) -> TrainingMemory:
    """Return the memory of one training step of ``model``, in bytes, followed on fake tensors (no memory used).

    - ``model``: a transformers model (base model, sequence or token
      classifier, causal or masked LM, or a PEFT model around one), real, on
      the meta device or fake. Its dtype (pure bf16 storage when built in
      bf16), frozen parameters (``requires_grad``), LoRA adapters and
      activation checkpointing (``activation_checkpointing_enable()`` or
      torch's checkpoint wrappers) are read from it. It is not modified.
    - ``optimizer``: a name of :func:`course_utils.optimizers.make_optimizer`
      (``SUPPORTED_OPTIMIZERS``: torch's SGD, Adam, AdamW, Adafactor, Adadelta,
      Adagrad, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop; transformers'
      Adafactor; bitsandbytes' Adam8bit and AdamW8bit), with its constructor
      options (``foreach=True``, ``fused=True``, ``momentum=0.9``...).
    - ``batch_size``: sequences in one forward pass (the micro-batch when
      accumulating), each ``seq_len`` tokens; inputs are ``input_ids`` with the
      labels the head takes (:func:`course_utils.training_memory.training_batch`).
    - ``mixed_precision``: as Accelerate means it: "no", or "bf16" (fp32
      weights, gradients and state; the forward pass under CPU bf16 autocast).
      "fp16" is refused (Accelerate does not autocast fp16 on CPU).
    - ``gradient_accumulation_steps``: forward and backward passes per optimizer step.

    The step is the one :func:`course_utils.training_memory.measure_training_step_peak`
    measures (see there). See :data:`DEVICE_NOTE` for whose kernels it follows.
    Raises :class:`PlannerRefused` (a ValueError) naming what it cannot follow and why.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    name = _check_optimizer_name(optimizer)
    _resolve_options(name, optimizer_options)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    _check_mixed_precision(mixed_precision)
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "vocab_size"):
        raise PlannerRefused(
            f"model: the planner builds the batch from a transformers config (vocab_size, labels); "
            f"{type(model).__name__} has none"
        )
    head_kind(model)  # refuses a head whose inputs it does not know
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions is not None and seq_len > positions:
        raise ValueError(f"seq_len must be at most the model's {positions} positions, got {seq_len}")
    step = {
        "optimizer": name,
        "options": optimizer_options,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "mixed_precision": mixed_precision,
        "gradient_accumulation_steps": gradient_accumulation_steps,
    }
    key = _cache_key(model, step)
    if key not in _cache:
        # The step's garbage collections (see measure_training_step_peak) then skip
        # the objects that exist already: most of their time, none of what they free.
        gc.freeze()
        try:
            _cache[key] = _plan(model, step)
        finally:
            gc.unfreeze()
    return _cache[key]


def _plan(model: torch.nn.Module, step: dict) -> TrainingMemory:
    """Return the step's memory: one fake run of the whole model, or runs of 1-3 blocks extrapolated."""
    layers, layer_list = _repeated_layers(model)
    # Probes cost about as much as a run of as many blocks as they have together: a shallow
    # model is run whole, which is exact and no slower.
    if layer_list is None or layers <= sum(_PROBE_LAYERS):
        return _fake_step(model, step, layers=None)
    runs = [_fake_probe(model, step, layers=k) for k in _PROBE_LAYERS]
    first = min(_PROBE_LAYERS)
    planned = _extrapolate([r[0] for r in runs], layers, first, [r[1] for r in runs])
    # A shallow model can peak where a deeper one does not (BERT's backward peaks by its head
    # with one block, in its first block from two on; an accumulated GPT-2 backward moves until
    # three): slide the probes one block deeper, while they cost less than the whole model.
    while planned is None and layers > sum(range(min(_PROBE_LAYERS), first + len(runs) + 1)):
        first += 1
        runs = [*runs[1:], _fake_probe(model, step, layers=first + len(_PROBE_LAYERS) - 1)]
        planned = _extrapolate([r[0] for r in runs], layers, first, [r[1] for r in runs])
    return planned or _fake_step(model, step, layers=None)


def _extrapolate(
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


def _fake_step(model: torch.nn.Module, step: dict, layers: int | None) -> TrainingMemory:
    """Return the measurement of one step of a fake copy of ``model`` (with ``layers`` blocks, or all)."""
    return _fake_probe(model, step, layers)[0]


def _fake_probe(model: torch.nn.Module, step: dict, layers: int | None) -> tuple[TrainingMemory, list]:
    """Return :func:`_fake_step`'s measurement and its (forward, backward) peak of each micro-batch, in bytes."""
    from transformers.utils import logging as transformers_logging

    # The copy runs the model's forward, and transformers logs its notes about the config there
    # ("loss_type=None ... default loss", "use_cache=True is incompatible with gradient
    # checkpointing"): the user's own run of the model says them; the planner has nothing to add.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        return _follow_fake_step(model, step, layers)
    finally:
        transformers_logging.set_verbosity(verbosity)


def _follow_fake_step(model: torch.nn.Module, step: dict, layers: int | None) -> tuple[TrainingMemory, list]:
    try:
        return _follow_fake_step_once(model, step, layers, shortcuts=True)
    except WarmUpDiffers:
        return _follow_fake_step_once(model, step, layers, shortcuts=False)


def _follow_fake_step_once(
    model: torch.nn.Module, step: dict, layers: int | None, shortcuts: bool
) -> tuple[TrainingMemory, list]:
    mode = FakeTensorMode()
    fake = _fake_copy(model, mode, layers)
    trainable = [p for p in fake.parameters() if p.requires_grad]
    if not trainable:
        raise PlannerRefused("model: no parameter requires grad, so there is no training step to follow")
    if step["optimizer"] in ("adam8bit", "adamw8bit"):
        # bitsandbytes computes its quantisation tables from values when it is built: build it
        # outside fake mode, then give it fake twins of its 1 KiB tables.
        optimizer = make_optimizer(step["optimizer"], trainable, **step["options"])
        with mode:
            optimizer.name2qmap = {key: _fake_twin(table) for key, table in optimizer.name2qmap.items()}
    with mode:
        if step["optimizer"] not in ("adam8bit", "adamw8bit"):
            optimizer = make_optimizer(step["optimizer"], trainable, **step["options"])
        batch = training_batch(fake, step["batch_size"], step["seq_len"])
        micro_batch_peaks: list[tuple[int, int]] = []
        try:
            measured = _measure_step(
                fake, optimizer, batch, _default_loss, step["mixed_precision"], step["gradient_accumulation_steps"],
                in_optimizer_step=_ScalarsInOptimizerStep, fake=shortcuts, micro_batch_peaks=micro_batch_peaks,
            )
            return measured, micro_batch_peaks
        except (RuntimeError, NotImplementedError, ArithmeticError) as error:
            # An operation that needs real values (a data-dependent shape, a custom kernel).
            raise PlannerRefused(
                f"the planner could not follow this step on fake tensors: {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from error


class _ScalarsInOptimizerStep(TorchDispatchMode):
    """Answer a fake tensor's value read as a Python number (0.5, or 1 for integers); entered around ``optimizer.step()`` only.

    A fake tensor has no values. Both Adafactors and NAdam read numbers back
    (the step count, a root mean square, a product of betas) to compute scalar
    factors; no tensor's size depends on them, so the step's allocations are the same whatever the
    number. Outside the optimizer step a value read is still refused, because a
    model's shapes may depend on it; and forward and backward do not pay for
    one more dispatch layer on every operation.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            # 0.5, not 1: optimizers divide by 1 - a product of betas or by a step count.
            return False if dtype == torch.bool else 0.5 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


def _fake_copy(model: torch.nn.Module, mode: FakeTensorMode, layers: int | None) -> torch.nn.Module:
    """Return a copy of ``model`` whose tensors are fake CPU tensors, keeping only the first ``layers`` blocks.

    ``copy.deepcopy`` with a memo that maps each parameter, buffer and tensor
    attribute to a fake twin: ties stay tied, ``requires_grad``, checkpointing
    flags and wrappers (LoRA, checkpoint wrappers) are copied with the modules.
    """
    memo: dict[int, object] = {}
    with mode:
        for module in model.modules():
            for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                    memo[id(tensor)] = _fake_twin(tensor)
    if layers is not None:
        count, layer_list = _repeated_layers(model)
        config = copy.deepcopy(model.config)
        _set_layer_count(config, layers)
        layer_types = getattr(config, "layer_types", None)
        if isinstance(layer_types, list) and len(layer_types) == count:
            config.layer_types = layer_types[:layers]
        memo[id(model.config)] = config
        memo[id(layer_list)] = copy.deepcopy(torch.nn.ModuleList(list(layer_list)[:layers]), memo)
    return copy.deepcopy(model, memo)


def _fake_twin(tensor: torch.Tensor) -> torch.Tensor:
    """Return a fake CPU tensor shaped like ``tensor`` (a Parameter stays a Parameter, with its requires_grad)."""
    twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
    return twin


def _layer_count(config) -> int | None:
    """Return the number of repeated blocks the config declares, or None."""
    for name in _LAYER_COUNT_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _set_layer_count(config, layers: int) -> None:
    for name in _LAYER_COUNT_NAMES:
        if isinstance(getattr(config, name, None), int):
            setattr(config, name, layers)
            return


def _repeated_layers(model: torch.nn.Module) -> tuple[int | None, torch.nn.ModuleList | None]:
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


def _cache_key(model: torch.nn.Module, step: dict) -> str:
    """Return a string that is the same for two estimates exactly when they follow the same step."""
    try:
        config = model.config.to_json_string(use_diff=False)
    except (TypeError, ValueError):
        config = repr(model.config)
    parts = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    checkpointing = [
        (n, type(m).__name__, bool(getattr(m, "gradient_checkpointing", False))) for n, m in model.named_modules()
    ]
    described = {"options": sorted((k, repr(v)) for k, v in step["options"].items())}
    return json.dumps(
        [type(model).__name__, config, repr(parts), repr(checkpointing), repr(sorted(step.items(), key=str)),
         described], default=str,
    )

