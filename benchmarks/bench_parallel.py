"""Benchmark: the same training on 1 process and on 2 processes (data parallel over gloo), on this CPU (lesson 6).

The same run each way: the same examples in the same order and the same
optimizer steps. One process takes batches of ``2 b``; two processes take
``b`` each per step (the equivalence the lesson checks). Each run is a fresh
command, as a learner types it:

- ``python -m course_utils.train --cpu --batch-size 2b``: one process, PyTorch's
  default threads (every core);
- the same with ``--threads 1``: one process, one core;
- ``accelerate launch --multi_gpu --num_processes 2 ... -m course_utils.train --cpu --batch-size b``:
  two processes, one thread each (the launcher's default).

The figure compared is the wall time of the training loop, measured inside the
run (``train_seconds``: model loading and process start-up excluded); the
whole command's wall time is reported beside it. ``ROUNDS`` runs of each, in
rotating order; prints the medians and the ratios one process / two processes
(above 1: two processes are faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course_utils import REPO_DIR

ROUNDS = 3
BATCH_SIZE_PER_PROCESS = 16
EPOCHS = 2
LIMIT = 512  # training examples: 16 optimizer steps per epoch either way

# Flags that silence accelerate launch's warning about defaults when no config file exists.
ACCELERATE_LAUNCH = [
    "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
]


# name -> (processes, threads per process or None for PyTorch's default)
SETUPS = {
    "one_process": (1, None),
    "one_process_one_thread": (1, 1),
    "two_processes": (2, None),
}


def training_command(num_processes: int, metrics_path: Path, threads: int | None = None) -> list[str]:
    """Return the command line of the benchmark's training on ``num_processes`` (1 or 2) processes."""
    if num_processes not in (1, 2):
        raise ValueError(f"num_processes must be 1 or 2, got {num_processes!r}")
    batch_size = BATCH_SIZE_PER_PROCESS * (3 - num_processes)  # 2b on one process, b on each of two
    launcher = [sys.executable] if num_processes == 1 else [sys.executable, *ACCELERATE_LAUNCH]
    command = launcher + [
        "-m", "course_utils.train", "--cpu", "--no-dropout", "--batch-size", str(batch_size),
        "--epochs", str(EPOCHS), "--limit", str(LIMIT), "--metrics-json", str(metrics_path),
    ]
    return command + (["--threads", str(threads)] if threads is not None else [])


def run_once(num_processes: int, threads: int | None = None) -> dict:
    """Run the training once; return its metrics JSON plus ``command_seconds`` (the whole command's wall time)."""
    with tempfile.TemporaryDirectory() as directory:
        metrics_path = Path(directory) / "metrics.json"
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        start = time.perf_counter()
        completed = subprocess.run(
            training_command(num_processes, metrics_path, threads), cwd=REPO_DIR, env=environment,
            capture_output=True, text=True,
        )
        command_seconds = time.perf_counter() - start
        if completed.returncode != 0:
            raise RuntimeError(f"training on {num_processes} process(es) failed:\n{completed.stderr[-3000:]}")
        return {**json.loads(metrics_path.read_text()), "command_seconds": command_seconds}


def main(rounds: int = ROUNDS) -> dict:
    """Return the median times (seconds) of each setup and the ratios; print them.

    Keys: ``<setup>_s`` (training loop) and ``<setup>_command_s`` (whole
    command) for each setup of :data:`SETUPS`; ``ratio`` = one process (default
    threads) / two processes and ``ratio_one_thread`` = one process with one
    thread / two processes (above 1: two processes are faster); ``runs``
    (every run's figures).
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    names = list(SETUPS)
    runs = {name: [] for name in names}
    for round_index in range(rounds):
        # Rotate the order, so that no setup always runs first (cold caches) or last.
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            runs[name].append(run_once(*SETUPS[name]))
    figures = {"runs": runs}
    for name in names:
        figures[f"{name}_s"] = statistics.median(r["train_seconds"] for r in runs[name])
        figures[f"{name}_command_s"] = statistics.median(r["command_seconds"] for r in runs[name])
    figures["ratio"] = figures["one_process_s"] / figures["two_processes_s"]
    figures["ratio_one_thread"] = figures["one_process_one_thread_s"] / figures["two_processes_s"]
    first = runs["one_process"][0]
    print(f"the same training ({EPOCHS} epochs, {LIMIT} examples, {first['steps']} steps), {rounds} runs each, "
          f"{os.cpu_count()} CPU cores:")
    for name in names:
        run = runs[name][0]
        print(f"  {run['num_processes']} process(es) x batch {run['batch_size_per_process']:>2}, "
              f"{run['threads_per_process']} thread(s) each: training loop median {figures[name + '_s']:.2f} s, "
              f"whole command {figures[name + '_command_s']:.1f} s")
    print(f"  ratio 1 process / 2 processes: {figures['ratio']:.2f}; with one thread for the single process: "
          f"{figures['ratio_one_thread']:.2f} (above 1: two processes are faster)")
    return figures


if __name__ == "__main__":
    main()
