"""The cards a plan runs on: peak arithmetic, memory, memory bandwidth and links, each figure with its source (issue 35).

One table, :data:`CARDS`, for the GPUs the course names. Every figure is a
:class:`Figure`: a value in base units (bytes, bytes per second, FLOP per
second, a fraction) beside the document it was read from. Peaks are *dense*:
a data sheet's larger figure for the same precision is the 2:4-sparsity peak
(marked ``*`` there), which dense training never reaches, so the table holds
half of it where the sheet gives only that, and the sheet's figure beside it
(``sparsity_peaks``). Link bandwidths are per GPU and
per direction (data sheets add both directions together). A card whose
figures are not at hand is left out, and so is a figure: ``None`` means "no
source", never "zero".

:data:`NETWORKS` holds the links between nodes (one adapter per GPU, as the
reference systems' data sheets list them). :func:`achievable_fraction` is the
share of the peak a large matrix product reached when someone measured it
(Bekman's Maximum Achievable Matmul FLOPS table, ``mamf-finder.py``); nothing
here was measured on this machine (for the CPU see :mod:`course_utils.step_time`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.units import GB
from course_utils.validation import check_choice

__all__ = ["Figure", "Card", "CARDS", "NETWORKS", "PRECISIONS", "card", "peak_flops", "achievable_fraction"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The precisions a card's peak is given for: fp32 without tensor cores, the others on them."""


