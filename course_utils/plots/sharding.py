"""Figures about sharded data parallelism (lesson 7). Every figure has a title, labelled axes and units.

- :func:`plot_held_per_process`: what each process held under each strategy, measured in the processes.

The function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_utils.units import MIB

__all__ = ["plot_held_per_process"]

_COLOURS = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#59a14f",
    "buckets": "#b07aa1",
    "activations": "#bab0ac",
}
_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "buckets": "DDP's gradient buckets",
    "activations": "activations (saved by the forward pass)",
}


def plot_held_per_process(runs: dict, title: str = "What each process holds, measured in each process"):
    """Draw one stacked bar per process of each run; return the Figure.

    ``runs`` maps a run's label (e.g. "DDP, 2 processes") to the list of
    :class:`course_utils.sharding.ProcessMemory` its processes returned. Each
    bar stacks the process's parameters, gradients, optimizer state, DDP
    buckets and activations, in MiB.
    """
    if not isinstance(runs, dict) or not runs or not all(isinstance(v, (list, tuple)) and v for v in runs.values()):
        raise TypeError("runs must be a non-empty dict of label -> list of ProcessMemory, as launch returns them")
    positions, labels, x = [], [], 0.0
    figure, ax = plt.subplots(figsize=(max(7.0, 0.55 * sum(len(v) for v in runs.values()) + 3), 5.2))
    group_centres = []
    for run_label, processes in runs.items():
        first = x
        for process in processes:
            bottom = 0.0
            for category, colour in _COLOURS.items():
                height = process.held()[category] / MIB
                ax.bar(x, height, bottom=bottom, color=colour, width=0.8,
                       label=_LABELS[category] if not positions else None, edgecolor="white", linewidth=0.5)
                bottom += height
            positions.append(x)
            labels.append(f"{process.rank}")
            x += 1
        group_centres.append(((first + x - 1) / 2, run_label))
        x += 0.8
    ax.set_xticks(positions, labels, fontsize=8)
    for centre, run_label in group_centres:
        ax.text(centre, -0.09, run_label, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8)
    ax.set_xlabel("process (rank), grouped by run", labelpad=28)
    ax.set_ylabel("bytes held by one process (MiB)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    return figure
