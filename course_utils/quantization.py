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

And the experiment that measures what these savings cost: record real
gradients once (:func:`record_gradients`), replay exactly the same gradients
through several optimizers (:func:`replay_gradients`) and measure how far each
one's parameter updates land from AdamW's (:func:`relative_distance`).

Nothing here imports bitsandbytes; the lesson imports it where it is used.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

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
    "record_gradients",
    "replay_gradients",
    "relative_distance",
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
    _check_positive_int(block_size, "block_size")
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
    if isinstance(num_elements, bool) or not isinstance(num_elements, int) or num_elements < 0:
        raise ValueError(f"num_elements must be a non-negative int, got {num_elements!r}")
    _check_positive_int(block_size, "block_size")
    if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) or min_8bit_size < 0:
        raise ValueError(f"min_8bit_size must be a non-negative int, got {min_8bit_size!r}")
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
    if bool((squared < 0).any()):
        raise ValueError("squared must be non-negative (squared gradients or their average)")
    return squared.mean(dim=-1), squared.mean(dim=-2)


def reconstruct_second_moment(row_means: torch.Tensor, col_means: torch.Tensor) -> torch.Tensor:
    """Return the rank-1 estimate ``V[i, j] = row_means[i] * col_means[j] / mean(row_means)``.

    It has the right row means and column means, and it is exact whenever the
    matrix it stands for is itself rank 1 (``V[i, j] = a[i] * b[j]``).
    """
    _check_tensor(row_means, "row_means")
    _check_tensor(col_means, "col_means")
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


# --------------------------------------------------------------------------- what the savings cost


def record_gradients(model: torch.nn.Module, batches: Iterable[dict], max_batches: int | None = None) -> list[list[torch.Tensor]]:
    """Return the gradients of ``model``'s loss on each batch, all taken at the model's current weights.

    One list per batch, holding one tensor per trainable parameter in
    ``model.parameters()`` order (a copy, so later steps cannot change it).
    Batches are dicts with ``input_ids``, ``attention_mask`` and ``labels``.
    The model's weights are not changed; its gradients are cleared afterwards.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches must be a positive int or None, got {max_batches!r}")
    parameters = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    # Dropout stays off so that the recorded gradients depend only on the batch.
    model.eval()
    gradients = []
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        gradients.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in parameters])
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    if not gradients:
        raise ValueError("batches is empty: there is no gradient to record")
    return gradients


def replay_gradients(
    model: torch.nn.Module,
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    gradients: Sequence[Sequence[torch.Tensor]],
) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """Return ``(updates, optimizer)``: replay ``gradients`` through a fresh optimizer on a copy of ``model``.

    ``make_optimizer(parameters)`` builds the optimizer on the copy's trainable
    parameters. Each step sets every parameter's ``.grad`` to the recorded
    gradient and calls ``optimizer.step()``, so every optimizer sees exactly the
    same gradients. ``updates`` holds, per parameter, the total change of its
    weights (final minus initial, fp32). ``model`` itself is not changed.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(make_optimizer):
        raise TypeError(f"make_optimizer must be a function parameters -> optimizer, got {type(make_optimizer).__name__}")
    if len(gradients) == 0:
        raise ValueError("gradients is empty: record at least one step with record_gradients")
    replica = copy.deepcopy(model)
    parameters = [p for p in replica.parameters() if p.requires_grad]
    for step, step_gradients in enumerate(gradients):
        if len(step_gradients) != len(parameters):
            raise ValueError(
                f"gradients[{step}] has {len(step_gradients)} tensors but the model has {len(parameters)} trainable parameters"
            )
    initial = [p.detach().float().clone() for p in parameters]
    optimizer = make_optimizer(parameters)
    for step_gradients in gradients:
        for parameter, gradient in zip(parameters, step_gradients):
            parameter.grad = gradient.to(parameter.dtype).clone()
        optimizer.step()
    updates = [p.detach().float() - start for p, start in zip(parameters, initial)]
    return updates, optimizer


def relative_distance(updates: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """Return ``||updates - reference|| / ||reference||`` over all tensors together (0 means identical).

    Both are lists of tensors of matching shapes (e.g. from :func:`replay_gradients`);
    the norm is the Euclidean norm of everything concatenated.
    """
    if len(updates) != len(reference) or len(reference) == 0:
        raise ValueError(f"updates and reference must be non-empty lists of equal length, got {len(updates)} and {len(reference)}")
    difference_squared, reference_squared = 0.0, 0.0
    for index, (update, ref) in enumerate(zip(updates, reference)):
        if update.shape != ref.shape:
            raise ValueError(f"updates[{index}] has shape {tuple(update.shape)} but reference[{index}] has {tuple(ref.shape)}")
        difference_squared += (update.double() - ref.double()).square().sum().item()
        reference_squared += ref.double().square().sum().item()
    if reference_squared == 0:
        raise ValueError("reference is all zeros: a distance relative to it is undefined")
    return math.sqrt(difference_squared / reference_squared)


# --------------------------------------------------------------------------- argument checks


def _check_tensor(value: object, name: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has no values")


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
