"""The buffers a CPU kernel allocates and frees inside itself, which no tracker sees (used by ``_step_tracker``; lesson 4).

A dispatch-mode tracker (MemTracker, the course's StepTracker) sees each
operation's inputs and outputs, never what its kernel allocates for a moment
inside and frees before it returns. Most CPU kernels allocate only their
outputs. Some do not, on torch 2.13's CPU build:

- convolutions and their backward (oneDNN's reordered weights and scratchpad,
  or the im2col columns of the slow path): a few times the weight's bytes;
- batch norm's backward (its per-channel sums for the input's gradient);
- matrix products in 16 bits (oneDNN packs a bf16 operand before
  multiplying): on fp32 the same products allocate nothing extra.

:func:`rise_inside` measures it the only way that is exact: the real kernel
runs once on real tensors of the same shapes, strides and dtypes, and the CPU
allocator's record (``allocator_record``) says how far its total rose. The
answer depends on shapes (and the number of threads, which oneDNN sizes its
scratchpad by), not on values, so it is cached per signature. The tracker runs
the same probe on a real step as on the planner's fake one, so the plan and the
measurement both count the buffer, as the allocator does.

A kernel whose inputs take more than :data:`PROBE_LIMIT` bytes is not probed
(the probe would cost what the step costs: a 7B model's bf16 products): its
buffer is left out of both plan and measurement. That is where the planner and
the allocator may still differ, by one kernel's buffer: at most a few times the
largest such operand (``tests/memory/test_kernel_buffers.py`` shows it).
"""

from __future__ import annotations

import torch

from course_utils.memory.allocator_record import recording_allocator
from course_utils.units import MIB

__all__ = ["PROBE_LIMIT", "probed", "rise_inside"]

PROBE_LIMIT = 16 * MIB

_aten = torch.ops.aten
# Kernels that allocate buffers of their own whatever the dtype.
_WITH_BUFFERS = {
    _aten.convolution.default,
    _aten.convolution_backward.default,
    _aten.native_batch_norm_backward.default,
}
# Kernels that allocate buffers of their own in 16 bits only (oneDNN packs their operands).
_WITH_BUFFERS_IN_16_BITS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}
_SIXTEEN_BITS = (torch.bfloat16, torch.float16)
_rises: dict = {}


def probed(func, args) -> bool:
    """Return whether ``func`` on ``args`` is a CPU kernel that allocates buffers of its own (see the module)."""
    if func in _WITH_BUFFERS:
        return _on_cpu(args)
    if func in _WITH_BUFFERS_IN_16_BITS:
        return _on_cpu(args) and any(isinstance(a, torch.Tensor) and a.dtype in _SIXTEEN_BITS for a in args)
    return False


def _on_cpu(args) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


def rise_inside(func, args, kwargs=None) -> int:
    """Return how far the CPU allocator's total rises above its start while ``func`` runs on ``args``, outputs included (bytes).

    ``args`` may be real or fake tensors: only their shapes, strides and dtypes
    are read. 0 when the inputs take more than :data:`PROBE_LIMIT` bytes, or
    when the allocator is being recorded already (a probe would show in that
    record, and torch's profiler does not nest).
    """
    kwargs = kwargs or {}
    key = (func, torch.get_num_threads(), _signature(args), _signature(tuple(sorted(kwargs.items()))))
    if key not in _rises:
        _rises[key] = _probe(func, args, kwargs)
    return _rises[key]


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    return value


def _probe(func, args, kwargs) -> int:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if sum(t.untyped_storage().nbytes() for t in tensors) > PROBE_LIMIT or torch.autograd.profiler._is_profiler_enabled:
        return 0
    with unset_fake_temporarily(), _disable_current_modes(), torch.no_grad():
        real_args = [_real_twin(a) for a in args]
        real_kwargs = {k: _real_twin(v) for k, v in kwargs.items()}
        with recording_allocator() as record:
            outputs = func(*real_args, **real_kwargs)
        del outputs
    return record.rise


def _real_twin(value):
    """Return a real CPU tensor of ``value``'s shape, strides and dtype (zeros), or ``value`` if it is not a tensor."""
    if not isinstance(value, torch.Tensor):
        return value
    twin = torch.zeros(value.untyped_storage().nbytes() // value.element_size(), dtype=value.dtype)
    return twin.as_strided(value.shape, value.stride(), value.storage_offset())
