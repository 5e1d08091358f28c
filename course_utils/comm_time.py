"""Communication time: the bytes a process hands to each collective, turned into seconds on sourced links (lesson 7).

A ring collective on N processes sends, per process (the NCCL tests'
"bus bandwidth" factors, ``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests):

- all-reduce of S bytes: 2 (N-1)/N x S (a reduce-scatter, then an all-gather);
- reduce-scatter of an S-byte input: (N-1)/N x S;
- all-gather of an s-byte shard (output N x s): (N-1) x s;
- broadcast of S bytes: S (pipelined along the ring).

:func:`wire_bytes` applies them; :func:`seconds_on` divides by a link's
bandwidth per GPU and direction (:data:`LINKS`, read from the sourced table of
:mod:`course_utils.hardware`): the time a step's messages need at the very
least, with no latency and no contention. A ring is as fast as its slowest hop: on several nodes that is
the network, whatever NVLink does inside a node. None of these figures is
measured here; a CPU run over gloo says nothing about them.
"""

from __future__ import annotations

from course_utils import hardware
from course_utils.validation import check_choice, check_non_negative_number, check_positive_int, check_positive_number

__all__ = [
    "COLLECTIVES", "GPU_PEAKS", "LINKS", "compute_seconds_at_peak", "scaled_step_wire_bytes", "seconds_on", "wire_bytes",
]

COLLECTIVES = ("all_reduce", "reduce_scatter_single", "all_gather_single", "broadcast")
"""The collectives :class:`course_utils.sharding.CollectiveCounter` counts, by the names it counts them under."""

_H100 = hardware.card("H100 SXM")

LINKS: dict[str, hardware.Figure] = {
    "NVLink 4, inside an H100 node": _H100.links["nvlink"],
    "InfiniBand NDR, between nodes": hardware.NETWORKS["InfiniBand NDR 400 Gb/s per GPU"],
    "PCIe Gen5 x16, GPU to host": _H100.links["pcie"],
}
"""Bandwidth per GPU and per direction (bytes per second, ``.value``) with its ``.source``: :mod:`course_utils.hardware`'s."""

GPU_PEAKS: dict[str, hardware.Figure] = {"H100 SXM, bf16 dense": _H100.peaks["bf16"]}
"""Peak arithmetic of one GPU (FLOP per second, ``.value``) with its ``.source``: :mod:`course_utils.hardware`'s."""


def wire_bytes(collective: str, payload: float, world_size: int) -> float:
    """Return the bytes one process sends for ``collective`` on a ring of ``world_size``, given its ``payload``.

    ``payload`` is what the process hands in (bytes): the whole tensor for an
    all-reduce, a reduce-scatter or a broadcast, its own shard for an all-gather.
    """
    check_choice(collective, "collective", COLLECTIVES)
    check_non_negative_number(payload, "payload")
    check_positive_int(world_size, "world_size")
    n = world_size
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter_single": (n - 1) / n,
              "all_gather_single": n - 1, "broadcast": 1 if n > 1 else 0}[collective]
    return factor * payload


def seconds_on(link: str, num_bytes: float) -> float:
    """Return the seconds ``num_bytes`` take at the bandwidth of ``link`` (a name of :data:`LINKS`): a lower bound."""
    check_choice(link, "link", tuple(LINKS))
    check_non_negative_number(num_bytes, "num_bytes")
    return num_bytes / LINKS[link].value


def compute_seconds_at_peak(num_parameters: float, tokens: float, peak: str) -> float:
    """Return the seconds a training step's 6 x parameters x tokens FLOPs take at ``peak`` (a name of :data:`GPU_PEAKS`).

    The PaLM paper's count (forward 2, backward 4 FLOPs per parameter and
    token, attention left out): at the data sheet's peak, the least time the
    compute can take, and so the most communication it can hide.
    """
    check_positive_number(num_parameters, "num_parameters")
    check_positive_number(tokens, "tokens")
    check_choice(peak, "peak", tuple(GPU_PEAKS))
    return 6 * num_parameters * tokens / GPU_PEAKS[peak].value


def scaled_step_wire_bytes(counted: dict, measured_world_size: int, scale: float, world_size: int) -> float:
    """Return the bytes one process sends per step on ``world_size`` processes, for a model ``scale`` times the measured one.

    ``counted`` is one process's payload per collective in a run on
    ``measured_world_size`` processes (``ProcessMemory.communicated``). Every
    payload grows with the model; an all-gather's, a shard, also shrinks as
    1 / ``world_size``. Padding is left out.
    """
    if not isinstance(counted, dict) or not all(name in COLLECTIVES for name in counted):
        raise ValueError(f"counted must be a dict with keys among {COLLECTIVES}, got {counted!r}")
    check_positive_int(measured_world_size, "measured_world_size")
    check_positive_number(scale, "scale")
    check_positive_int(world_size, "world_size")
    total = 0.0
    for name, payload in counted.items():
        payload = payload * scale
        if name == "all_gather_single":
            payload = payload * measured_world_size / world_size
        total += wire_bytes(name, payload, world_size)
    return total
