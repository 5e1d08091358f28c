"""Benchmark: each learner notebook executed end to end in a fresh kernel (median of 3), with the kernel's peak memory.

The kernel's memory is sampled every 20 ms (resident set size of the kernel
process and its children), so the peak is a lower bound that misses only
spikes shorter than that.
"""

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
# Targets from the course's issues: seconds, and peak kernel memory in GB (10^9 bytes, as the issues write them) (None: no target).
TARGETS = {
    "01_from_loop_to_accelerator": (60, None),
    "02_adamw_ema_states": (60, 3),
    "03_memory_efficient_optimizers": (90, 4),
    "06_data_parallel": (90, None),
}


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
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
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


def main(names=None, repeats=3):
    """Return ``{name: {"median_s", "runs_s", "peak_gb"}}`` for the learner notebooks, and print a table."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in names)]
    figures = {}
    for path in paths:
        runs = [run_once(path) for _ in range(repeats)]
        seconds = [s for s, _ in runs]
        figures[path.stem] = {
            "median_s": statistics.median(seconds),
            "runs_s": seconds,
            "peak_gb": max(peak for _, peak in runs) / 1e9,  # GB, as the targets are written
        }
    print(f"learner notebooks, fresh kernel each run, median of {repeats}:")
    for name, result in figures.items():
        time_target, memory_target = TARGETS.get(name, (None, None))
        runs = ", ".join(f"{s:.1f}" for s in result["runs_s"])
        line = f"  {name:<34} {result['median_s']:6.1f} s (runs {runs})"
        line += f"  target <= {time_target} s" if time_target else ""
        line += f"   kernel peak {result['peak_gb']:.2f} GB"
        line += f" (target < {memory_target} GB)" if memory_target else ""
        print(line)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 03 (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per notebook (default 3)")
    arguments = parser.parse_args()
    main(arguments.names, arguments.repeats)
