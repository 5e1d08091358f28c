"""Benchmark: the Accelerate loop's wall time over the plain loop's, same work, one process (lesson 1).

Each round trains the course checkpoint for one epoch with both loops from the
same seed, alternating which goes first so that neither always gets a warm cache.
Prints the median time of each and the ratio of the medians.
"""

import statistics
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from course_utils import data, loops, models

ROUNDS = 5
BATCH_SIZE = 32


def time_one_run(loop, **loop_options):
    """Return the seconds one epoch of ``loop`` takes from a fresh model (setup excluded)."""
    set_seed(0)
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0)
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, len(train_dataloader))
    start = time.perf_counter()
    loop(model, optimizer, lr_scheduler, train_dataloader, num_epochs=1, show_progress=False, **loop_options)
    return time.perf_counter() - start


def main(rounds=ROUNDS):
    """Return ``{"plain_s": median, "accelerate_s": median, "ratio": accelerate / plain}`` and print them."""
    accelerator = Accelerator()
    time_one_run(loops.train_plain)  # warm-up: first-touch allocations, lazy imports
    plain_times, accelerate_times = [], []
    for round_index in range(rounds):
        runs = [("plain", loops.train_plain, {}), ("accelerate", loops.train_accelerate, {"accelerator": accelerator})]
        for name, loop, options in runs if round_index % 2 == 0 else reversed(runs):
            (plain_times if name == "plain" else accelerate_times).append(time_one_run(loop, **options))
    figures = {
        "plain_s": statistics.median(plain_times),
        "accelerate_s": statistics.median(accelerate_times),
    }
    figures["ratio"] = figures["accelerate_s"] / figures["plain_s"]
    print(f"loop overhead, one epoch, {rounds} rounds, torch threads {torch.get_num_threads()}:")
    print(f"  plain loop       median {figures['plain_s']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in plain_times)})")
    print(f"  Accelerate loop  median {figures['accelerate_s']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in accelerate_times)})")
    print(f"  ratio Accelerate / plain: {figures['ratio']:.3f} (target <= 1.05)")
    return figures


if __name__ == "__main__":
    main()
