"""How memory-efficient optimizers shrink their state, written from scratch (lesson 3).

Two tricks, each small enough to read in one pass:

- **Block-wise 8-bit quantisation**, what 8-bit Adam does to its two moving
  averages: cut the tensor into blocks of 256 elements, keep one fp32 scale per
  block (the block's largest magnitude, its *absmax*) and store every element
  as an 8-bit code. :func:`quantize_blockwise` / :func:`dequantize_blockwise`
  use a *linear* code (127 evenly spaced levels each side of zero);
  bitsandbytes uses a non-linear "dynamic" code with more levels near zero.
- **Adafactor's factored second moment**: for an ``n x m`` matrix keep the
  ``n`` row means and ``m`` column means of the squared gradients instead of
  all ``n * m`` of them, and rebuild a rank-1 estimate when it is needed
  (:func:`factor_second_moment`, :func:`reconstruct_second_moment`).

What these savings cost in the update is measured in ``course_utils.fidelity``.

Nothing here imports bitsandbytes; the lesson imports it where it is used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils.validation import check_finite_tensor, check_non_negative_int, check_positive_int

__all__ = [
    "BITSANDBYTES_BLOCK_SIZE",
    "BITSANDBYTES_MIN_8BIT_SIZE",
    "BlockwiseQuantized",
    "quantize_blockwise",
    "dequantize_blockwise",
    "eight_bit_state_bytes",
    "factor_second_moment",
    "reconstruct_second_moment",
    "factored_state_elements",
]

# bitsandbytes' 8-bit optimizers quantise their states in blocks of 256 elements...
BITSANDBYTES_BLOCK_SIZE = 256
# ...and keep plain fp32 states for tensors with fewer elements than this
# (``min_8bit_size``): for biases and LayerNorm weights the scales and lookup
# tables would cost more than they save.
BITSANDBYTES_MIN_8BIT_SIZE = 4096

# A linear signed 8-bit code uses the levels -127..127 (-128 is left out so
# that the code is symmetric and 0 is exact).
_LINEAR_LEVELS = 127


# --------------------------------------------------------------------------- block-wise quantisation


@dataclass(frozen=True)
class BlockwiseQuantized:
    """A tensor stored as 8-bit codes plus one fp32 scale per block.

    ``codes`` is a flat int8 tensor with one code per element (``shape``'s
    element count); ``absmax`` is a flat fp32 tensor with one scale per block
    of ``block_size`` elements (the last block may be shorter).
    """

    codes: torch.Tensor
    absmax: torch.Tensor
    shape: torch.Size
    block_size: int

    @property
    def nbytes(self) -> int:
        """Bytes held: one per code plus four per block scale."""
        return self.codes.numel() * self.codes.element_size() + self.absmax.numel() * self.absmax.element_size()


def quantize_blockwise(tensor: torch.Tensor, block_size: int = BITSANDBYTES_BLOCK_SIZE) -> BlockwiseQuantized:
    """Return ``tensor`` quantised block by block to linear int8 codes with an fp32 absmax per block.

    Within each block, the element ``x`` becomes ``round(127 * x / absmax)``,
    where ``absmax`` is the block's largest magnitude. A block of zeros keeps
    absmax 0 and codes 0.
    """
    _check_tensor(tensor, "tensor")
    if not tensor.is_floating_point():
        raise TypeError(f"tensor must hold floating-point values, got dtype {tensor.dtype}")
    check_finite_tensor(tensor, "tensor")  # an inf absmax would turn its whole block into NaN
    check_positive_int(block_size, "block_size")
    blocks, _ = _as_blocks(tensor.detach().float().flatten(), block_size)
    absmax = blocks.abs().amax(dim=1)
    # A block of zeros would divide by 0; any scale maps its zeros to code 0.
    safe_absmax = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    codes = torch.round(blocks / safe_absmax[:, None] * _LINEAR_LEVELS).to(torch.int8)
    return BlockwiseQuantized(
        codes=codes.flatten()[: tensor.numel()].clone(),
        absmax=absmax,
        shape=tensor.shape,
        block_size=block_size,
    )


def dequantize_blockwise(quantized: BlockwiseQuantized) -> torch.Tensor:
    """Return the fp32 tensor that ``quantized`` stands for, in its original shape: ``code / 127 * absmax``."""
    if not isinstance(quantized, BlockwiseQuantized):
        raise TypeError(f"quantized must be a BlockwiseQuantized (from quantize_blockwise), got {type(quantized).__name__}")
    blocks, _ = _as_blocks(quantized.codes.float(), quantized.block_size)
    values = blocks / _LINEAR_LEVELS * quantized.absmax[:, None]
    return values.flatten()[: quantized.codes.numel()].reshape(quantized.shape)


def eight_bit_state_bytes(
    num_elements: int,
    block_size: int = BITSANDBYTES_BLOCK_SIZE,
    min_8bit_size: int = BITSANDBYTES_MIN_8BIT_SIZE,
) -> int:
    """Return the bytes of ONE 8-bit optimizer state for a tensor of ``num_elements`` elements.

    At least ``min_8bit_size`` elements: one byte per element plus a 4-byte
    fp32 absmax per block of ``block_size`` (the last block may be partial).
    Fewer: the state stays fp32, four bytes per element. (bitsandbytes also
    keeps two 256-entry lookup tables, shared by every tensor; not counted here.)
    """
    check_non_negative_int(num_elements, "num_elements")
    check_positive_int(block_size, "block_size")
    check_non_negative_int(min_8bit_size, "min_8bit_size")
    if num_elements < min_8bit_size:
        return 4 * num_elements
    return num_elements + 4 * math.ceil(num_elements / block_size)


def _as_blocks(flat: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
    """Return ``flat`` zero-padded to whole blocks and viewed as (num_blocks, block_size), and the padding."""
    padding = (-flat.numel()) % block_size
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return flat.view(-1, block_size), padding


# --------------------------------------------------------------------------- Adafactor's factored second moment


def factor_second_moment(squared: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(row_means, col_means)`` of a non-negative matrix (or a stack of matrices).

    For an ``n x m`` matrix these are ``n`` and ``m`` numbers: all that
    Adafactor keeps of its squared-gradient moving average. Leading dimensions
    (a stack of matrices) are kept: shape ``(..., n)`` and ``(..., m)``.
    """
    _check_tensor(squared, "squared")
    if squared.dim() < 2:
        raise ValueError(f"squared must have at least 2 dimensions (a matrix), got shape {tuple(squared.shape)}")
    check_finite_tensor(squared, "squared")
    if bool((squared < 0).any()):
        raise ValueError("squared must be non-negative (squared gradients or their average)")
    return squared.mean(dim=-1), squared.mean(dim=-2)


