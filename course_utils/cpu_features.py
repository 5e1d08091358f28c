"""What this CPU's instruction set offers the course's branches: bf16 matrix units, read from the CPU's own flags.

Libraries take different paths on different CPUs, and a sentence about bf16
speed depends on one fact torch does not report:
``torch.backends.cpu.get_cpu_capability()`` says "AVX512" with and without bf16
matrix instructions. The operating system does (Linux, ``/proc/cpuinfo``):

- :func:`cpu_flags` returns the CPU's feature flags (x86 ``flags``, Arm
  ``Features``), empty where they cannot be read (not Linux);
- :func:`has_bf16_matrix_units` says whether the CPU multiplies bf16 matrices
  in hardware (x86 ``amx_bf16`` or ``avx512_bf16``, Arm ``bf16``); pass
  ``flags`` to decide it for another CPU (the tests force both outcomes so);
- :func:`cpu_matrix_units` names those units, for the sentences lessons 5 and 8
  build from the learner's run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["BF16_MATRIX_FLAGS", "cpu_flags", "cpu_matrix_units", "has_bf16_matrix_units", "read_cpuinfo"]

CPUINFO = Path("/proc/cpuinfo")
# Intel AMX (Sapphire Rapids and later), AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake and later),
# Arm's BF16 extension (BFMMLA; Neoverse V1/N2, Graviton 3 and later).
BF16_MATRIX_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
_UNIT_NAMES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16", "bf16": "Arm BF16"}


def read_cpuinfo() -> str | None:
    """Return the text of ``/proc/cpuinfo``, or None where there is none (macOS, Windows)."""
    try:
        return CPUINFO.read_text(encoding="utf-8")
    except OSError:
        return None


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """Return the feature flags of this CPU (of ``cpuinfo``, text as ``/proc/cpuinfo`` gives, when passed).

    Empty where ``/proc/cpuinfo`` cannot be read (macOS, Windows).
    """
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
        if cpuinfo is None:
            return frozenset()
    if not isinstance(cpuinfo, str):
        raise TypeError(f"cpuinfo must be the text of /proc/cpuinfo (str) or None, got {type(cpuinfo).__name__}")
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # the first processor's; all cores of a machine share them
            return frozenset(value.split())
    return frozenset()


def has_bf16_matrix_units(flags: Iterable[str] | None = None) -> bool:
    """Return whether the CPU with feature ``flags`` (None: this one's) multiplies bf16 matrices in hardware.

    True for ``amx_bf16``, ``avx512_bf16`` (x86) or ``bf16`` (Arm); False
    without them, and where the flags cannot be read (not Linux).
    """
    flags = cpu_flags() if flags is None else flags
    if isinstance(flags, str) or not isinstance(flags, Iterable):
        raise TypeError(f"flags must be a collection of CPU flag names (str), e.g. {{'avx512_bf16'}}, got {flags!r}")
    flags = frozenset(flags)
    if not all(isinstance(flag, str) for flag in flags):
        raise TypeError(f"flags must be a collection of CPU flag names (str), got {sorted(map(repr, flags))}")
    return not BF16_MATRIX_FLAGS.isdisjoint(flags)


def cpu_matrix_units(flags: Iterable[str] | None = None) -> tuple[str, ...] | None:
    """Return the names of the bf16 matrix units in ``flags`` (None: this CPU's), () for none, None if unknown.

    Unknown means no ``flags`` were passed and this system does not report them (not Linux).
    """
    if flags is None:
        if read_cpuinfo() is None:
            return None
        flags = cpu_flags()
    if isinstance(flags, str) or not isinstance(flags, Iterable):
        raise TypeError(f"flags must be a collection of CPU flag names (str), e.g. {{'avx512_bf16'}}, got {flags!r:.80}")
    flags = frozenset(flags)
    if not all(isinstance(flag, str) for flag in flags):
        raise TypeError(f"flags must be a collection of CPU flag names (str), got {sorted(map(repr, flags))}")
    return tuple(name for flag, name in _UNIT_NAMES.items() if flag in flags)
