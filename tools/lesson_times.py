"""How long each lesson takes to run top to bottom: measured by the notebook build, shown on the landing page.

``python -m tools.build_notebooks`` times each learner copy's execution (a fresh
kernel, then every cell in order: what Run All does in JupyterLab) and records it
in ``notebooks/lesson_times.json``, with the fingerprint of the cells that ran, the
CPU, the cores the build could use and the load average when it started (other
work on the machine slows a run). The table in ``notebooks/README.md`` between
``BEGIN`` and ``END`` is written from that file, never typed;
``tests/tools/test_lesson_times.py`` checks that every lesson's time is this
version's (its fingerprint is the committed learner copy's) and that the table
says what the file says. ``--times`` re-times the lessons without rebuilding them.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

TIMES_NAME = "lesson_times.json"
README_NAME = "README.md"
BEGIN = "<!-- lesson times: written by tools/lesson_times.py from lesson_times.json, do not edit -->"
END = "<!-- end of lesson times -->"


def this_machine() -> dict[str, object]:
    """Return the CPU's name, the cores this process may use and the 1-minute load average, as the record keeps them."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": name, "cores": cores, "load_average": None if load is None else round(load, 1)}


def read_times(notebooks_dir: str | Path) -> dict[str, dict]:
    """Return ``{lesson name: its record}`` from ``notebooks_dir/lesson_times.json`` ({} when there is none)."""
    path = Path(notebooks_dir) / TIMES_NAME
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def record(notebooks_dir: str | Path, lesson_name: str, cells_sha256: str, seconds: float,
           machine: dict[str, object] | None = None) -> None:  # fmt: skip
    """Record that the learner copy of ``lesson_name`` with cells ``cells_sha256`` ran in ``seconds`` on ``machine``."""
    if not seconds > 0:
        raise ValueError(f"seconds must be a positive run time, got {seconds!r}")
    times = read_times(notebooks_dir)
    times[lesson_name] = {"seconds": round(seconds, 1), "cells_sha256": cells_sha256, **(machine or this_machine())}
    path = Path(notebooks_dir) / TIMES_NAME
    path.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n", encoding="utf-8")


def shown_time(seconds: float) -> str:
    """Return ``seconds`` as the table shows it: seconds under 90 s, else minutes to one decimal."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def table(times: dict[str, dict]) -> str:
    """Return the Markdown table of ``times`` (one row per lesson, in lesson order) between its markers."""
    rows = [BEGIN, "| Lesson | Run All took | on | cores | load average then |", "| --- | --- | --- | --- | --- |"]
    for name, entry in sorted(times.items()):
        load = "unknown" if entry.get("load_average") is None else f"{entry['load_average']:.1f}"
        rows.append(f"| {int(name[:2])} | {shown_time(entry['seconds'])} | {entry['cpu']} | {entry['cores']} | {load} |")
    return "\n".join(rows + [END])


def with_table(readme: str, times: dict[str, dict]) -> str:
    """Return the landing page ``readme`` with its table of lesson times (between the markers) written from ``times``."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the landing page must hold the markers {BEGIN!r} and {END!r}, in that order")
    return readme[:start] + table(times) + readme[end + len(END):]


def write_readme_table(notebooks_dir: str | Path) -> bool:
    """Write the table of ``notebooks_dir/README.md`` from the recorded times; return True if it changed."""
    path = Path(notebooks_dir) / README_NAME
    if not path.exists():
        return False
    readme = path.read_text(encoding="utf-8")
    updated = with_table(readme, read_times(notebooks_dir))
    if updated != readme:
        path.write_text(updated, encoding="utf-8")
    return updated != readme
