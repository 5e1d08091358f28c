"""The course kernel: hide the library lines known to be harmless, then start an IPython kernel.

The course's kernelspec (``python -m tools.open_lab --install-kernel``) runs
``python -P -m tools.course_kernel`` where a plain kernelspec runs ``python -m ipykernel_launcher``. Everything a
lesson runs in (``make lab``, the notebook builds, the tests) starts here.

Why ``-P``: a kernel starts in the notebook's folder, and ``python -m`` puts that folder
first on ``sys.path``, so a learner's ``logging.py`` (any file named like a module the
kernel imports) or ``tools/`` folder there would be imported instead while the kernel
starts, and kill every kernel. ``-P`` leaves it out (the repository root comes from
PYTHONPATH); once the kernel is up, the folder goes back on the path where IPython puts
it (after the standard library), for the learner's own imports, as in a plain kernel.

Why here and not in ``course_utils``: a line a library logs *at import* can only
be silenced before the library is imported, and a lesson's first cell imports
``transformers`` before ``course_utils`` (transformers imports peft, which
imports bitsandbytes). The kernel's start is the one place that comes first.

Each silenced line is matched by its logger (a logged line) or its category (a
Python warning) and the start of its message, so that anything else the same
library says still shows. tests/test_notebook_kernel.py forces each branch that
prints one, on any machine.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

# {logger name: starts of the messages it logs that are known to be harmless}.
HARMLESS_LOG_LINES: dict[str, tuple[str, ...]] = {
    # bitsandbytes 0.50, at import, only on CPUs with AVX512-BF16 (AMD Zen 4 and later,
    # Intel Sapphire Rapids and later): it tries to fetch an optional 4-bit matrix-multiply
    # kernel from the Hugging Face hub through the `kernels` package, which the course does
    # not install (and the kernel is offline), logs this WARNING, and uses its own built-in
    # kernel instead. Only 4-bit inference (QLoRA) would call it; the course never does.
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
    # ipykernel 7, at every kernel start (the "[IPKernelApp] WARNING" line in make lab's terminal):
    # its sockets are not encrypted. Jupyter binds a kernel's ports to 127.0.0.1 (the connection
    # file's ip), so nothing leaves the machine; anything else the kernel app logs still shows.
    "IPKernelApp": ("Kernel is running over TCP without encryption",),
}


# (warning category, start of its message) of Python warnings known to be harmless.
HARMLESS_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # huggingface_hub (imported by transformers), at import, only when the learner's shell sets
    # HF_HUB_ENABLE_HF_TRANSFER (older Hugging Face guides recommend it): the variable no longer
    # does anything, and the course never downloads.
    (FutureWarning, "The `HF_HUB_ENABLE_HF_TRANSFER` environment variable is deprecated"),
)


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


def silence_harmless_warnings(harmless: tuple[tuple[type[Warning], str], ...] = HARMLESS_WARNINGS) -> None:
    """Ignore each warning in ``harmless`` (matched by category and the start of its message)."""
    for category, start in harmless:
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)


def put_the_notebook_folder_on_the_path(path: list[str] = sys.path) -> None:
    """Insert ``""`` (the kernel's working folder: the notebook's) into ``path`` where IPython would.

    That is before the first ``site-packages`` (or ``dist-packages``) entry, after the
    standard library, as ``IPython.core.shellapp.InteractiveShellApp.init_path`` does
    for a plain kernel; it skips that step under ``-P``, so the course kernel does it
    here, once the kernel has imported what it needs.
    """
    if "" in path:
        return
    places = [index for index, entry in enumerate(path) if Path(entry).name in ("site-packages", "dist-packages")]
    path.insert(places[0] if places else 0, "")


if __name__ == "__main__":
    silence_harmless_log_lines()
    silence_harmless_warnings()
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()  # as ipykernel's launch_new_instance, with the path step between
    app.initialize()
    put_the_notebook_folder_on_the_path()
    app.start()
