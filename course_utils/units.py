"""Units of memory, and how the course writes a number of bytes (every lesson).

The course counts memory in binary units, as torch and the operating system do:
1 KiB = 1024 bytes, 1 MiB = 1024**2, 1 GiB = 1024**3. GPU sizes on a vendor's
sheet ("a 24 GB card") are decimal, so ``GB = 1000**3`` is here too.
"""

from __future__ import annotations

from course_utils.validation import check_non_negative_int, check_non_negative_number

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
GB = 1000**3

_BINARY_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def format_bytes(num_bytes: float, digits: int = 1) -> str:
    """Return ``num_bytes`` in the largest binary unit that keeps it at least 1: ``'501.9 MiB'``, ``'12.3 GiB'``."""
    check_non_negative_number(num_bytes, "num_bytes")
    check_non_negative_int(digits, "digits")
    for unit, size in _BINARY_UNITS:
        if num_bytes >= size:
            return f"{num_bytes / size:,.{digits}f} {unit}"
    return f"{num_bytes:,.0f} bytes"
