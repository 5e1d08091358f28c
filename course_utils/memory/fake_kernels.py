"""Where torch's fake kernel of an operation differs from its CPU kernel: the CPU's answer, for the planner (lesson 4).

The planner follows a step on fake tensors, whose operations run torch's
"meta" kernels: shapes and dtypes, no data. A meta kernel written for one
device's rules can differ from another device's real kernel. Two do, on torch 2.13:

- ``aten._grouped_mm`` (the grouped matrix product transformers' 5
  mixture-of-experts layers call, one group of tokens per expert) checks CUDA's
  rule, bf16 inputs only, while the CPU kernel multiplies fp32 too. So a
  Mixtral or Qwen3-MoE with fp32 weights (fp32 training, or bf16 autocast,
  which does not cast this operation) runs for real and is refused on fake
  tensors. Answered as the CPU kernel does: a new contiguous output of the
  shape and dtype the meta kernel computes.
- ``aten.native_layer_norm`` and ``aten.native_group_norm`` fed bf16 with fp32
  weights (under bf16 autocast, a norm right after a linear layer or a
  convolution: ELECTRA's projected embeddings, wav2vec 2.0's feature encoder)
  save their mean and reciprocal standard deviation for the backward pass in
  fp32 on the CPU (its mixed-dtype kernel), in bf16 in the meta kernel: 4
  bytes instead of 2 per row normalised. Answered with fp32 statistics.
- ``aten.native_layer_norm_backward`` given a gradient that is not contiguous
  (Swin's pooled output: a transposed view) returns, in the meta kernel, an
  input gradient with the same strides, and the CPU kernel a contiguous one.
  The next operation that reshapes it copies the meta one (a ``clone`` the
  real step never makes: 4,096 bytes more at a small Swin's peak). Answered
  with a contiguous gradient.

Recheck after upgrading torch (``pytest tests/memory/test_planner_families.py``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CpuKernels", "cpu_kernels_for"]


class CpuKernels(TorchDispatchMode):
    """Within it, on fake CPU tensors, ``_grouped_mm`` and the norms give their outputs as the CPU kernels do (see the module)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16 and args[0].device.type == "cpu":
            from torch._meta_registrations import _create_grouped_mm_output_tensor

            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
            # The meta kernel's own output, without its bf16-only check (CUDA's rule, not the CPU's).
            return _create_grouped_mm_output_tensor(args[0], args[1], offs, out_dtype)
        outputs = func(*args, **kwargs)
        if func is _LAYER_NORM_BACKWARD and outputs[0] is not None and not outputs[0].is_contiguous():
            # The CPU kernel makes the gradient contiguous before it computes the input's gradient.
            return (torch.empty(outputs[0].shape, dtype=outputs[0].dtype, device=outputs[0].device), *outputs[1:])
        if func in _NORMS and _mixed_on_cpu(args[0], args[1:3]):
            # The CPU's mixed-dtype kernel keeps its statistics in fp32.
            output, mean, rstd = outputs
            return output, torch.empty_like(mean, dtype=torch.float32), torch.empty_like(rstd, dtype=torch.float32)
        return outputs


_NORMS = (torch.ops.aten.native_layer_norm.default, torch.ops.aten.native_group_norm.default)
_LAYER_NORM_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


def _mixed_on_cpu(values: torch.Tensor, parameters) -> bool:
    """Return whether a norm's input is in 16 bits and its weight or bias in fp32, on the CPU."""
    return (values.device.type == "cpu" and values.dtype in (torch.bfloat16, torch.float16)
            and any(isinstance(p, torch.Tensor) and p.dtype == torch.float32 for p in parameters))


def cpu_kernels_for(model: torch.nn.Module, mixed_precision: str = "no") -> contextlib.AbstractContextManager:
    """Return :class:`CpuKernels` where ``model``'s step may meet one of these operations, else a no-op context.

    That is: 3-D floating weights not in bf16 (grouped experts), 16-bit
    activations meeting fp32 weights (autocast, or parameters of mixed
    dtypes), or a layer norm in a vision model (whose gradient may come
    through a transposed view). A dispatch mode costs a little on every
    operation: other steps do without it.
    """
    parameters = [p for p in model.parameters() if p.is_floating_point()]
    grouped = any(p.dim() == 3 and p.dtype != torch.bfloat16 for p in parameters)
    mixed = mixed_precision != "no" or len({p.dtype for p in parameters}) > 1
    transposed_norm = getattr(model, "main_input_name", "") == "pixel_values" and any(
        isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    return CpuKernels() if grouped or mixed or transposed_norm else contextlib.nullcontext()
