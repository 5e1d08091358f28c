"""How much memory training takes: optimizer state exact to the byte, and the peak of one step.

Lesson 2 compares optimizers by the state they keep (Adam's two moments,
Adafactor's factored statistics, bitsandbytes' 8-bit states); lesson 3 adds
weights, gradients and activations to find the peak of one training step.
Both lessons use this module, so that an estimate and the measurement it is
checked against speak the same vocabulary.

- :func:`estimate_optimizer_state` predicts, from parameter shapes and dtypes
  alone, the bytes an optimizer holds after its first ``step()``. It works on a
  model built on the meta device, so a 7B-parameter model costs nothing.
- :func:`make_optimizer` builds the real optimizer for the same name and
  options; :func:`measure_optimizer_state`, :func:`count_optimizer_state_elements`
  and :func:`describe_optimizer_state` read what it really holds.

All sizes are in bytes unless a name says otherwise.

bitsandbytes is imported only inside :func:`make_optimizer`:
``accelerate.notebook_launcher`` refuses to start once it has been imported.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable

import torch

__all__ = [
    "SUPPORTED_OPTIMIZERS",
    "estimate_optimizer_state",
    "make_optimizer",
    "measure_optimizer_state",
    "count_optimizer_state_elements",
    "describe_optimizer_state",
]

# --------------------------------------------------------------------------- optimizer vocabulary

# For each optimizer name: the options that change the size of its state, with
# their defaults, and the other constructor options, which are accepted (so one
# dict of options can go to both the estimate and make_optimizer) but change
# nothing in the state.
_STATE_OPTIONS: dict[str, dict[str, object]] = {
    "sgd": {"momentum": 0.0},
    # `fused` decides the dtype of Adam's `step` counter (see _adam_step_dtype).
    "adam": {"amsgrad": False, "fused": None},
    "adamw": {"amsgrad": False, "fused": None},
    "adafactor": {"beta1": None},
    "torch_adafactor": {},
    "adam8bit": {"min_8bit_size": 4096},
    "adamw8bit": {"min_8bit_size": 4096},
}
_OTHER_OPTIONS: dict[str, frozenset[str]] = {
    "sgd": frozenset({"lr", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable", "fused"}),
    "adam": frozenset(
        {"lr", "betas", "eps", "weight_decay", "maximize", "foreach", "capturable", "differentiable", "decoupled_weight_decay"}
    ),
    "adamw": frozenset(
        {"lr", "betas", "eps", "weight_decay", "maximize", "foreach", "capturable", "differentiable"}
    ),
    # scale_parameter, relative_step and warmup_init change how the step size is
    # computed, not what is stored: transformers' Adafactor always keeps `RMS`.
    "adafactor": frozenset(
        {"lr", "eps", "clip_threshold", "decay_rate", "weight_decay", "scale_parameter", "relative_step", "warmup_init"}
    ),
    "torch_adafactor": frozenset({"lr", "beta2_decay", "eps", "d", "weight_decay", "foreach", "maximize"}),
    "adam8bit": frozenset({"lr", "betas", "eps", "weight_decay"}),
    "adamw8bit": frozenset({"lr", "betas", "eps", "weight_decay"}),
}
SUPPORTED_OPTIMIZERS: tuple[str, ...] = tuple(_STATE_OPTIONS)

# bitsandbytes' 8-bit states: one absmax scale per block of 256 elements, and a
# 256-entry fp32 table (one entry per uint8 code) per state, shared by all tensors.
_BNB_BLOCK_SIZE = 256
_BNB_QMAP_ENTRIES = 256
_FP32_BYTES = 4


def _check_optimizer_name(optimizer: object) -> str:
    if not isinstance(optimizer, str) or optimizer not in _STATE_OPTIONS:
        raise ValueError(f"optimizer must be one of {', '.join(SUPPORTED_OPTIMIZERS)}; got {optimizer!r}")
    return optimizer


def _resolve_options(name: str, options: dict[str, object]) -> dict[str, object]:
    """Return the state-changing options of ``name``, defaults filled in; reject unknown option names."""
    accepted = set(_STATE_OPTIONS[name]) | _OTHER_OPTIONS[name]
    for option in options:
        if option not in accepted:
            raise TypeError(
                f"unknown option {option!r} for optimizer {name!r}; accepted options: {', '.join(sorted(accepted))}"
            )
    resolved = {key: options.get(key, default) for key, default in _STATE_OPTIONS[name].items()}
    if "momentum" in resolved:
        momentum = resolved["momentum"]
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or momentum < 0:
            raise ValueError(f"option 'momentum' must be a number >= 0, got {momentum!r}")
    if "amsgrad" in resolved and not isinstance(resolved["amsgrad"], bool):
        raise ValueError(f"option 'amsgrad' must be True or False, got {resolved['amsgrad']!r}")
    if "beta1" in resolved:
        beta1 = resolved["beta1"]
        if beta1 is not None and (isinstance(beta1, bool) or not isinstance(beta1, (int, float)) or not 0 <= beta1 < 1):
            raise ValueError(f"option 'beta1' must be None or a number in [0, 1), got {beta1!r}")
    if "min_8bit_size" in resolved:
        size = resolved["min_8bit_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"option 'min_8bit_size' must be an int >= 0, got {size!r}")
    return resolved


def _trainable_parameters(model: object) -> list[torch.nn.Parameter]:
    """Return the parameters an optimizer would keep state for: trainable, each tied tensor once."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    # model.parameters() already yields a tied (shared) parameter once.
    return [p for p in model.parameters() if p.requires_grad]


