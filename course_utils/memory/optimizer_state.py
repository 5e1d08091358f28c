"""The memory an optimizer keeps between steps: estimated exactly from parameter shapes, and measured (lesson 2-3).

Lesson 2 compares optimizers by the state they keep (Adam's two moments,
Adafactor's factored statistics, bitsandbytes' 8-bit states).

- :func:`estimate_optimizer_state` predicts, from parameter shapes and dtypes
  alone, the bytes an optimizer holds after its first ``step()``. It works on a
  model built on the meta device, so a 7B-parameter model costs nothing.
- :func:`measure_optimizer_state`, :func:`count_optimizer_state_elements` and
  :func:`describe_optimizer_state` read what a real optimizer holds.

Optimizer names and options are those of :func:`course_utils.optimizers.make_optimizer`.
All sizes are in bytes.
"""

from __future__ import annotations

import math

import torch

from course_utils.optimizers import STATE_OPTIONS, SUPPORTED_OPTIMIZERS, check_optimizer_name, resolve_options
from course_utils.validation import check_instance

__all__ = [
    "SUPPORTED_OPTIMIZERS",
    "ESTIMATED_OPTIMIZERS",
    "estimate_optimizer_state",
    "measure_optimizer_state",
    "count_optimizer_state_elements",
    "describe_optimizer_state",
]

# The optimizers whose state estimate_optimizer_state computes from shapes; the state
# of the others in SUPPORTED_OPTIMIZERS is followed by the planner.
ESTIMATED_OPTIMIZERS: tuple[str, ...] = tuple(STATE_OPTIONS)

# bitsandbytes' 8-bit states: one absmax scale per block of 256 elements, and a
# 256-entry fp32 table (one entry per uint8 code) per state, shared by all tensors.
_BNB_BLOCK_SIZE = 256
_BNB_QMAP_ENTRIES = 256
_FP32_BYTES = 4


def _trainable_parameters(model: object) -> list[torch.nn.Parameter]:
    """Return the parameters an optimizer would keep state for: trainable, each tied tensor once."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
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
    name = check_optimizer_name(optimizer)
    if name not in STATE_OPTIONS:
        raise ValueError(
            f"estimate_optimizer_state has formulas for {', '.join(ESTIMATED_OPTIMIZERS)}; the state of {name!r} is "
            f"followed, with the whole step, by course_utils.memory.estimate_training_memory"
        )
    resolved = resolve_options(name, options)
    return _state_bytes(_trainable_parameters(model), name, resolved)


def _state_bytes(parameters: list[torch.Tensor], name: str, resolved: dict[str, object]) -> int:
    """Return the optimizer state bytes for ``parameters`` (each one gets a gradient), options resolved."""
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
    """Return the bytes of ``num_elements`` elements of ``dtype``."""
    return num_elements * dtype.itemsize


def _sgd_state_bytes(p: torch.Tensor, momentum: float) -> int:
    """Return the bytes SGD keeps for ``p``: nothing without momentum, else a buffer like the gradient."""
    return _nbytes(p.numel(), p.dtype) if momentum != 0 else 0


def _scalar_dtype(fused: bool | None = None) -> torch.dtype:
    """Return the dtype torch.optim gives its 0-d ``step`` tensors (its ``_get_scalar_dtype``)."""
    if fused:
        return torch.float32
    # `capturable` and `foreach` only move `step` to the parameter's device; its dtype
    # follows the default dtype, fp64 only when that is fp64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_state_bytes(p: torch.Tensor, amsgrad: bool, fused: bool | None) -> int:
    """Return the bytes Adam and AdamW keep for ``p``: its moments, and a 0-d ``step`` tensor."""
    moments = 3 if amsgrad else 2  # exp_avg, exp_avg_sq (and max_exp_avg_sq), like the parameter
    return moments * _nbytes(p.numel(), p.dtype) + _scalar_dtype(fused).itemsize


def _transformers_adafactor_state_bytes(p: torch.Tensor, beta1: float | None) -> int:
    """Return the bytes transformers' Adafactor keeps for ``p``."""
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
    """Return the bytes torch.optim.Adafactor keeps for ``p``: statistics in the gradient's dtype, and ``step``."""
    shape = p.shape
    if len(shape) > 1:
        # row_var keeps the shape with its last dim set to 1, col_var with its second-to-last dim set to 1.
        elements = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        elements = p.numel()  # variance, like the parameter
    return _nbytes(elements, p.dtype) + _scalar_dtype().itemsize


def _bitsandbytes_state_bytes(parameters: list[torch.Tensor], min_8bit_size: int) -> int:
    """Return the bytes bitsandbytes' Adam8bit or AdamW8bit keeps for all of ``parameters``, shared tables once."""
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


# --------------------------------------------------------------------------- measurement


def _state_storages(optimizer: object):
    """Yield ``(state name, tensor)`` for each distinct storage held in ``optimizer.state``, first holder wins."""
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
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
