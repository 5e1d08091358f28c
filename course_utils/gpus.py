"""GPU memory sizes as the cards report them, for the figures that compare a plan with a card (lessons 4, 5, 7).

A vendor's sheet says "24 GB" or "80GB"; the driver reports the card's memory in
binary units (``nvidia-smi``: ``24564MiB`` for an RTX 4090, ``81920MiB`` for an
A100 80GB). A plan in bytes is compared with those bytes, not with the decimal label.
Not all of it is free for tensors: the CUDA context and the caching allocator's
fragmentation take their share first (see ``HEADROOM_NOTE``).
"""

from __future__ import annotations

from course_utils.units import MIB

# Total memory as nvidia-smi reports it, in MiB, one card per common size.
GPU_MEMORY_MIB: dict[str, int] = {
    "RTX 4090 (24 GB)": 24_564,
    "A100 80GB": 81_920,
}

HEADROOM_NOTE = (
    "The CUDA context takes a few hundred MiB before the first tensor, and the caching allocator's "
    "fragmentation a few percent more: plan to leave about 1-2 GiB of a card free."
)


def gpu_memory_bytes(name: str) -> int:
    """Return the memory of the card ``name`` (a key of ``GPU_MEMORY_MIB``) in bytes."""
    if not isinstance(name, str) or name not in GPU_MEMORY_MIB:
        raise ValueError(f"name must be one of {sorted(GPU_MEMORY_MIB)}, got {name!r}")
    return GPU_MEMORY_MIB[name] * MIB
