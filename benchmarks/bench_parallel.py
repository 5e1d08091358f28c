"""Benchmark: the same training on 1 process and on 2 processes (data parallel over gloo), on this CPU (lesson 4).

The same run both ways: the same examples in the same order and the same
optimizer steps. One process takes batches of ``2 b``; two processes take
``b`` each per step (the equivalence the lesson checks). Each run is a fresh
command, as a learner types it:

- ``python -m course_utils.train --cpu --batch-size 2b``
- ``accelerate launch --multi_gpu --num_processes 2 ... -m course_utils.train --cpu --batch-size b``

The figure compared is the wall time of the training loop, measured inside the
run (``train_seconds``: model loading and process start-up excluded); the
whole command's wall time is reported beside it. Alternating which goes first,
``ROUNDS`` runs each; prints the medians and the ratio one / two processes
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


def training_command(num_processes: int, metrics_path: Path) -> list[str]:
    """Return the command line of the benchmark's training on ``num_processes`` (1 or 2) processes."""
    if num_processes not in (1, 2):
        raise ValueError(f"num_processes must be 1 or 2, got {num_processes!r}")
    batch_size = BATCH_SIZE_PER_PROCESS * (3 - num_processes)  # 2b on one process, b on each of two
    launcher = [sys.executable] if num_processes == 1 else [sys.executable, *ACCELERATE_LAUNCH]
    return launcher + [
        "-m", "course_utils.train", "--cpu", "--no-dropout", "--batch-size", str(batch_size),
        "--epochs", str(EPOCHS), "--limit", str(LIMIT), "--metrics-json", str(metrics_path),
    ]


def run_once(num_processes: int) -> dict:
    """Run the training once on ``num_processes``; return its metrics JSON plus ``command_seconds`` (whole command)."""
    with tempfile.TemporaryDirectory() as directory:
        metrics_path = Path(directory) / "metrics.json"
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        start = time.perf_counter()
        completed = subprocess.run(
            training_command(num_processes, metrics_path), cwd=REPO_DIR, env=environment,
            capture_output=True, text=True,
        )
        command_seconds = time.perf_counter() - start
        if completed.returncode != 0:
            raise RuntimeError(f"training on {num_processes} process(es) failed:\n{completed.stderr[-3000:]}")
        return {**json.loads(metrics_path.read_text()), "command_seconds": command_seconds}


def main(rounds: int = ROUNDS) -> dict:
    """Return the medians (seconds) on 1 and 2 processes and their ratio; print them.

    Keys: ``one_process_s`` and ``two_processes_s`` (training loop), ``ratio``
    (one / two: the speed-up of two processes), ``one_process_command_s`` and
    ``two_processes_command_s`` (whole commands), ``runs`` (every run's figures).
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    runs = {1: [], 2: []}
    for round_index in range(rounds):
        for num_processes in (1, 2) if round_index % 2 == 0 else (2, 1):
            runs[num_processes].append(run_once(num_processes))
    figures = {
        "one_process_s": statistics.median(r["train_seconds"] for r in runs[1]),
        "two_processes_s": statistics.median(r["train_seconds"] for r in runs[2]),
        "one_process_command_s": statistics.median(r["command_seconds"] for r in runs[1]),
        "two_processes_command_s": statistics.median(r["command_seconds"] for r in runs[2]),
        "runs": runs,
    }
    figures["ratio"] = figures["one_process_s"] / figures["two_processes_s"]
    one, two = runs[1][0], runs[2][0]
    print(f"the same training ({EPOCHS} epochs, {LIMIT} examples, {one['steps']} steps), {rounds} runs each, "
          f"{os.cpu_count()} CPU cores:")
    print(f"  1 process  x batch {one['batch_size_per_process']:>2} ({one['threads_per_process']} threads): "
          f"training loop median {figures['one_process_s']:.2f} s, whole command {figures['one_process_command_s']:.1f} s")
    print(f"  2 processes x batch {two['batch_size_per_process']:>2} ({two['threads_per_process']} thread(s) each): "
          f"training loop median {figures['two_processes_s']:.2f} s, whole command {figures['two_processes_command_s']:.1f} s")
    print(f"  ratio 1 process / 2 processes: {figures['ratio']:.2f} (above 1: two processes are faster)")
    return figures


if __name__ == "__main__":
    main()