def reconstruct_second_moment(row_means: torch.Tensor, col_means: torch.Tensor) -> torch.Tensor:
    """Return the rank-1 estimate ``V[i, j] = row_means[i] * col_means[j] / mean(row_means)``.

    It has the right row means and column means, and it is exact whenever the
    matrix it stands for is itself rank 1 (``V[i, j] = a[i] * b[j]``).
    """
    for name, means in (("row_means", row_means), ("col_means", col_means)):
        _check_tensor(means, name)
        check_finite_tensor(means, name)
        if bool((means < 0).any()):
            raise ValueError(f"{name} must be non-negative (means of squared gradients)")
    if row_means.dim() < 1 or col_means.dim() < 1 or row_means.shape[:-1] != col_means.shape[:-1]:
        raise ValueError(
            "row_means and col_means must be shaped (..., n) and (..., m) with the same leading dimensions, "
            f"got {tuple(row_means.shape)} and {tuple(col_means.shape)}"
        )
    # The mean of the row means is the mean of the whole matrix.
    overall_mean = row_means.mean(dim=-1, keepdim=True).clamp(min=torch.finfo(row_means.dtype).tiny)
    return (row_means / overall_mean).unsqueeze(-1) * col_means.unsqueeze(-2)


def factored_state_elements(shape: Sequence[int]) -> int:
    """Return how many numbers Adafactor's second moment keeps for a parameter of ``shape``.

    A matrix ``n x m`` keeps ``n + m`` (row and column statistics); a stack of
    matrices ``(..., n, m)`` keeps ``n + m`` per matrix; a vector (or a scalar)
    keeps one number per element, because there is nothing to factor.
    """
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape
    ):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    if len(shape) < 2:
        return math.prod(shape)
    *stack, rows, cols = shape
    return math.prod(stack) * (rows + cols)


# --------------------------------------------------------------------------- argument checks


def _check_tensor(value: object, name: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no values")
