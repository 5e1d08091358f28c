"""Figures about data parallelism (lesson 6). Every figure has a title; charts have labelled axes and units.

- :func:`plot_data_parallel_flow`: one step of data-parallel training, as boxes and arrows;
- :func:`plot_shards`: which examples each process trains on at each step;
- :func:`plot_wall_times`: measured training times on 1 and on N processes.

Each function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

__all__ = ["plot_data_parallel_flow", "plot_learning_rate_sweep", "plot_shards", "plot_wall_times"]

_PROCESS_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"]


def plot_data_parallel_flow(num_processes: int = 2):
    """Draw one step of data-parallel training on ``num_processes`` processes (2 to 4); return the Figure.

    Top to bottom: a batch is cut into shards, one per process; each process
    runs the forward and backward pass on its shard with its own copy of the
    model; the gradients are averaged across processes; every process takes
    the same optimizer step, so the copies stay identical.
    """
    if not isinstance(num_processes, int) or isinstance(num_processes, bool) or not 2 <= num_processes <= 4:
        raise ValueError(f"num_processes must be an int from 2 to 4, got {num_processes!r}")
    figure, ax = plt.subplots(figsize=(2.9 * num_processes + 1.2, 6.2))
    ax.set_xlim(0, num_processes)
    ax.set_ylim(0, 7.2)
    ax.axis("off")
    width = 0.84

    def box(x_centre, y, text, colour, box_width=width, height=0.62, bold=False):
        ax.add_patch(FancyBboxPatch(
            (x_centre - box_width / 2, y - height / 2), box_width, height,
            boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=colour, edgecolor="#333333", linewidth=1.0,
        ))
        ax.text(x_centre, y, text, ha="center", va="center", fontsize=9, fontweight="bold" if bold else "normal")

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12, color="#333333"))

    middle = num_processes / 2
    rows = {"batch": 6.6, "shard": 5.5, "forward": 4.5, "backward": 3.5, "reduce": 2.4, "step": 1.3, "weights": 0.4}
    box(middle, rows["batch"], f"the next examples of the seeded shuffle, cut into {num_processes} equal shards",
        "#eeeeee", box_width=num_processes - 0.2)
    for rank in range(num_processes):
        x = rank + 0.5
        colour = _PROCESS_COLOURS[rank] + "55"  # the process's colour, light
        arrow(x, rows["batch"] - 0.32, x, rows["shard"] + 0.32)
        box(x, rows["shard"], f"process {rank}: shard {rank}\nits own examples", colour, bold=True)
        arrow(x, rows["shard"] - 0.32, x, rows["forward"] + 0.32)
        box(x, rows["forward"], "forward pass, mean loss\n(its full model copy)", colour)
        arrow(x, rows["forward"] - 0.32, x, rows["backward"] + 0.32)
        box(x, rows["backward"], f"backward: gradients g{rank}\nof its own loss", colour)
        arrow(x, rows["backward"] - 0.32, x, rows["reduce"] + 0.42)
        arrow(x, rows["reduce"] - 0.42, x, rows["step"] + 0.32)
        box(x, rows["step"], "optimizer.step() with g\nlr_scheduler.step()", colour)
        arrow(x, rows["step"] - 0.32, x, rows["weights"] + 0.27)
        box(x, rows["weights"], "new weights", colour, height=0.5)
    terms = " + ".join(f"g{rank}" for rank in range(num_processes))
    box(middle, rows["reduce"], f"all-reduce during the backward pass (DDP's hooks on the prepared model):\n"
        f"every process receives g = ({terms}) / {num_processes}",
        "#fff2cc", box_width=num_processes - 0.2, height=0.8, bold=True)
    ax.text(middle, -0.15, "The same g everywhere, so the copies take the same step and stay identical.",
            ha="center", va="center", fontsize=9, style="italic")
    ax.set_title("Data parallelism: one model copy per process, gradients averaged before the step")
    figure.tight_layout()
    return figure


def plot_shards(shards, title: str = "Which examples each process trains on"):
    """Draw ``shards[process][step]`` (lists of example indices) as a grid: a row per process, a column per step.

    Examples that appear a second time in the epoch (Accelerate repeats the
    first examples to give every process a full last batch) are hatched.
    Returns the Figure.
    """
    if not isinstance(shards, (list, tuple)) or not shards or not all(isinstance(s, (list, tuple)) and s for s in shards):
        raise ValueError("shards must be a non-empty list (one per process) of non-empty lists of batches")
    num_processes, num_steps = len(shards), max(len(s) for s in shards)
    figure, ax = plt.subplots(figsize=(1.5 + 1.35 * num_steps, 0.9 + 0.75 * num_processes))
    seen = set()
    for step in range(num_steps):
        for process in range(num_processes):
            if step >= len(shards[process]):
                continue
            batch = list(shards[process][step])
            repeated = any(index in seen for index in batch)
            seen.update(batch)
            ax.add_patch(plt.Rectangle(
                (step, process), 0.94, 0.86, facecolor=_PROCESS_COLOURS[process % len(_PROCESS_COLOURS)] + "66",
                edgecolor="#333333", hatch="///" if repeated else None, linewidth=0.8,
            ))
            ax.text(step + 0.47, process + 0.43, ", ".join(map(str, batch)), ha="center", va="center", fontsize=9)
    ax.set_xlim(-0.05, num_steps)
    ax.set_ylim(num_processes, -0.1)
    ax.set_xticks([step + 0.47 for step in range(num_steps)], [str(step) for step in range(num_steps)])
    ax.set_yticks([p + 0.43 for p in range(num_processes)], [f"process {p}" for p in range(num_processes)])
    ax.set_xlabel("step")
    ax.set_title(f"{title}\n(in each cell: the indices of its examples; hatched: repeated to fill the last step)",
                 fontsize=10)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    figure.tight_layout()
    return figure


def plot_wall_times(seconds, title: str = "Training wall time on 1 and on several processes"):
    """Plot measured wall times: ``seconds`` maps a label ("1 process") to a list of timings in seconds.

    A bar shows each label's median and the dots the single measurements; with one
    timing per label, the bars are those runs and the legend says so. Returns the Figure.
    """
    if not isinstance(seconds, dict) or not seconds:
        raise ValueError("seconds must be a non-empty dict of label -> list of timings in seconds")
    for label, timings in seconds.items():
        if not timings or any(not isinstance(t, (int, float)) or t < 0 for t in timings):
            raise ValueError(f"seconds[{label!r}] must be a non-empty list of non-negative numbers, got {timings!r}")
    figure, ax = plt.subplots(figsize=(5.5, 3.2))
    labels = list(seconds)
    medians = [statistics.median(seconds[label]) for label in labels]
    several = any(len(timings) > 1 for timings in seconds.values())
    # A median of one run is that run: the legend says what the bar is.
    ax.bar(labels, medians, color=[_PROCESS_COLOURS[i % len(_PROCESS_COLOURS)] + "99" for i in range(len(labels))],
           edgecolor="#333333", label="median of the runs" if several else "one run")
    for position, label in enumerate(labels):
        if several:
            ax.plot([position] * len(seconds[label]), seconds[label], "o", color="#333333", markersize=4,
                    label="each run" if position == 0 else None)
        ax.annotate(f"{medians[position]:.2f} s", (position, medians[position]), ha="center", va="bottom",
                    xytext=(0, 3), textcoords="offset points", fontsize=9)
    ax.set_ylabel("training wall time (s)")
    ax.set_title(title)
    ax.set_ylim(0, max(max(t) for t in seconds.values()) * 1.2)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure


def plot_learning_rate_sweep(losses, title: str = "The best learning rate depends on the batch size"):
    """Plot ``{(batch_size, lr): [validation loss per seed]}``: a dot per seed, a line through the medians per batch size.

    The x axis is the learning rate (log scale), the y axis the validation loss
    in nats per example. Returns the Figure.
    """
    if not isinstance(losses, dict) or not losses:
        raise ValueError("losses must be a non-empty dict of (batch_size, lr) -> list of losses")
    figure, ax = plt.subplots(figsize=(6.4, 3.6))
    batch_sizes = sorted({batch_size for batch_size, _ in losses})
    for index, batch_size in enumerate(batch_sizes):
        colour = _PROCESS_COLOURS[index % len(_PROCESS_COLOURS)]
        rates = sorted(lr for size, lr in losses if size == batch_size)
        medians = [statistics.median(losses[batch_size, lr]) for lr in rates]
        ax.plot(rates, medians, "-", color=colour, label=f"batch {batch_size}: median")
        for lr in rates:
            # A small sideways offset per batch size keeps the two sets of dots apart.
            shift = 1 + 0.06 * (index - (len(batch_sizes) - 1) / 2)
            ax.plot([lr * shift] * len(losses[batch_size, lr]), losses[batch_size, lr], "o", color=colour,
                    markersize=4, alpha=0.7, label=f"batch {batch_size}: each seed" if lr == rates[0] else None)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (AdamW, log scale)")
    ax.set_ylabel("validation loss (nats per example)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure

