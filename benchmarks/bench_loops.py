"""Benchmark: the Accelerate loop's wall time over the plain loop's, same work, one process (lesson 1).

Each round trains the course checkpoint for one epoch with both loops from the
same seed, on one torch thread as in the lessons, alternating which goes first
so that neither always gets a warm cache. Prints the median time of each and
the ratio: the median over rounds of each round's Accelerate time over its
plain time. The two runs of a round follow each other, so a machine that slows
down or speeds up for a while changes both, and the round's ratio far less than
either time (the ratio of the two medians compared runs minutes apart: 1.112
and 0.923 in two quiet runs). The spread of the round ratios is printed with
it, and the same ratio in CPU seconds.

On a shared or busy machine one epoch varies by 10% or more from run to run,
so the benchmark also times the two things Accelerate adds to every batch on
its own: iterating the prepared DataLoader (it fetches one batch ahead and
moves it to the device) against the plain one, and the wrapped optimizer and
scheduler calls against the plain ones. Those are small and steady, and say
how much of any ratio is Accelerate's.
"""

import os
import statistics
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from course_utils import data, loops, models, schedules, threads
from course_utils.optimizers import make_optimizer

ROUNDS = 9
BATCH_SIZE = 32


def adam_with_schedule(model, num_training_steps):
    """Return ``(optimizer, lr_scheduler)``: Adam at 1e-3 with the course's linear warm-up and decay."""
    optimizer = make_optimizer("adam", model.parameters(), lr=1e-3)
    return optimizer, schedules.linear_schedule_with_warmup(optimizer, num_training_steps)


def time_one_run(loop, device_or_accelerator):
    """Return ``(wall, cpu)``: the seconds one epoch of ``loop`` takes from a fresh model (setup excluded)."""
    set_seed(0)
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0)
    optimizer, lr_scheduler = adam_with_schedule(model, len(train_dataloader))
    start, cpu_start = time.perf_counter(), time.process_time()
    loop(model, optimizer, lr_scheduler, train_dataloader, 1, device_or_accelerator)
    return time.perf_counter() - start, time.process_time() - cpu_start


def seconds_per_batch_of_iterating(dataloader, repeats=7):
    """Median seconds per batch of iterating ``dataloader`` without training on it."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _batch in dataloader:
            pass
        times.append((time.perf_counter() - start) / len(dataloader))
    return statistics.median(times)


def seconds_per_wrapped_calls(optimizer, lr_scheduler, steps=500):
    """Seconds per ``zero_grad``, optimizer step and scheduler step, with no gradients to apply.

    Without gradients the optimizer skips every parameter, so what is left is
    the cost of the calls themselves: what Accelerate's wrappers add to.
    """
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        optimizer.step()
        lr_scheduler.step()
    return (time.perf_counter() - start) / steps


def accelerate_overhead_per_batch(accelerator):
    """Return ``(plain_s, prepared_s)`` per batch of the data and scheduler work Accelerate wraps."""
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0)
    optimizer, lr_scheduler = adam_with_schedule(model, len(train_dataloader))
    seconds_per_batch_of_iterating(train_dataloader, repeats=1)  # warm-up
    plain = seconds_per_batch_of_iterating(train_dataloader) + seconds_per_wrapped_calls(optimizer, lr_scheduler)
    # The prepared objects get a fresh optimizer and scheduler, so that the plain
    # scheduler's steps above do not count against them.
    optimizer, lr_scheduler = adam_with_schedule(model, len(train_dataloader))
    _, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
    seconds_per_batch_of_iterating(train_dataloader, repeats=1)  # warm-up
    prepared = seconds_per_batch_of_iterating(train_dataloader) + seconds_per_wrapped_calls(optimizer, lr_scheduler)
    return plain, prepared


def main(rounds=ROUNDS):
    """Return ``{"plain_s": median, "accelerate_s": median, "ratio": median round ratio, ...}`` and print them."""
    threads.use_course_threads()  # the lessons' policy: one thread, so the other core's load does not stall each op
    accelerator = Accelerator()
    time_one_run(loops.train_plain, "cpu")  # warm-up: first-touch allocations, lazy imports
    runs = {"plain": [], "accelerate": []}  # (wall, cpu) seconds per round
    for round_index in range(rounds):
        order = [("plain", loops.train_plain, "cpu"), ("accelerate", loops.train_accelerate, accelerator)]
        for name, loop, device_or_accelerator in order if round_index % 2 == 0 else reversed(order):
            runs[name].append(time_one_run(loop, device_or_accelerator))
    plain_times = [wall for wall, _ in runs["plain"]]
    accelerate_times = [wall for wall, _ in runs["accelerate"]]
    figures = {
        "plain_s": statistics.median(plain_times),
        "accelerate_s": statistics.median(accelerate_times),
    }
    round_ratios = sorted(a / p for a, p in zip(accelerate_times, plain_times))
    figures["ratio"] = statistics.median(round_ratios)
    figures["ratio_quartiles"] = statistics.quantiles(round_ratios, n=4)[::2]
    # One thread, one process: CPU time counts the loops' own work, whatever else the machine runs.
    figures["cpu_ratio"] = statistics.median(a[1] / p[1] for a, p in zip(runs["accelerate"], runs["plain"]))
    plain_per_batch, prepared_per_batch = accelerate_overhead_per_batch(accelerator)
    seconds_per_step = figures["plain_s"] / len(data.make_dataloader("train", batch_size=BATCH_SIZE))
    figures["overhead_per_batch_ms"] = 1000 * (prepared_per_batch - plain_per_batch)
    figures["overhead_fraction_of_step"] = (prepared_per_batch - plain_per_batch) / seconds_per_step
    print(f"loop overhead, one epoch, {rounds} rounds, torch threads {torch.get_num_threads()}:")
    print(f"  plain loop       median {figures['plain_s']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in plain_times)})")
    print(f"  Accelerate loop  median {figures['accelerate_s']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in accelerate_times)})")
    low, high = figures["ratio_quartiles"]
    print(f"  ratio Accelerate / plain, median of the {rounds} rounds: {figures['ratio']:.3f} (target <= 1.05); "
          f"quartiles {low:.3f}-{high:.3f}, range {round_ratios[0]:.3f}-{round_ratios[-1]:.3f}")
    print(f"  the same in CPU seconds (the loops' own work, less sensitive to other load): {figures['cpu_ratio']:.3f}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(
        f"  Accelerate's own work per batch (prepared DataLoader and wrapped optimizer/scheduler calls, minus plain): "
        f"{figures['overhead_per_batch_ms']:.3f} ms, {100 * figures['overhead_fraction_of_step']:.2f}% "
        f"of a {1000 * seconds_per_step:.1f} ms training step"
    )
    return figures


if __name__ == "__main__":
    main()
