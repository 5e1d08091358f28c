"""Where torch's fake kernel of an operation is stricter than its CPU kernel: the CPU's answer, for the planner (lesson 4).

The planner follows a step on fake tensors, whose operations run torch's
"meta" kernels: shapes and dtypes, no data. A meta kernel written for one
device's rules can refuse what another device's real kernel runs. One does, on
torch 2.13: ``aten._grouped_mm`` (the grouped matrix product transformers' 5
mixture-of-experts layers call, one group of tokens per expert) checks CUDA's
rule, bf16 inputs only, while the CPU kernel multiplies fp32 too. So a Mixtral
or Qwen3-MoE with fp32 weights (fp32 training, or bf16 autocast, which does not
cast this operation) runs for real and is refused on fake tensors.

:class:`CpuKernels` answers such an operation as the CPU kernel does: a new
contiguous output of the shape and dtype the meta kernel computes. Recheck
after upgrading torch (``pytest tests/test_planner.py -k experts``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CpuKernels", "cpu_kernels_for"]


class CpuKernels(TorchDispatchMode):
    """Within it, on fake CPU tensors: ``aten._grouped_mm`` of fp32 (or fp16) inputs gives its output as the CPU kernel does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16 and args[0].device.type == "cpu":
            from torch._meta_registrations import _create_grouped_mm_output_tensor

            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
            # The meta kernel's own output, without its bf16-only check (CUDA's rule, not the CPU's).
            return _create_grouped_mm_output_tensor(args[0], args[1], offs, out_dtype)
        return func(*args, **kwargs)


def cpu_kernels_for(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Return :class:`CpuKernels` if ``model`` has 3-D floating weights not in bf16 (grouped experts), else a no-op context.

    A dispatch mode costs a little on every operation: models without such
    weights do without it.
    """
    grouped = any(p.dim() == 3 and p.is_floating_point() and p.dtype != torch.bfloat16 for p in model.parameters())
    return CpuKernels() if grouped else contextlib.nullcontext()