@dataclass(frozen=True)
class Figure:
    """One hardware figure in base units (bytes, bytes/s, FLOP/s, a fraction) and the document it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Card:
    """One GPU: memory (bytes), memory bandwidth (bytes/s), dense peaks by precision (FLOP/s), links (bytes/s each way).

    ``links`` maps "nvlink" (GPU to GPU inside a node) and "pcie" (GPU to host,
    or GPU to GPU where there is no NVLink) to a :class:`Figure`; a card without
    NVLink has no "nvlink". ``matmul_fraction`` maps a precision to the share of
    its peak a measured large matrix product reached, where one was published.
    ``sparsity_peaks`` holds the data sheet's 2:4 structured-sparsity figures
    (FLOP/s, its headline ``*`` figures), where the sheet prints them.
    """

    name: str
    memory: Figure
    memory_bandwidth: Figure
    peaks: dict[str, Figure]
    links: dict[str, Figure]
    matmul_fraction: dict[str, Figure] = field(default_factory=dict)
    sparsity_peaks: dict[str, Figure] = field(default_factory=dict)


_A100 = "NVIDIA A100 Tensor Core GPU data sheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
_H100 = "NVIDIA H100 Tensor Core GPU data sheet (nvidia.com/en-us/data-center/h100, Technical Specifications)"
_H200 = "NVIDIA H200 Tensor Core GPU data sheet (nvidia.com/en-us/data-center/h200, Technical Specifications)"
_B200 = ("NVIDIA HGX B200 at 1,000 W, as tabulated from NVIDIA's Blackwell technical brief at "
         "glennklockwood.com/garden/processors/B200")
_B200_MEMORY = ("NVIDIA HGX AI Factory components page (180 GB per B200, 8 TB/s), as quoted in Bekman, ML Engineering, "
                "compute/accelerator/README.md, 'Accelerator memory size and speed'")
_L4 = "NVIDIA L4 Tensor Core GPU data sheet (nvidia.com/en-us/data-center/l4)"
_ADA = "NVIDIA Ada GPU Architecture white paper v2.01, Appendix A (GeForce RTX 4090)"
_MAMF = ("Bekman, ML Engineering (github.com/stas00/ml-engineering), compute/accelerator/README.md, 'Maximum Achievable "
         "Matmul FLOPS comparison table', BF16")
_SPARSE_HALVED = ", the sparsity figure ('*') halved"


def _tflops(value: float, source: str) -> Figure:
    return Figure(value * 1e12, source)


def _gb_s(value: float, source: str) -> Figure:
    return Figure(value * 1e9, source)


def _sparsity_sheet(sheet: str, fp32_tflops: float, **sparse_tflops: float) -> dict:
    """The peaks of a sheet that prints tensor-core figures only with 2:4 sparsity ('*'): dense is half of each."""
    return dict(
        peaks={"fp32": _tflops(fp32_tflops, sheet),
               **{name: _tflops(value / 2, sheet + _SPARSE_HALVED) for name, value in sparse_tflops.items()}},
        sparsity_peaks={name: _tflops(value, sheet + ": '*' with sparsity") for name, value in sparse_tflops.items()},
    )


def _a100(memory_gb: int, bandwidth_gb_s: float) -> dict:
    return dict(
        memory=Figure(memory_gb * GB, _A100), memory_bandwidth=_gb_s(bandwidth_gb_s, _A100 + ", A100 SXM"),
        peaks={"fp32": _tflops(19.5, _A100), "tf32": _tflops(156, _A100), "bf16": _tflops(312, _A100),
               "fp16": _tflops(312, _A100)},
        sparsity_peaks={name: _tflops(value, _A100 + ": '*' with sparsity")
                        for name, value in {"tf32": 312, "bf16": 624, "fp16": 624}.items()},
        links={"nvlink": _gb_s(300, _A100 + ": NVLink 600 GB/s, both directions together"),
               "pcie": _gb_s(32, _A100 + ": PCIe Gen4 64 GB/s, both directions together")},
        matmul_fraction={"bf16": Figure(271.2 / 312, _MAMF + ": A100 SXM 271.2 of 312 TFLOPS")},
    )


def _hopper_sxm(memory_gb: int, bandwidth_gb_s: float, sheet: str, matmul_source: str) -> dict:
    """The H100 SXM and the H200: the same chip and links (their sheets print the same peaks), other memory."""
    return dict(
        memory=Figure(memory_gb * GB, sheet), memory_bandwidth=_gb_s(bandwidth_gb_s, sheet),
        **_sparsity_sheet(sheet, 67, tf32=989, bf16=1979, fp16=1979, fp8=3958),
        links={"nvlink": _gb_s(450, sheet + ": NVLink 900 GB/s, both directions together"),
               "pcie": _gb_s(64, sheet + ": PCIe Gen5 128 GB/s, both directions together")},
        matmul_fraction={"bf16": Figure(794.5 / 989, matmul_source)},
    )


CARDS: dict[str, Card] = {
    "A100 40GB": Card("A100 40GB", **_a100(40, 1555)),
    "A100 80GB": Card("A100 80GB", **_a100(80, 2039)),
    "H100 SXM": Card("H100 SXM", **_hopper_sxm(80, 3350, _H100, _MAMF + ": H100 SXM 794.5 of 989 TFLOPS")),
    "H100 PCIe": Card(
        "H100 PCIe", memory=Figure(80 * GB, _H100), memory_bandwidth=_gb_s(2000, _H100 + ", H100 PCIe"),
        **_sparsity_sheet(_H100 + ", H100 PCIe", 51, tf32=756, bf16=1513, fp16=1513, fp8=3026),
        links={"nvlink": _gb_s(300, _H100 + ", H100 PCIe: NVLink bridge 600 GB/s, both directions together"),
               "pcie": _gb_s(64, _H100 + ": PCIe Gen5 128 GB/s, both directions together")}),
    "H200": Card("H200", **_hopper_sxm(141, 4800, _H200,
                                       _MAMF + ": H100 SXM 794.5 of 989 TFLOPS, noted 'H200 is the same'")),
    "B200": Card(
        "B200", memory=Figure(180 * GB, _B200_MEMORY), memory_bandwidth=_gb_s(8000, _B200_MEMORY),
        peaks={"fp32": _tflops(80, _B200), "tf32": _tflops(1100, _B200), "bf16": _tflops(2250, _B200),
               "fp16": _tflops(2250, _B200), "fp8": _tflops(4500, _B200)},
        links={"nvlink": _gb_s(900, _B200 + ": NVLink 5, 2 x 900 GB/s")},
        matmul_fraction={"bf16": Figure(1745.0 / 2250, _MAMF + ": B200 SXM 1745.0 of 2250 TFLOPS")}),
    "L4": Card(
        "L4", memory=Figure(24 * GB, _L4), memory_bandwidth=_gb_s(300, _L4),
        **_sparsity_sheet(_L4, 30.3, tf32=120, bf16=242, fp16=242, fp8=485),
        links={"pcie": _gb_s(32, _L4 + ": PCIe Gen4 x16, 64 GB/s both directions together")}),
    "RTX 4090": Card(
        "RTX 4090", memory=Figure(24 * GB, _ADA), memory_bandwidth=_gb_s(1008, _ADA),
        peaks={"fp32": _tflops(82.6, _ADA), "bf16": _tflops(165.2, _ADA + ": BF16 tensor, FP32 accumulate"),
               "fp16": _tflops(165.2, _ADA + ": FP16 tensor, FP32 accumulate")},
        links={"pcie": _gb_s(32, _ADA + ": PCIe Gen4 x16, 64 GB/s both directions together")}),
}
"""The cards, by name. Memory in decimal bytes as the sheet says it (``gpus.GPU_MEMORY_MIB`` has what nvidia-smi reports)."""

NETWORKS: dict[str, Figure] = {
    "InfiniBand NDR 400 Gb/s per GPU": Figure(
        50e9, "NVIDIA DGX H100 data sheet: 8 x ConnectX-7 at 400 Gb/s, one per GPU (50 GB/s each way)"),
    "InfiniBand HDR 200 Gb/s per GPU": Figure(
        25e9, "NVIDIA DGX A100 data sheet: 8 x ConnectX-6 at 200 Gb/s HDR for the compute fabric (25 GB/s each way)"),
    "RDMA 400 Gb/s per GPU": Figure(
        50e9, "torchtitan docs/performance.md (Grand Teton hosts): 'backend RDMA network with 400 Gb/s per GPU'"),
}
"""Links between nodes, per GPU and per direction (bytes/s), with their sources."""


def card(name: str) -> Card:
    """Return the :class:`Card` called ``name`` (a key of :data:`CARDS`)."""
    check_choice(name, "name", tuple(CARDS))
    return CARDS[name]


def peak_flops(name: str, precision: str) -> float:
    """Return the dense peak of card ``name`` in ``precision`` (one of :data:`PRECISIONS`), in FLOP/s.

    Raises ValueError when the table has no sourced figure for that precision on that card.
    """
    check_choice(precision, "precision", PRECISIONS)
    peaks = card(name).peaks
    if precision not in peaks:
        raise ValueError(f"precision: no sourced {precision} peak for the {name}; it has {sorted(peaks)}")
    return peaks[precision].value


def achievable_fraction(name: str, precision: str) -> Figure | None:
    """Return the measured share of the ``precision`` peak a large matrix product reached on ``name``, or None.

    None where no measurement was published: a time model then has no
    sourced fraction for that card and must say so (or use 1, the peak itself: a bound).
    """
    check_choice(precision, "precision", PRECISIONS)
    return card(name).matmul_fraction.get(precision)