# --------------------------------------------------------------------------- estimate


def estimate_optimizer_state(model: torch.nn.Module, optimizer: str, **options: object) -> int:
    """Return the bytes of state ``optimizer`` will hold for ``model`` after its first ``step()``.

    Only the trainable parameters' shapes and dtypes are read, so ``model``
    may live on the meta device. ``optimizer`` is one of
    :data:`SUPPORTED_OPTIMIZERS`; ``options`` are the constructor options of
    :func:`make_optimizer` (those that do not change the state are accepted
    and ignored). Assumes every trainable parameter receives a gradient: a
    parameter that the loss does not reach gets no state.
    """
    name = _check_optimizer_name(optimizer)
    resolved = _resolve_options(name, options)
    parameters = _trainable_parameters(model)
    if name == "sgd":
        return sum(_sgd_state_bytes(p, **resolved) for p in parameters)
    if name in ("adam", "adamw"):
        return sum(_adam_state_bytes(p, **resolved) for p in parameters)
    if name == "adafactor":
        return sum(_transformers_adafactor_state_bytes(p, **resolved) for p in parameters)
    if name == "torch_adafactor":
        return sum(_torch_adafactor_state_bytes(p) for p in parameters)
    return _bitsandbytes_state_bytes(parameters, **resolved)


def _nbytes(num_elements: int, dtype: torch.dtype) -> int:
    return num_elements * dtype.itemsize


def _sgd_state_bytes(p: torch.Tensor, momentum: float) -> int:
    # Without momentum SGD stores nothing; with it, one buffer like the gradient.
    return _nbytes(p.numel(), p.dtype) if momentum != 0 else 0


def _scalar_dtype(fused: bool | None = None) -> torch.dtype:
    """Return the dtype torch.optim gives its 0-d ``step`` tensors (its ``_get_scalar_dtype``)."""
    if fused:
        return torch.float32
    # `capturable` and `foreach` only move `step` to the parameter's device; its dtype
    # follows the default dtype, fp64 only when that is fp64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_state_bytes(p: torch.Tensor, amsgrad: bool, fused: bool | None) -> int:
    moments = 3 if amsgrad else 2  # exp_avg, exp_avg_sq (and max_exp_avg_sq), like the parameter
    return moments * _nbytes(p.numel(), p.dtype) + _scalar_dtype(fused).itemsize


def _transformers_adafactor_state_bytes(p: torch.Tensor, beta1: float | None) -> int:
    # Statistics are computed from the gradient upcast to fp32 when it is fp16/bf16.
    dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    shape = p.shape
    if len(shape) >= 2:
        # Factored second moment: one value per row, one per column (leading dims kept).
        elements = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        elements = p.numel()  # full exp_avg_sq for vectors and scalars
    if beta1 is not None:
        elements += p.numel()  # exp_avg, the first moment
    # `RMS` is a 0-d tensor computed from the parameter in fp32 (or its own dtype
    # if wider); `step` is a Python int and holds no tensor memory.
    return _nbytes(elements, dtype) + dtype.itemsize


def _torch_adafactor_state_bytes(p: torch.Tensor) -> int:
    shape = p.shape
    if len(shape) > 1:
        # row_var keeps the shape with its last dim set to 1, col_var with its second-to-last dim set to 1.
        elements = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        elements = p.numel()  # variance, like the parameter
    return _nbytes(elements, p.dtype) + _scalar_dtype().itemsize


