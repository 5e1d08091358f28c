"""The course kernel: hide the library lines known to be harmless, then start an IPython kernel.

The course's kernelspec (``scripts/open_lab.py --install-kernel``) runs this file
where a plain kernelspec runs ``python -m ipykernel_launcher``. Everything a
lesson runs in (``make lab``, the notebook builds, the tests) starts here.

Why here and not in ``course_utils``: a line a library logs *at import* can only
be silenced before the library is imported, and a lesson's first cell imports
``transformers`` before ``course_utils`` (transformers imports peft, which
imports bitsandbytes). The kernel's start is the one place that comes first.

Each silenced line is matched by its logger and the start of its message, so
that anything else the same library says still shows.
"""

from __future__ import annotations

import logging
import os
import sys

# {logger name: starts of the messages it logs that are known to be harmless}.
HARMLESS_LOG_LINES: dict[str, tuple[str, ...]] = {
    # bitsandbytes 0.50, at import, only on CPUs with AVX512-BF16 (AMD Zen 4 and later,
    # Intel Sapphire Rapids and later): it tries to fetch an optional 4-bit matrix-multiply
    # kernel from the Hugging Face hub through the `kernels` package, which the course does
    # not install (and the kernel is offline), logs this WARNING, and uses its own built-in
    # kernel instead. Only 4-bit inference (QLoRA) would call it; the course never does.
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
}


class DropHarmless(logging.Filter):
    """A logging filter that drops the records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def silence_harmless_log_lines(lines: dict[str, tuple[str, ...]] = HARMLESS_LOG_LINES) -> None:
    """Attach a ``DropHarmless`` filter to each logger named in ``lines`` (once per logger)."""
    for name, starts in lines.items():
        logger = logging.getLogger(name)
        if not any(isinstance(existing, DropHarmless) for existing in logger.filters):
            logger.addFilter(DropHarmless(starts))


if __name__ == "__main__":
    silence_harmless_log_lines()
    # As ipykernel_launcher does: the kernel's imports must not find this script's folder first.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
