"""Benchmark: each learner notebook executed end to end in a fresh kernel, on a quiet machine and beside a CPU hog.

Quiet: median of 3 runs, with the kernel's peak memory. Busy: the same notebook
while one busy-loop process (started here) keeps a core occupied, as another
program would on a learner's 2-core laptop; the target is at most twice the
quiet time (issue 10: with two torch threads a lesson once took 20 times longer).

The kernel's memory is sampled every 20 ms (resident set size of the kernel
process and its children), so the peak is a lower bound that misses only
spikes shorter than that.

A run in which a cell hangs (a lost kernel message, ``tools/notebook_watchdog.py``)
is discarded and run once more, and the output says so.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil

REPO = Path(__file__).resolve().parents[1]
from tools.notebook_watchdog import CellDeadlineError, WatchedNotebookClient

NOTEBOOKS = REPO / "notebooks"
# Targets from the course's issues, by lesson number: seconds on a quiet machine, and
# peak kernel memory in GB (10^9 bytes, as the issues write them) (None: no target).
TARGETS = {"01": (60, None), "02": (60, 3), "03": (90, 4), "04": (90, None), "05": (90, None), "06": (90, None)}
BUSY_FACTOR_TARGET = 2.0  # busy time at most this many times the quiet one


@contextlib.contextmanager
def cpu_hog():
    """Keep one core busy for the duration of the ``with`` block: one Python process in an endless loop."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait()


class PeakMemorySampler(threading.Thread):
    """Samples the resident memory of a process and its children; ``peak_bytes`` is the largest total seen."""

    def __init__(self, pid, interval_s=0.02):
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            try:
                processes = [self.process, *self.process.children(recursive=True)]
                total = sum(p.memory_info().rss for p in processes)
            except psutil.Error:  # the kernel is shutting down
                break
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop_event.wait(self.interval_s)

    def stop(self):
        self._stop_event.set()
        self.join()


def run_once(path):
    """Execute the notebook at ``path`` in a fresh kernel; return (seconds, peak kernel bytes)."""
    notebook = nbformat.read(path, as_version=4)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    client = WatchedNotebookClient(
        notebook, label=str(path.relative_to(REPO)), timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        # Quiets the kernel's own log ("running over TCP without encryption"); cell outputs are unaffected.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    start = time.perf_counter()
    with client.setup_kernel(env=env):
        sampler = PeakMemorySampler(client.km.provisioner.process.pid)
        sampler.start()
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        sampler.stop()
    return time.perf_counter() - start, sampler.peak_bytes


def run_timed(path):
    """``run_once(path)``; if a cell hung (a lost kernel message: ``notebook_watchdog``), says so and runs it once more.

    The hung run's time measures the deadline, not the lesson. A second hang raises.
    """
    try:
        return run_once(path)
    except CellDeadlineError as error:
        print(f"  {error}\n  that run is discarded: running {path.name} once more", flush=True)
        return run_once(path)


def main(names=None, repeats=3, busy_repeats=1):
    """Return ``{name: {"median_s", "runs_s", "peak_gb", "busy_s", "busy_factor"}}`` for the learner notebooks; print a table.

    ``busy_s`` is the median time of ``busy_repeats`` runs beside a CPU hog,
    ``busy_factor`` that time over the quiet median.
    """
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in names)]
    figures = {}
    for path in paths:
        runs = [run_timed(path) for _ in range(repeats)]
        with cpu_hog():
            busy = [run_timed(path)[0] for _ in range(busy_repeats)]
        seconds = [s for s, _ in runs]
        figures[path.stem] = {
            "median_s": statistics.median(seconds),
            "runs_s": seconds,
            "peak_gb": max(peak for _, peak in runs) / 1e9,  # GB, as the targets are written
            "busy_s": statistics.median(busy),
            "busy_factor": statistics.median(busy) / statistics.median(seconds),
        }
    print(f"learner notebooks, fresh kernel each run: quiet median of {repeats}, "
          f"busy (one CPU hog beside it) median of {busy_repeats}:")
    for name, result in figures.items():
        time_target, memory_target = TARGETS.get(name[:2], (None, None))
        runs = ", ".join(f"{s:.1f}" for s in result["runs_s"])
        line = f"  {name:<34} quiet {result['median_s']:6.1f} s (runs {runs})"
        line += f" target <= {time_target} s" if time_target else ""
        line += f"   busy {result['busy_s']:6.1f} s = {result['busy_factor']:.2f}x quiet (target <= {BUSY_FACTOR_TARGET:g}x)"
        line += f"   kernel peak {result['peak_gb']:.2f} GB"
        line += f" (target < {memory_target} GB)" if memory_target else ""
        print(line)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 03 (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="quiet runs per notebook (default 3)")
    parser.add_argument("--busy-repeats", type=int, default=1, help="runs beside a CPU hog per notebook (default 1)")
    arguments = parser.parse_args()
    for option, value in (("--repeats", arguments.repeats), ("--busy-repeats", arguments.busy_repeats)):
        if value < 1:  # each is reported as a median: at least one run
            parser.error(f"{option} must be at least 1, got {value}")
    main(arguments.names, arguments.repeats, arguments.busy_repeats)
