"""How fast a training step runs: timings with their spread, FLOPs per token, the matmul peak and MFU (lesson 8),
and one optimizer step timed with its spread (lesson 5: :func:`time_optimizer_step`, :func:`describe_timing`).

A speed figure is only as good as its measurement, so every timing here is a
:class:`Timing`: several repeats after warm-up calls that are not counted, with
the median and the spread. Comparisons (:func:`compare`) say "no measurable
difference" when the spreads overlap.

Utilisation follows nanoGPT's ``estimate_mfu`` (https://github.com/karpathy/nanoGPT/blob/master/model.py)
and the PaLM paper's appendix B (https://arxiv.org/abs/2204.02311): a training
step does about 6 FLOPs per weight of the matrix multiplications per token
(2 forward, 4 backward), plus 12 x layers x sequence length x width per token
for the attention scores and their weighted sum. Model FLOPs utilisation (MFU)
is the FLOPs per second that implies, divided by the peak the hardware can do:
here, this machine's own measured matrix multiplication.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from course_utils.validation import (
    check_finite_numbers, check_instance, check_non_negative_int, check_positive_int, check_positive_number,
)

__all__ = [
    "Timing",
    "time_call",
    "time_interleaved",
    "Comparison",
    "compare",
    "matmul_weights",
    "model_shape",
    "flops_per_token",
    "model_flops_per_token",
    "measure_matmul_peak",
    "mfu",
    "time_optimizer_step",
    "describe_timing",
]

MFU_BOUND = 10
"""The most utilisation :func:`mfu` accepts. A step does no more FLOP/s than the peak; the bound leaves room for a
peak measured while the machine was busier than during the step, and for FLOPs the formula overcounts. A peak
given in kFLOP/s, GFLOP/s or TFLOP/s instead of FLOP/s makes the utilisation 10^3 to 10^12 times too high."""


@dataclass(frozen=True)
class Timing:
    """Seconds taken by each measured repeat of one call (warm-up calls excluded)."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        check_finite_numbers(self.seconds, "seconds", non_negative=True)

    @property
    def median(self) -> float:
        """The median time of one call, in seconds."""
        return statistics.median(self.seconds)

    @property
    def minimum(self) -> float:
        """The fastest call, in seconds."""
        return min(self.seconds)

    @property
    def maximum(self) -> float:
        """The slowest call, in seconds."""
        return max(self.seconds)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The first and third quartiles of the calls' times, in seconds (both the one time for one repeat)."""
        if len(self.seconds) == 1:
            return self.seconds[0], self.seconds[0]
        q1, _, q3 = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return q1, q3

    def rate(self, amount: float) -> tuple[float, float, float]:
        """Return ``amount`` per second (e.g. tokens/s) as (median, slowest, fastest) over the repeats."""
        check_positive_number(amount, "amount")
        return amount / self.median, amount / self.maximum, amount / max(self.minimum, 1e-12)

    def describe(self, scale: float = 1e3, unit: str = "ms") -> str:
        """Return "median (min-max) unit over N runs", times multiplied by ``scale`` (1e3: milliseconds)."""
        return (f"{self.median * scale:,.1f} {unit} (min {self.minimum * scale:,.1f}, max {self.maximum * scale:,.1f}, "
                f"{len(self.seconds)} runs)")


