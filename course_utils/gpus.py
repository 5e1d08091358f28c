"""GPU memory sizes as the cards report them, for the figures that compare a plan with a card (lessons 4, 5, 7).

A vendor's sheet says "24 GB" or "80GB"; the driver reports the card's memory in
binary units (``nvidia-smi``: ``24564MiB`` for an RTX 4090, ``81920MiB`` for an
A100 80GB). A plan in bytes is compared with those bytes, not with the decimal label.
Not all of it is free for tensors: the CUDA context and the caching allocator's
fragmentation take their share first (see ``HEADROOM_NOTE``).
"""

from __future__ import annotations

from course_utils.units import MIB
from course_utils.validation import check_non_negative_number

# Total memory as nvidia-smi reports it ("Memory-Usage: used / total"), in MiB, one common card per size.
# Each value is read from an nvidia-smi output pasted in a public issue or pull request (the URL beside it).
# Two readings of one model can differ by a few MiB with the driver or ECC setting; the sources name theirs.
GPU_MEMORY_MIB: dict[str, int] = {
    # https://github.com/modal-labs/modal-client/pull/2797 (nvidia-smi totals of T4, L4, A10, A100 40GB/80GB, H100)
    "T4 (16 GB)": 15_360,
    # https://github.com/4paradigm/k8s-vgpu-scheduler/issues/7 ("Tesla V100-SXM2...  112MiB / 16160MiB")
    "V100 16GB": 16_160,
    # https://github.com/modal-labs/modal-client/pull/2797 ("A10: 23028MiB", "L4: 23034MiB")
    "A10 (24 GB)": 23_028,
    "L4 (24 GB)": 23_034,
    # https://github.com/RLinf/RLinf/issues/255 ("NVIDIA GeForce RTX 4090 ... 507MiB /  24564MiB")
    "RTX 4090 (24 GB)": 24_564,
    # https://github.com/noonghunna/club-3090/issues/1128 ("NVIDIA GeForce RTX 3090 ... 22598MiB /  24576MiB")
    "RTX 3090 (24 GB)": 24_576,
    # https://github.com/godweiyang/GrabGPU/issues/5 ("Tesla V100-SXM2...  0MiB / 32480MiB")
    "V100 32GB": 32_480,
    # https://github.com/modal-labs/modal-client/pull/2797 ("A100 40GB: 40960MiB")
    "A100 40GB": 40_960,
    # https://github.com/wilicc/gpu-burn/issues/114 ("NVIDIA H100 80GB HBM3 ... 72790MiB /  81559MiB"), and the PR above
    "H100 80GB": 81_559,
    # https://github.com/modal-labs/modal-client/pull/2797 ("A100 80GB: 81920MiB")
    "A100 80GB": 81_920,
}

# The cards a figure marks: one per size class, so that their lines do not fall on top of each other
# (an H100 80GB, 81,559 MiB, sits 0.4 % below the A100 80GB; an A10 and an L4 beside the 24 GB cards).
FIGURE_CARDS: tuple[str, ...] = ("T4 (16 GB)", "RTX 4090 (24 GB)", "A100 40GB", "A100 80GB")

# Sources: PyTorch's torch.cuda.memory_allocated documentation ("likely less than the amount shown in
# nvidia-smi since some unused memory can be held by the caching allocator and some context needs to be
# created on GPU", https://pytorch.org/docs/stable/generated/torch.cuda.memory_allocated.html), and a measured
# context: nvidia-smi shows 781MB used by a process that has only initialised CUDA
# (https://github.com/pytorch/pytorch/issues/34323); 112MiB are used on an idle V100 before any process
# (https://github.com/4paradigm/k8s-vgpu-scheduler/issues/7).
HEADROOM_NOTE = (
    "Not all of a card is free for tensors. The CUDA context (its kernels and libraries) takes hundreds of MiB "
    "before the first tensor (781 MB in pytorch/pytorch#34323), and PyTorch's caching allocator keeps freed "
    "blocks it may not be able to reuse for a larger request: on your card, torch.cuda.memory_reserved() minus "
    "torch.cuda.memory_allocated() shows what it holds. Leave that headroom below the card's total."
)


def gpu_memory_bytes(name: str) -> int:
    """Return the memory of the card ``name`` (a key of ``GPU_MEMORY_MIB``), in bytes, as nvidia-smi reports it."""
    if not isinstance(name, str) or name not in GPU_MEMORY_MIB:
        raise ValueError(f"name must be one of {sorted(GPU_MEMORY_MIB)}, got {name!r}")
    return GPU_MEMORY_MIB[name] * MIB


def figure_cards() -> dict[str, int]:
    """Return ``{card: memory in bytes}`` for the cards of ``FIGURE_CARDS``, smallest first."""
    return {name: gpu_memory_bytes(name) for name in FIGURE_CARDS}


def smallest_card_holding(num_bytes: float, cards: tuple[str, ...] = FIGURE_CARDS) -> str | None:
    """Return the name of the smallest of ``cards`` whose reported memory holds ``num_bytes``, or None.

    The whole card is counted: ``HEADROOM_NOTE`` says what to leave free of it.
    """
    check_non_negative_number(num_bytes, "num_bytes")
    if isinstance(cards, str) or not all(name in GPU_MEMORY_MIB for name in cards):
        raise ValueError(f"cards must be names of {sorted(GPU_MEMORY_MIB)}, got {cards!r}")
    fitting = [name for name in cards if num_bytes <= gpu_memory_bytes(name)]
    return min(fitting, key=gpu_memory_bytes) if fitting else None