def _bitsandbytes_state_bytes(parameters: list[torch.Tensor], min_8bit_size: int) -> int:
    total = 0
    any_8bit = False
    for p in parameters:
        n = p.numel()
        if n < min_8bit_size:
            total += 2 * _nbytes(n, torch.float32)  # state1 and state2 stay fp32 for small tensors
        else:
            any_8bit = True
            blocks = math.ceil(n / _BNB_BLOCK_SIZE)
            total += 2 * (n + blocks * _FP32_BYTES)  # uint8 state1/state2 plus fp32 absmax1/absmax2
    if any_8bit:
        total += 2 * _BNB_QMAP_ENTRIES * _FP32_BYTES  # qmap1 and qmap2, shared by every 8-bit tensor
    return total


# --------------------------------------------------------------------------- the real optimizers


def make_optimizer(name: str, params: Iterable[torch.Tensor], **options: object) -> torch.optim.Optimizer:
    """Return the optimizer called ``name`` (see :data:`SUPPORTED_OPTIMIZERS`) over ``params``.

    ``options`` go to its constructor: torch.optim's SGD, Adam, AdamW and
    Adafactor (``"torch_adafactor"``), transformers' Adafactor
    (``"adafactor"``), bitsandbytes' Adam8bit and AdamW8bit.
    """
    name = _check_optimizer_name(name)
    _resolve_options(name, options)
    if name == "sgd":
        return torch.optim.SGD(params, **options)
    if name == "adam":
        return torch.optim.Adam(params, **options)
    if name == "adamw":
        return torch.optim.AdamW(params, **options)
    if name == "torch_adafactor":
        return torch.optim.Adafactor(params, **options)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, **options)
    bnb_optim = _import_bitsandbytes_optim()
    optimizer_class = bnb_optim.Adam8bit if name == "adam8bit" else bnb_optim.AdamW8bit
    return optimizer_class(params, **options)


def _import_bitsandbytes_optim():
    """Import and return ``bitsandbytes.optim``, without its two harmless import-time messages."""
    # On CPUs with AVX512-BF16, importing bitsandbytes logs a warning that the optional
    # `kernels` package (a faster 4-bit matmul) is missing; the 8-bit optimizers do not use it.
    cpu_ops_logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    previous_level = cpu_ops_logger.level
    cpu_ops_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            # Its torch.compile decorators import torch's mkldnn helpers, which use a
            # deprecated TorchScript decorator: torch's own business, nothing to act on.
            warnings.filterwarnings("ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning)
            import bitsandbytes.optim
    finally:
        cpu_ops_logger.setLevel(previous_level)
    return bitsandbytes.optim


# --------------------------------------------------------------------------- measurement


def _state_storages(optimizer: object):
    """Yield ``(state name, tensor)`` for each distinct storage held in ``optimizer.state``, first holder wins."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    seen: set[tuple[torch.device, int]] = set()
    for per_parameter in optimizer.state.values():
        for state_name, value in per_parameter.items():
            # Python numbers (bitsandbytes' and transformers' `step`) hold no tensor memory.
            if not isinstance(value, torch.Tensor):
                continue
            storage = value.untyped_storage()
            # Tensors can share a storage (bitsandbytes' qmap tables): count it once.
            key = (value.device, storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            yield state_name, value


def measure_optimizer_state(optimizer: torch.optim.Optimizer) -> int:
    """Return the bytes held by the tensors in ``optimizer.state``, each storage counted once."""
    return sum(tensor.untyped_storage().nbytes() for _, tensor in _state_storages(optimizer))


def count_optimizer_state_elements(optimizer: torch.optim.Optimizer) -> int:
    """Return the number of elements (not bytes) held in ``optimizer.state``, each storage counted once."""
    return sum(tensor.untyped_storage().nbytes() // tensor.element_size() for _, tensor in _state_storages(optimizer))


def describe_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, dict[str, object]]:
    """Return, per state name (``"exp_avg"``, ``"qmap1"``...), what ``optimizer`` holds under it.

    Each value is ``{"dtype": str, "tensors": int, "elements": int, "bytes": int}``;
    ``dtype`` lists every dtype seen, e.g. ``"float32, uint8"``. A storage shared
    by several tensors is counted once, under the first name that holds it.
    Summing ``"bytes"`` gives :func:`measure_optimizer_state`.
    """
    rows: dict[str, dict[str, object]] = {}
    dtypes: dict[str, set[str]] = {}
    for state_name, tensor in _state_storages(optimizer):
        row = rows.setdefault(state_name, {"dtype": "", "tensors": 0, "elements": 0, "bytes": 0})
        nbytes = tensor.untyped_storage().nbytes()
        row["tensors"] += 1
        row["elements"] += nbytes // tensor.element_size()
        row["bytes"] += nbytes
        dtypes.setdefault(state_name, set()).add(str(tensor.dtype).removeprefix("torch."))
    for state_name, row in rows.items():
        row["dtype"] = ", ".join(sorted(dtypes[state_name]))
    return rows