def time_call(function: Callable[[], object], repeats: int = 7, warmup: int = 1) -> Timing:
    """Call ``function()`` ``warmup`` times untimed, then ``repeats`` times; return the :class:`Timing` of those.

    The warm-up calls are where first-call costs land (memory the allocator
    grows once, lazily initialised kernels, a compilation), which a training
    loop pays once and a measurement of its steady state must leave out.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    check_positive_int(repeats, "repeats")
    check_non_negative_int(warmup, "warmup")
    for _ in range(warmup):
        function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return Timing(tuple(seconds))


def time_interleaved(functions: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                     desc: str | None = None) -> dict[str, Timing]:
    """Time several set-ups in turns: each function once per round, ``repeats`` rounds after ``warmup`` untimed ones.

    Returns a :class:`Timing` per name. Timed in turns, a change in the
    machine's load (another program starting, a CPU warming up) falls on every
    set-up alike, where timing one set-up after the other would give it all to
    one of them. ``desc``: show a progress bar over the rounds with that text.
    """
    if not isinstance(functions, dict) or not functions or not all(callable(f) for f in functions.values()):
        raise TypeError("functions must be a non-empty dict of name -> function taking no arguments")
    check_positive_int(repeats, "repeats")
    check_non_negative_int(warmup, "warmup")
    rounds = range(warmup + repeats)
    if desc is not None:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc=desc)
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for round_ in rounds:
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            if round_ >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return {name: Timing(tuple(times)) for name, times in seconds.items()}


@dataclass(frozen=True)
class Comparison:
    """How two timings compare: ``ratio`` is the slower median over the faster one.

    ``measurable`` is True only when the quartile ranges do not overlap;
    ``faster`` names the one with the lower median.
    """

    faster: str
    slower: str
    ratio: float
    measurable: bool

    def sentence(self) -> str:
        """Return the verdict as a sentence a lesson can print."""
        if not self.measurable:
            return (f"no measurable difference between {self.faster} and {self.slower} "
                    f"(medians {self.ratio:.2f}x apart, but the middle halves of their runs overlap)")
        return f"{self.faster} is {self.ratio:.2f}x faster than {self.slower} (median over median; the middle halves of their runs do not overlap)"


def compare(name_a: str, timing_a: Timing, name_b: str, timing_b: Timing) -> Comparison:
    """Return the :class:`Comparison` of two timings of the same work (per call: lower is faster)."""
    check_instance(name_a, "name_a", str, "a str (the name shown)")
    check_instance(name_b, "name_b", str, "a str (the name shown)")
    check_instance(timing_a, "timing_a", Timing, "a Timing")
    check_instance(timing_b, "timing_b", Timing, "a Timing")
    if timing_b.median < timing_a.median:
        name_a, timing_a, name_b, timing_b = name_b, timing_b, name_a, timing_a
    (_, a_high), (b_low, _) = timing_a.quartiles, timing_b.quartiles
    ratio = timing_b.median / max(timing_a.median, 1e-12)
    return Comparison(name_a, name_b, ratio, measurable=a_high < b_low)


# --------------------------------------------------------------------------- FLOPs


def matmul_weights(model: torch.nn.Module) -> int:
    """Return the number of weights that multiply activations in a matrix product, counted once each.

    Those of ``nn.Linear`` and of transformers' ``Conv1D`` (GPT-2's linear
    layers); an embedding table counts only where it is also the output
    layer (tied weights: the language-model head multiplies by it). Embedding
    lookups, biases and norms are left out: they do almost no FLOPs.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    from transformers.pytorch_utils import Conv1D

    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def model_shape(model: torch.nn.Module) -> tuple[int, int]:
    """Return (layers, width) read from a transformers model's config, for the attention FLOPs."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module (a transformers model)")
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model: need a transformers model with a config, got {type(model).__name__}")
    layers = next((getattr(config, name) for name in ("num_hidden_layers", "n_layer", "n_layers") if hasattr(config, name)), None)
    width = next((getattr(config, name) for name in ("hidden_size", "n_embd", "dim") if hasattr(config, name)), None)
    if not isinstance(layers, int) or not isinstance(width, int):
        raise ValueError(f"model: its config ({type(config).__name__}) names no number of layers or width")
    return layers, width


def flops_per_token(matmul_parameters: int, layers: int, seq_len: int, width: int) -> int:
    """Return the FLOPs of one training step per token: 6 x matmul weights + 12 x layers x seq_len x width.

    6 = 2 (a multiply and an add per weight, forward) + 4 (backward: the
    gradient of the input and of the weight). The attention term counts the
    scores (Q K^T) and their weighted sum of V: 2 x 2 x seq_len x width per
    token and layer forward, times 3 with the backward.
    """
    check_non_negative_int(matmul_parameters, "matmul_parameters")
    check_non_negative_int(layers, "layers")
    check_positive_int(seq_len, "seq_len")
    check_non_negative_int(width, "width")
    return 6 * matmul_parameters + 12 * layers * seq_len * width


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> int:
    """Return :func:`flops_per_token` for a transformers ``model`` on sequences of ``seq_len`` tokens."""
    layers, width = model_shape(model)
    return flops_per_token(matmul_weights(model), layers, seq_len, width)


def measure_matmul_peak(size: int = 1024, repeats: int = 5) -> tuple[float, Timing]:
    """Return (FLOP/s of the fastest run, the Timing) of a ``size`` x ``size`` fp32 matrix product.

    A large square matmul is the fastest thing the CPU does: its FLOP/s, with
    the threads torch has, is the peak an MFU figure divides by. The fastest
    run is the peak; the Timing shows how much the others lost.
    """
    check_positive_int(size, "size")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    timing = time_call(lambda: torch.mm(a, b), repeats=repeats, warmup=1)
    return 2 * size**3 / max(timing.minimum, 1e-12), timing


def mfu(tokens_per_second: float, flops_per_token_: float, peak_flops: float) -> float:
    """Return model FLOPs utilisation: tokens/s x FLOPs per token / peak FLOP/s (a fraction, 1 = the peak)."""
    check_positive_number(tokens_per_second, "tokens_per_second")
    check_positive_number(flops_per_token_, "flops_per_token_")
    check_positive_number(peak_flops, "peak_flops")
    if tokens_per_second * flops_per_token_ > MFU_BOUND * peak_flops:  # no step runs faster than the peak
        raise ValueError(f"peak_flops must be in FLOP/s (not TFLOP/s or GFLOP/s): {peak_flops:g} makes the utilisation "
                         f"{tokens_per_second * flops_per_token_ / peak_flops:.3g}, above {MFU_BOUND}")
    return tokens_per_second * flops_per_token_ / peak_flops


# --------------------------------------------------------------------------- one optimizer step, timed (lesson 5)


def time_optimizer_step(model, optimizer, micro_batches, repeats=7, warmup=1):
    """Return the seconds of ``repeats`` optimizer steps, each over all of ``micro_batches`` (a list of floats).

    Each step runs forward and backward on every micro-batch (the loss divided
    by their number, as ``accelerator.backward`` does when accumulating), then
    ``optimizer.step()`` and ``optimizer.zero_grad()``. A model prepared by an
    ``Accelerator`` with mixed precision runs its forward under autocast. The
    first ``warmup`` steps are run and not timed; the model's weights take every step.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    if not isinstance(micro_batches, (list, tuple)) or not micro_batches or not all(
        isinstance(batch, Mapping) for batch in micro_batches
    ):
        raise TypeError("micro_batches must be a non-empty list of batches (mappings of tensors)")
    check_positive_int(repeats, "repeats")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    model.train()
    seconds = []
    for index in range(warmup + repeats):
        start = time.perf_counter()
        for batch in micro_batches:
            loss = model(**batch).loss / len(micro_batches)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def describe_timing(seconds):
    """Return ``"27.1 ms (26.0-43.3 ms over 7 steps)"``: the median of ``seconds`` and their range, in ms."""
    check_finite_numbers(seconds, "seconds", non_negative=True)
    ordered = sorted(seconds)
    return f"{1000 * statistics.median(ordered):.1f} ms ({1000 * ordered[0]:.1f}-{1000 * ordered[-1]:.1f} ms over {len(ordered)} steps)"
