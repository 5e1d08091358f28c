"""Shape rules: matrix products at the sizes the hardware likes, and arithmetic intensity (lesson 8).

A matrix product of an (m, k) matrix by a (k, n) one does 2 m k n FLOPs and
moves at least (m k + k n + m n) elements: their ratio, the *arithmetic
intensity* (:func:`arithmetic_intensity`), says whether the product can keep
the arithmetic units busy or waits on memory. Few rows (a small micro-batch of
tokens) means low intensity. GPUs add an alignment rule: tensor cores work on
tiles, and NVIDIA's "Matrix Multiplication Background User's Guide"
(https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html)
asks for dimensions that are multiples of 8 (fp16/bf16; 16 bytes) and, for the
best tiles, of 64 or more; a vocabulary is padded up to such a multiple
(:func:`padded_to_multiple`: nanoGPT's 50,257 tokens become 50,304, a multiple of 64).
:func:`time_matmuls` measures what a CPU makes of it: its figures are this machine's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_utils.speed import Timing, compare, time_interleaved
from course_utils.validation import check_instance, check_positive_int, is_integer

__all__ = ["padded_to_multiple", "arithmetic_intensity", "matmul_flops", "time_matmuls", "gflops", "describe_shape_pair"]


def padded_to_multiple(size: int, multiple: int) -> int:
    """Return the smallest multiple of ``multiple`` that is at least ``size`` (a vocabulary padded for the hardware)."""
    check_positive_int(size, "size")
    check_positive_int(multiple, "multiple")
    return -(-size // multiple) * multiple


def _check_shape(shape: object, name: str = "shape") -> tuple[int, int, int]:
    if not isinstance(shape, tuple) or len(shape) != 3 or not all(is_integer(d) and d >= 1 for d in shape):
        raise ValueError(f"{name} must be a tuple (m, k, n) of three positive ints, got {shape!r}")
    return shape


def matmul_flops(shape: tuple[int, int, int]) -> int:
    """Return the FLOPs of an (m, k) x (k, n) matrix product: 2 m k n (a multiply and an add per term)."""
    m, k, n = _check_shape(shape)
    return 2 * m * k * n


def arithmetic_intensity(shape: tuple[int, int, int], bytes_per_element: int = 4) -> float:
    """Return FLOPs per byte of an (m, k) x (k, n) product that reads both inputs and writes the output once."""
    m, k, n = _check_shape(shape)
    check_positive_int(bytes_per_element, "bytes_per_element")
    return 2 * m * k * n / (bytes_per_element * (m * k + k * n + m * n))


def time_matmuls(shapes: Sequence[tuple[int, int, int]], repeats: int = 7, flops_per_call: float = 2e8,
                 dtype: torch.dtype = torch.float32) -> dict[tuple[int, int, int], Timing]:
    """Time a matrix product of each shape, in turns; return each shape's :class:`Timing` of ONE product.

    A small product takes microseconds, below what one clock reading
    resolves well, so each timed call runs enough products to do about
    ``flops_per_call`` FLOPs, and the times are divided by their number.
    """
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise ValueError(f"shapes must be a non-empty list of (m, k, n) tuples, got {shapes!r}")
    for shape in shapes:
        _check_shape(shape, "each of shapes")
    check_positive_int(repeats, "repeats")
    if not isinstance(flops_per_call, (int, float)) or not flops_per_call > 0:
        raise ValueError(f"flops_per_call must be a positive number, got {flops_per_call!r}")
    check_instance(dtype, "dtype", torch.dtype, "a torch.dtype")
    generator = torch.Generator().manual_seed(0)
    calls, operands = {}, {}
    for m, k, n in shapes:
        operands[(m, k, n)] = (torch.randn(m, k, generator=generator).to(dtype),
                               torch.randn(k, n, generator=generator).to(dtype))
        calls[(m, k, n)] = max(1, round(flops_per_call / matmul_flops((m, k, n))))

    def run(shape):
        a, b = operands[shape]
        for _ in range(calls[shape]):
            torch.mm(a, b)

    timings = time_interleaved({str(shape): (lambda shape=shape: run(shape)) for shape in operands}, repeats=repeats)
    return {shape: Timing(tuple(s / calls[shape] for s in timings[str(shape)].seconds)) for shape in operands}


def gflops(shape: tuple[int, int, int], timing: Timing) -> tuple[float, float, float]:
    """Return GFLOP/s of one product of ``shape`` timed by ``timing``: (median, slowest run, fastest run)."""
    check_instance(timing, "timing", Timing, "a Timing")
    return tuple(rate / 1e9 for rate in timing.rate(matmul_flops(shape)))


def describe_shape_pair(name_a: str, shape_a: tuple[int, int, int], timing_a: Timing,
                        name_b: str, shape_b: tuple[int, int, int], timing_b: Timing) -> str:
    """Return the verdict on two shapes' speed per FLOP (their products do different work), from the measured spread."""
    check_instance(timing_a, "timing_a", Timing, "a Timing")
    check_instance(timing_b, "timing_b", Timing, "a Timing")
    per_flop_a = Timing(tuple(s / matmul_flops(shape_a) for s in timing_a.seconds))
    per_flop_b = Timing(tuple(s / matmul_flops(shape_b) for s in timing_b.seconds))
    verdict = compare(name_a, per_flop_a, name_b, per_flop_b)
    if not verdict.measurable:
        return f"per FLOP, {verdict.sentence()}: this CPU shows no measurable preference between the two"
    return f"per FLOP, {verdict.sentence()}"
