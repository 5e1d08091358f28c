"""What good utilisation looks like: published MFU figures, data-sheet peaks, and MFU against HFU (lesson 8).

A utilisation figure is a ratio, and both of its terms can be chosen to
flatter. The numerator: *model* FLOPs (MFU, as the PaLM paper defines it,
https://arxiv.org/abs/2204.02311, appendix B) count the arithmetic the model
needs, 6 x weights per token; *hardware* FLOPs (HFU) count what the chips
executed, which with activation checkpointing includes the forward pass run a
second time. The denominator: the peak of the precision trained in, dense; a
data sheet's larger figure for the same precision is often the 2:4
structured-sparsity peak, which dense training never reaches.

Every published figure here carries its source beside it; nothing here was
measured on this machine. :func:`count_flops` counts what a step runs, with
torch's ``FlopCounterMode``, so that a lesson can compute HFU / MFU itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_utils import hardware
from course_utils.validation import check_positive_number

__all__ = [
    "PublishedRun",
    "PUBLISHED_RUNS",
    "DataSheetPeak",
    "DATA_SHEET_PEAKS",
    "count_flops",
    "describe_recomputation",
]


@dataclass(frozen=True)
class PublishedRun:
    """One training run's utilisation as its paper reports it.

    ``utilisation`` is a fraction; ``counts`` says what its numerator counts:
    "model FLOPs" (MFU) or "hardware FLOPs" (with the recomputed forward:
    HFU). ``chips`` is None where the source gives no count. ``tflops_per_chip`` is the achieved rate where the paper gives it,
    else None; ``source`` names the paper and the table or page.
    """

    model: str
    hardware: str
    chips: int | None
    precision: str
    utilisation: float
    counts: str
    tflops_per_chip: float | None
    source: str


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    # PaLM, Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311: Table 3 ("Model FLOPs utilization of PaLM and
    # prior large models"); the abstract and section 4 give the same run's 57.8 % hardware FLOPs utilisation.
    PublishedRun("GPT-3 175B", "NVIDIA V100", None, "fp16 mixed", 0.213, "model FLOPs", None,
                 "PaLM paper (arXiv 2204.02311), Table 3"),
    PublishedRun("Gopher 280B", "TPU v3", 4096, "bf16", 0.325, "model FLOPs", None,
                 "PaLM paper (arXiv 2204.02311), Table 3"),
    PublishedRun("Megatron-Turing NLG 530B", "NVIDIA A100", 2240, "bf16 mixed", 0.302, "model FLOPs", None,
                 "PaLM paper (arXiv 2204.02311), Table 3"),
    PublishedRun("PaLM 540B", "TPU v4", 6144, "bf16", 0.462, "model FLOPs", None,
                 "PaLM paper (arXiv 2204.02311), Table 3"),
    PublishedRun("PaLM 540B", "TPU v4", 6144, "bf16", 0.578, "hardware FLOPs", None,
                 "PaLM paper (arXiv 2204.02311), abstract and section 4"),
    # Megatron-LM, Narayanan et al. 2021, https://arxiv.org/abs/2104.04473: section 5.1 and Table 1 (the 1T-parameter
    # GPT: 163 TFLOP/s per GPU, 52 % of the A100's 312 TFLOP/s, 502 PFLOP/s on 3072 GPUs). Their FLOP count
    # (equation 3, 96 B s l h^2 (...)) includes the forward recomputed by activation checkpointing: hardware FLOPs.
    PublishedRun("GPT 1T (Megatron-LM)", "NVIDIA A100 80GB", 3072, "fp16 mixed", 0.52, "hardware FLOPs", 163.0,
                 "Megatron-LM paper (arXiv 2104.04473), section 5.1, Table 1"),
    # Llama 3, Dubey et al. 2024, https://arxiv.org/abs/2407.21783: Table 4 (405B pre-training, BF16 MFU "38-43 %"
    # as section 3.3.2 sums it up): 430 TFLOP/s per GPU on 8,192 GPUs, 400 on 16,384, 380 at 131,072 tokens of context.
    PublishedRun("Llama 3 405B", "NVIDIA H100 80GB", 8192, "bf16", 0.43, "model FLOPs", 430.0,
                 "Llama 3 paper (arXiv 2407.21783), Table 4"),
    PublishedRun("Llama 3 405B", "NVIDIA H100 80GB", 16384, "bf16", 0.41, "model FLOPs", 400.0,
                 "Llama 3 paper (arXiv 2407.21783), Table 4"),
    PublishedRun("Llama 3 405B, 128K context", "NVIDIA H100 80GB", 16384, "bf16", 0.38, "model FLOPs", 380.0,
                 "Llama 3 paper (arXiv 2407.21783), Table 4"),
)


@dataclass(frozen=True)
class DataSheetPeak:
    """A chip's peak for one precision, in TFLOP/s: dense, and with 2:4 structured sparsity (None if none is given)."""

    chip: str
    precision: str
    dense_tflops: float
    sparse_tflops: float | None
    source: str


def _data_sheet_peak(card: str, precision: str) -> DataSheetPeak:
    """One GPU's row, read from :mod:`course_utils.hardware` (the one table of GPU figures, each with its source)."""
    figures = hardware.card(card)
    dense, sparse = figures.peaks[precision], figures.sparsity_peaks.get(precision)
    return DataSheetPeak(card, precision, dense.value / 1e12, sparse.value / 1e12 if sparse else None, dense.source)


DATA_SHEET_PEAKS: tuple[DataSheetPeak, ...] = (
    _data_sheet_peak("H100 SXM", "bf16"),
    _data_sheet_peak("A100 80GB", "bf16"),
    # Not a GPU, so not in hardware's table of cards: Google Cloud TPU v4 documentation
    # (https://cloud.google.com/tpu/docs/v4), 275 TFLOP/s bf16 per chip; it prints no sparsity figure.
    DataSheetPeak("TPU v4", "bf16", 275.0, None, "Google Cloud TPU v4 documentation"),
)
"""The peaks the published runs trained against: the GPUs' from :mod:`course_utils.hardware`, the TPU's here."""


def count_flops(function: Callable[[], object]) -> int:
    """Return the FLOPs that ``function()`` runs, counted by torch's ``FlopCounterMode`` (matrix products, attention).

    Counted as they run, forward and backward: a checkpointed forward that
    the backward pass runs again is counted twice, as the hardware does it.
    """
    if not callable(function):
        raise TypeError(f"function must be callable with no arguments, got {type(function).__name__}")
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        function()
    return int(counter.get_total_flops())


def describe_recomputation(flops_plain: float, flops_checkpointed: float) -> str:
    """Return a sentence on HFU / MFU from the FLOPs of one step without and with activation checkpointing.

    HFU divides what ran (``flops_checkpointed``) by the same peak MFU
    divides the model's FLOPs (``flops_plain``) by, so HFU / MFU is their ratio.
    """
    check_positive_number(flops_plain, "flops_plain")
    check_positive_number(flops_checkpointed, "flops_checkpointed")
    ratio = flops_checkpointed / flops_plain
    if ratio > 1.0005:
        return (f"with checkpointing the step runs {ratio:.3f}x the FLOPs of the plain step: the same step, at the "
                f"same speed, reports an HFU {ratio:.3f}x its MFU")
    return (f"with checkpointing the step runs {ratio:.3f}x the FLOPs of the plain step: nothing was recomputed, "
            f"so HFU equals MFU here")
