"""The last lines of `make test`: one summary of its two pytest runs (the pool and the forking run).

`make test` runs the tests that fork workers beside the others, each run into a
log; this prints, after both, each run's pytest summary line and exit status,
the failing tests of both runs, and one total, then exits 1 if either run
failed (0 otherwise):

    python -m tools.test_summary NAME LOG STATUS [NAME LOG STATUS ...]

NAME: how the run is called in the summary; LOG: its pytest output; STATUS: its exit status.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# pytest's last line: "==== 1 failed, 2,448 passed, 3 skipped in 612.3s (0:10:12) ====" (or, with -q, without the =).
_SUMMARY = re.compile(r"^=*\s*((?:\d[\d,]* \w+(?:, )?)+) in [\d.]+s.*?=*$")
_COUNT = re.compile(r"(\d[\d,]*) (\w+)")
# Its short test summary: "FAILED tests/x.py::test_y - AssertionError..." and "ERROR tests/x.py - ...".
_FAILURE = re.compile(r"^(FAILED|ERROR) (\S+)")


# Each run deselects the other's tests; warnings are not tests.
_NOT_TOTALLED = {"deselected", "warning", "warnings"}


@dataclass
class Run:
    """What one pytest run reported: its name, log, exit status, summary line, counts and failing tests."""

    name: str
    log: str
    status: int
    line: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def read_run(name: str, log: str, status: int) -> Run:
    """Return the :class:`Run` that pytest's output ``log`` (a file) shows, with exit ``status``."""
    path = Path(log)
    text = path.read_text(errors="replace") if path.exists() else ""
    run = Run(name, log, status)
    for line in text.splitlines():
        line = line.strip()
        summary = _SUMMARY.match(line)
        if summary:
            run.line = summary.group(1) + line[summary.end(1):].rstrip("= ")
            run.counts = {word: int(number.replace(",", "")) for number, word in _COUNT.findall(summary.group(1))}
        failure = _FAILURE.match(line)
        if failure and f"{failure.group(1)} {failure.group(2)}" not in run.failures:
            run.failures.append(f"{failure.group(1)} {failure.group(2)}")
    return run


def summary(runs: list[Run]) -> tuple[list[str], int]:
    """Return the summary's lines and the exit status for ``runs`` (1 when any failed)."""
    lines = ["", "==== make test: both pytest runs"]
    for run in runs:
        said = run.line or "no pytest summary line (stopped, or it could not start: see the log)"
        lines.append(f"{run.name} ({run.log}): {said}; exit status {run.status}")
    failures = [f"  {failure}   ({run.name})" for run in runs for failure in run.failures]
    if failures:
        lines += ["failing:", *failures]
    total: dict[str, int] = {}
    for run in runs:
        for word, number in run.counts.items():
            if word not in _NOT_TOTALLED:
                total[word] = total.get(word, 0) + number
    failed = any(run.status != 0 for run in runs)
    in_all = ", ".join(f"{number:,} {word}" for word, number in total.items()) or "nothing counted"
    lines.append(f"in all: {in_all}: {'FAILED' if failed else 'passed'}")
    return lines, int(failed)


def main(argv: list[str]) -> int:
    if not argv or len(argv) % 3:
        raise SystemExit("usage: python -m tools.test_summary NAME LOG STATUS [NAME LOG STATUS ...]")
    runs = []
    for i in range(0, len(argv), 3):
        name, log, status = argv[i:i + 3]
        if not status.lstrip("-").isdigit():
            raise SystemExit(f"STATUS must be an exit status (an integer), got {status!r} for {name}")
        runs.append(read_run(name, log, int(status)))
    lines, status = summary(runs)
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
