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
for the attention scores and their weighted sum. Model FLOPs utilisation (MFU), as PaLM defines it,
divides the FLOPs per second that implies by the hardware's *theoretical* peak
in the training precision (:func:`cpu_peak` computes it from what the CPU
reports, and says which figures it assumed); dividing by a measured matrix
product instead gives the utilisation of an achievable peak, which moves with load.

Every sentence a lesson prints about this machine's speed comes from a
function here that takes the measurements and returns the sentence
(:func:`verdict`, :func:`first_call_sentence`, :func:`bf16_sentence`,
:func:`compile_payback_sentence`, :func:`sdpa_kernel_sentence`), so that each
wording is tested with numbers of every kind, "too noisy to tell" included.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from course_utils.cpu_features import cpu_flags, read_cpuinfo
from course_utils.validation import (
    check_choice, check_finite_numbers, check_instance, check_non_negative_int, check_positive_int, check_positive_number,
)

__all__ = [
    "Timing",
    "time_call",
    "time_interleaved",
    "Comparison",
    "compare",
    "matmul_weights",
    "expert_weights",
    "model_shape",
    "flops_per_token",
    "model_flops_per_token",
    "measure_matmul_peak",
    "mfu",
    "time_optimizer_step",
    "describe_timing",
    "Verdict",
    "verdict",
    "first_call_sentence",
    "CpuPeak",
    "cpu_peak",
    "bf16_sentence",
    "peak_sentence",
    "larger_batch_sentence",
    "time_by_kind",
    "bf16_cause_sentence",
    "compile_payback_sentence",
    "sdpa_kernel_sentence",
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


def matmul_weights(model: torch.nn.Module, experts: str = "active") -> int:
    """Return the number of weights that multiply each token's activations in a matrix product, counted once each.

    Those of ``nn.Linear`` and of transformers' ``Conv1D`` (GPT-2's linear
    layers); an embedding table counts only where it is also the output
    layer (tied weights: the language-model head multiplies by it). Embedding
    lookups, biases and norms are left out: they do almost no FLOPs.

    In a mixture of experts (:func:`expert_weights`) a token runs through its
    router and its top-k experts only: ``experts="active"`` (the default, the
    step's FLOPs) counts those; ``experts="all"`` counts every expert, as if
    the model were dense (the FLOPs a count of parameters would suggest).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_choice(experts, "experts", ("active", "all"))
    from transformers.pytorch_utils import Conv1D

    every, active, inside = _experts_of(model)
    seen, total = set(inside), 0
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total + _router_weights(model) + (active if experts == "active" else every)


def expert_weights(model: torch.nn.Module) -> tuple[int, int]:
    """Return (every expert's matrix weights, those one token runs through) of ``model``; (0, 0) when it has no experts.

    transformers 5 keeps a layer's experts as 3-D parameters (experts x out x
    in, e.g. ``MixtralExperts.gate_up_proj``), not ``nn.Linear``; older and
    custom models keep an ``nn.ModuleList`` named ``experts``. A token runs
    through ``top_k`` of a layer's experts, the config's ``num_experts_per_tok``
    (or ``moe_topk``, ``top_k``): the active weights are every expert's times
    top_k / experts (the experts of a layer have one shape).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    every, active, _ = _experts_of(model)
    return every, active


_TOP_K_NAMES = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")


def _top_k(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    top_k = next((getattr(config, name) for name in _TOP_K_NAMES if isinstance(getattr(config, name, None), int)), None)
    if top_k is None:
        raise ValueError(f"model: it has experts but its config names no top-k ({', '.join(_TOP_K_NAMES)})")
    return top_k


def _expert_groups(model: torch.nn.Module) -> list[tuple[int, list[torch.Tensor]]]:
    """(experts, weight tensors) for each layer's experts: fused 3-D parameters, or a ModuleList named experts."""
    groups = []
    for name, module in model.named_modules():
        # By class name: a convolution's weight is 3-D too.
        fused = [p for p in module.parameters(recurse=False) if p.dim() == 3] if type(module).__name__.endswith("Experts") else []
        if fused:
            groups.append((fused[0].shape[0], fused))
        elif isinstance(module, torch.nn.ModuleList) and name.rpartition(".")[2] == "experts" and len(module):
            groups.append((len(module), [m.weight for m in module.modules() if isinstance(m, torch.nn.Linear)]))
    return groups


def _experts_of(model: torch.nn.Module) -> tuple[int, int, set[int]]:
    """(every expert's weights, the active ones, ids of the expert weight tensors) of ``model``."""
    groups = _expert_groups(model)
    if not groups:
        return 0, 0, set()
    top_k = _top_k(model)
    every = active = 0
    for experts, weights in groups:
        count = sum(w.numel() for w in weights)
        every += count
        active += count * min(top_k, experts) // experts
    return every, active, {id(w) for _, weights in groups for w in weights}


def _router_weights(model: torch.nn.Module) -> int:
    """A router's weight multiplies every token (experts x width); transformers 5's routers are not nn.Linear."""
    return sum(module.weight.numel() for module in model.modules()
               if type(module).__name__.endswith("Router") and not isinstance(module, torch.nn.Linear)
               and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2)


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


def measure_matmul_peak(size: int = 1024, repeats: int = 5, dtype: torch.dtype = torch.float32) -> tuple[float, Timing]:
    """Return (FLOP/s of the fastest run, the Timing) of a ``size`` x ``size`` matrix product in ``dtype``.

    An achievable peak, with the threads torch has: dividing by it gives the
    utilisation of what this machine reached, not PaLM's MFU (which divides by
    the theoretical peak, :func:`cpu_peak`). The fastest run is the peak; the
    Timing shows how much the others lost to the machine's load.
    """
    check_positive_int(size, "size")
    check_instance(dtype, "dtype", torch.dtype, "a torch.dtype")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
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


# --------------------------------------------------------------------------- sentences about this machine, from its numbers

#: Fewer timed runs than this, and the spread says nothing: a comparison is "too few runs to tell".
MIN_RUNS_TO_COMPARE = 3


@dataclass(frozen=True)
class Verdict:
    """What two timings of the same work say: ``outcome`` is "faster", "slower", "noisy" or "too few runs".

    "faster"/"slower" is ``name_a`` against ``name_b`` (lower time per call is
    faster), only when the middle halves of their runs do not overlap;
    ``ratio`` is b's median over a's (above 1: a is faster).
    """

    name_a: str
    name_b: str
    outcome: str
    ratio: float

    def sentence(self) -> str:
        """Return the verdict as a clause a lesson can print."""
        if self.outcome == "too few runs":
            return (f"too few runs to tell {self.name_a} from {self.name_b} (fewer than {MIN_RUNS_TO_COMPARE} each: "
                    "no spread to judge by)")
        if self.outcome == "noisy":
            return (f"no measurable difference between {self.name_a} and {self.name_b} (medians "
                    f"{max(self.ratio, 1 / max(self.ratio, 1e-12)):.2f}x apart, "
                    "but the middle halves of their runs overlap: too noisy to tell)")
        if self.outcome == "faster":
            return f"{self.name_a} is {self.ratio:.2f}x faster than {self.name_b} (the middle halves of their runs do not overlap)"
        return f"{self.name_a} is {1 / self.ratio:.2f}x slower than {self.name_b} (the middle halves of their runs do not overlap)"


def verdict(name_a: str, timing_a: Timing, name_b: str, timing_b: Timing) -> Verdict:
    """Return the :class:`Verdict` of ``timing_a`` against ``timing_b`` (seconds per call of the same work)."""
    check_instance(timing_a, "timing_a", Timing, "a Timing")
    check_instance(timing_b, "timing_b", Timing, "a Timing")
    ratio = timing_b.median / max(timing_a.median, 1e-12)
    if min(len(timing_a.seconds), len(timing_b.seconds)) < MIN_RUNS_TO_COMPARE:
        return Verdict(name_a, name_b, "too few runs", ratio)
    (a_low, a_high), (b_low, b_high) = timing_a.quartiles, timing_b.quartiles
    outcome = "faster" if a_high < b_low else "slower" if b_high < a_low else "noisy"
    return Verdict(name_a, name_b, outcome, ratio)


def first_call_sentence(first_seconds: float, timing: Timing) -> str:
    """Say whether a first, untimed call was slower than the timed ones, from where it falls in their range."""
    check_positive_number(first_seconds, "first_seconds")
    check_instance(timing, "timing", Timing, "a Timing")
    ratio = first_seconds / max(timing.median, 1e-12)
    if first_seconds > timing.maximum:
        return (f"The first call took {ratio:.1f}x the median, longer than every timed run: the one-off costs of a "
                "first call, which the warm-up keeps out of the figures.")
    if first_seconds < timing.minimum:
        return (f"The first call took {ratio:.1f}x the median, *shorter* than every timed run: the machine's load "
                "changed during the runs, so this run is too noisy to show a first-call cost.")
    return (f"The first call took {ratio:.1f}x the median, within the range of the timed runs: no first-call cost "
            "shows above this run's spread.")


# --------------------------------------------------------------------------- what the CPU reports


def _cpuinfo_field(cpuinfo: str, field: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return None


@dataclass(frozen=True)
class CpuPeak:
    """A CPU's theoretical peak FLOP/s per precision, on ``cores`` cores, and where each figure came from.

    ``flops`` maps "fp32" (and "bf16" where the CPU has bf16 instructions) to
    FLOP/s; ``read`` lists the figures read from the CPU, ``assumed`` those
    taken from the vendor's documentation for its microarchitecture (with the source).
    """

    cores: int
    clock_hz: float
    flops_per_cycle: dict[str, int]
    read: tuple[str, ...]
    assumed: tuple[str, ...]

    @property
    def flops(self) -> dict[str, float]:
        return {precision: self.cores * self.clock_hz * per_cycle for precision, per_cycle in self.flops_per_cycle.items()}


# fp32 FLOPs per cycle per core: FMA units x fp32 lanes per unit x 2 (a multiply and an add).
_ZEN4 = ("AMD family 25 with AVX-512 (Zen 4): 2 FMA units of 256 bits (AVX-512 runs as two 256-bit halves): "
         "2 x 8 lanes x 2 = 32 fp32 FLOPs/cycle; AVX512-BF16's VDPBF16PS does two bf16 products per fp32 lane: 64 "
         "(AMD, Software Optimization Guide for the AMD Zen4 Microarchitecture, pub. 57647)")
_ZEN5 = ("AMD family 26 (Zen 5): 2 FMA units of 512 bits: 2 x 16 x 2 = 64 fp32 FLOPs/cycle, 128 bf16 "
         "(AMD, Software Optimization Guide for the AMD Zen5 Microarchitecture, pub. 58455)")
_INTEL_AVX512 = ("Intel with AVX-512: 2 FMA units of 512 bits (Xeon Scalable Gold/Platinum; some parts have 1): "
                 "2 x 16 x 2 = 64 fp32 FLOPs/cycle, 128 bf16 with AVX512-BF16; AMX-BF16: 1,024 bf16 FLOPs/cycle "
                 "(Intel 64 and IA-32 Architectures Optimization Reference Manual, chapters on AVX-512 and AMX)")
_AVX2 = ("x86 with AVX2 and FMA: 2 FMA units of 256 bits (Intel Haswell and later, AMD Zen 2 and later): "
         "2 x 8 x 2 = 32 fp32 FLOPs/cycle (Intel Optimization Reference Manual; AMD Software Optimization Guides)")


def cpu_peak(cores: int = 1, cpuinfo: str | None = None) -> CpuPeak | None:
    """Return the theoretical peak of ``cores`` cores of this CPU (or of the ``/proc/cpuinfo`` text ``cpuinfo``).

    Read from the CPU: vendor, family, vector flags and the clock ("cpu MHz",
    the current clock: turbo can be higher, so the peak can be an
    underestimate). Assumed, by microarchitecture, with its source: the FMA
    units per core. None where the CPU is not one of those (or not readable).
    """
    check_positive_int(cores, "cores")
    if cpuinfo is not None and not isinstance(cpuinfo, str):
        raise TypeError(f"cpuinfo must be the text of /proc/cpuinfo (a str) or None, got {type(cpuinfo).__name__}")
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    if cpuinfo is None:
        return None
    flags, vendor = cpu_flags(cpuinfo), _cpuinfo_field(cpuinfo, "vendor_id")
    family, mhz = _cpuinfo_field(cpuinfo, "cpu family"), _cpuinfo_field(cpuinfo, "cpu MHz")
    if mhz is None or "fma" not in flags:
        return None
    bf16 = "avx512_bf16" in flags
    if vendor == "AuthenticAMD" and family in ("25", "26") and "avx512f" in flags:
        per_cycle, source = (32, _ZEN4) if family == "25" else (64, _ZEN5)
    elif vendor == "GenuineIntel" and "avx512f" in flags:
        per_cycle, source = 64, _INTEL_AVX512
    elif "avx2" in flags:
        per_cycle, source, bf16 = 32, _AVX2, False
    else:
        return None
    flops_per_cycle = {"fp32": per_cycle}
    if "amx_bf16" in flags:
        flops_per_cycle["bf16"] = 1024
    elif bf16:
        flops_per_cycle["bf16"] = 2 * per_cycle
    read = (f"vendor {vendor}, family {family}", f"clock {float(mhz):,.0f} MHz (cpu MHz)",
            "flags: " + ", ".join(sorted(flags & {"fma", "avx2", "avx512f", "avx512_bf16", "amx_bf16"})),
            f"{cores} core{'s' if cores != 1 else ''} (the torch threads in use)")
    return CpuPeak(cores, float(mhz) * 1e6, flops_per_cycle, read, (source,))


def peak_sentence(peak: CpuPeak | None, measured_flops: float, precision: str = "fp32") -> str:
    """Set a measured matmul's FLOP/s beside the theoretical peak of ``precision``, and say what a gap, or none, means."""
    check_positive_number(measured_flops, "measured_flops")
    if peak is not None and not isinstance(peak, CpuPeak):
        raise TypeError(f"peak must be cpu_peak()'s CpuPeak or None, got {type(peak).__name__}")
    if peak is None or precision not in peak.flops:
        return (f"No theoretical {precision} peak for this CPU (its FMA units are not in the course's table, or it "
                "reports no clock): only the measured utilisation can be given here.")
    share = measured_flops / peak.flops[precision]
    if share > 1:
        return (f"The measured {precision} matmul ran at {share:.0%} of the computed theoretical peak: above it, so "
                f"the clock read ({peak.clock_hz / 1e6:,.0f} MHz) is below the one the core really ran at (turbo), or "
                "the assumed FMA figure is wrong for this CPU; the MFU below is then an upper bound.")
    return (f"The measured {precision} matmul reached {share:.0%} of the theoretical peak: the rest is lost to "
            "memory traffic, the kernel's own overhead and the machine's load (the runs' spread above shows the load).")


def bf16_sentence(fp32_name: str, fp32: Timing, bf16_name: str, bf16: Timing,
                  matrix_units: tuple[str, ...] | None) -> str:
    """Say how bf16 compared with fp32 here, and what the CPU's reported bf16 units make of it.

    ``matrix_units``: :func:`cpu_matrix_units` (None: unknown). The sentence
    never says "emulated" where the CPU reports bf16 units, and never claims
    a speed-up the spread does not show.
    """
    if matrix_units is not None and not (isinstance(matrix_units, tuple) and all(isinstance(u, str) for u in matrix_units)):
        raise TypeError(f"matrix_units must be cpu_matrix_units()'s tuple of names or None, got {matrix_units!r:.80}")
    result = verdict(bf16_name, bf16, fp32_name, fp32)
    if matrix_units is None:
        units = "this machine does not report its CPU features, so whether it has bf16 units is unknown"
    elif matrix_units:
        units = f"this CPU reports bf16 units ({', '.join(matrix_units)}): its bf16 matrix products are native"
    else:
        units = ("this CPU reports no bf16 matrix units (neither AMX-BF16 nor AVX512-BF16): its bf16 products "
                 "are computed by converting to fp32")
    verdict_clause = result.sentence()
    verdict_clause = f"there is {verdict_clause}" if verdict_clause.startswith("no ") else verdict_clause
    return f"Here {verdict_clause}; {units}."


def compile_payback_sentence(compile_seconds: float, eager: Timing, compiled: Timing, shapes: int = 1) -> str:
    """Say after how many steps a compile of ``compile_seconds`` per shape pays back, from the two timings.

    ``shapes``: the distinct shapes a run meets; each recompiles (another
    ``compile_seconds``, on a cache miss). No payback is claimed unless the
    compiled step is measurably faster.
    """
    check_positive_number(compile_seconds, "compile_seconds")
    check_positive_int(shapes, "shapes")
    result = verdict("compiled", compiled, "eager", eager)
    if result.outcome != "faster":
        return (f"{result.sentence()[0].upper()}{result.sentence()[1:]}: no payback can be computed from this run; "
                f"the {compile_seconds:.1f} s of compiling were not won back here.")
    saved = eager.median - compiled.median
    steps = compile_seconds * shapes / saved
    return (f"{result.sentence()[0].upper()}{result.sentence()[1:]}; each step saves {saved * 1e3:.2f} ms (median), "
            f"so {shapes} shape{'s' if shapes != 1 else ''} compiled at {compile_seconds:.1f} s each "
            f"{'are' if shapes != 1 else 'is'} paid back after {steps:,.0f} steps; every recompilation "
            "(a new shape, a changed guard) pays again.")


def sdpa_kernel_sentence(kernel_names: list[str] | tuple[str, ...]) -> str:
    """Say which SDPA kernel ran, from the operator names the profiler recorded."""
    if not isinstance(kernel_names, (list, tuple, set)) or not all(isinstance(n, str) for n in kernel_names):
        raise TypeError(f"kernel_names must be a list of operator names (str), got {kernel_names!r:.80}")
    names = sorted(set(kernel_names))
    if any("flash" in name for name in names):
        kind = "the flash-attention-style kernel (blocks of the scores, never the whole matrix)"
    elif any("efficient" in name for name in names):
        kind = "the memory-efficient kernel"
    elif any("cudnn" in name for name in names):
        kind = "cuDNN's attention kernel"
    elif names:
        kind = "the math fallback (the scores written out in torch operations)"
    else:
        return "The profiler recorded no SDPA operator: the model did not call scaled_dot_product_attention."
    return f"SDPA ran {kind} here: {', '.join(names)}."


MATMUL_OPERATORS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
CAST_OPERATORS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})


def time_by_kind(profile) -> dict[str, float]:
    """Return the operators' own CPU time in a ``torch.profiler`` profile, in ms, as matrix products, casts, the rest.

    "casts" are the conversions between dtypes and the copies they make
    (``aten::to``, ``_to_copy``, ``copy_``: autocast adds them around every
    matrix product; an fp32 step has copies too); "other" is everything else.
    """
    if not callable(getattr(profile, "key_averages", None)):
        raise TypeError(f"profile must be a finished torch.profiler.profile, got {type(profile).__name__}")
    kinds = {"matrix products": 0.0, "casts": 0.0, "other": 0.0}
    for event in profile.key_averages():
        if not event.key.startswith("aten::"):
            continue  # record_function ranges and the profiler's own events hold no time of their own here
        kind = "matrix products" if event.key in MATMUL_OPERATORS else "casts" if event.key in CAST_OPERATORS else "other"
        kinds[kind] += event.self_cpu_time_total / 1e3
    return kinds


_OUTCOME_WORDS = {"faster": "faster in bf16, beyond the spread", "slower": "slower in bf16, beyond the spread",
                  "noisy": "no measurable difference", "too few runs": "too few runs to tell"}


def bf16_cause_sentence(step: Verdict, fp32_kinds: Mapping[str, Timing], bf16_kinds: Mapping[str, Timing]) -> str:
    """Explain a bf16 step's time from its profiled parts, beside the whole step's :class:`Verdict`.

    ``fp32_kinds`` and ``bf16_kinds`` map each kind of :func:`time_by_kind` to a
    :class:`Timing` over several profiled steps (seconds), so that the matrix
    products' gain is judged against its own spread.
    """
    check_instance(step, "step", Verdict, "a Verdict")
    for name, kinds in (("fp32_kinds", fp32_kinds), ("bf16_kinds", bf16_kinds)):
        if (not isinstance(kinds, Mapping) or set(kinds) != {"matrix products", "casts", "other"}
                or not all(isinstance(timing, Timing) for timing in kinds.values())):
            raise ValueError(f"{name} must map matrix products, casts and other to a Timing each, got {kinds!r:.120}")
    matmuls = verdict("bf16", bf16_kinds["matrix products"], "fp32", fp32_kinds["matrix products"])
    ms = {kind: (fp32_kinds[kind].median * 1e3, bf16_kinds[kind].median * 1e3) for kind in fp32_kinds}
    runs = min(len(t.seconds) for t in (*fp32_kinds.values(), *bf16_kinds.values()))
    parts = (f"over {runs} profiled steps of each (medians), the matrix products took {ms['matrix products'][0]:.1f} ms "
             f"in fp32 and {ms['matrix products'][1]:.1f} ms in bf16 ({_OUTCOME_WORDS[matmuls.outcome]}), "
             f"casts and copies {ms['casts'][0]:.1f} against {ms['casts'][1]:.1f} ms, everything else "
             f"{ms['other'][0]:.1f} against {ms['other'][1]:.1f} ms")
    gained = ms["matrix products"][0] - ms["matrix products"][1]
    added_casts = ms["casts"][1] - ms["casts"][0]
    if step.outcome == "faster":
        cause = ("the gain is in the matrix products" if matmuls.outcome == "faster" else
                 "the profiled parts do not show measurably where the gain came from (too noisy to tell)")
    elif matmuls.outcome == "slower":
        cause = "the matrix products themselves are slower in bf16 here, so the step cannot gain"
    elif matmuls.outcome != "faster":
        cause = ("the matrix products show no measurable gain inside the step: on a model this narrow they are small, "
                 "and bf16's units do not pay on them")
    elif added_casts >= gained:
        cause = ("the matrix products gain, but the casts autocast adds cost as much: on a model this narrow the "
                 "matrix products are too small a share of the step for bf16 to pay")
    else:
        cause = ("the matrix products gain more than the added casts cost, so the rest of the step, or the spread, "
                 "decides here: time more runs on a quieter machine")
    return f"Why: {parts}; {cause}."


def larger_batch_sentence(per_token: Verdict, extra_bytes: float) -> str:
    """Say what a larger batch bought per token, from the :class:`Verdict` of its time per token against a smaller one.

    ``extra_bytes``: the memory the larger batch needs beyond the smaller one (planned).
    """
    check_instance(per_token, "per_token", Verdict, "a Verdict")
    check_finite_numbers([extra_bytes], "extra_bytes")
    memory = f"{extra_bytes / 2**20:,.1f} MiB more at its peak"
    if per_token.outcome == "faster":
        return (f"Per token, {per_token.sentence()}, for {memory}: memory spent on the batch bought speed here, "
                "which a lever that frees memory can pay for.")
    return (f"Per token, {per_token.sentence()}, for {memory}: on this machine, in this run, the larger batch bought "
            "no speed, so the memory is better left free here (other hardware differs: measure it there with the "
            "same tools).")
