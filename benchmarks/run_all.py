"""Run every benchmark of the course and print its figures (`make bench`).

Each benchmark module has a ``main()`` that prints its own table and returns
its figures. Run one alone with ``python -m benchmarks.bench_<name>`` from the repository root.
"""

import importlib
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

BENCHMARKS = ["bench_loops", "bench_memory", "bench_step_timeline", "planner_sweep", "family_sweep", "bench_parallel",
              "bench_notebooks"]


def main():
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").main()
        print(f"({name} took {time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
