"""Figures about sharded data parallelism (lesson 7). Every figure has a title, labelled axes and units.

- :func:`plot_held_per_process`: what each process held under each strategy, measured in the processes.
- :func:`plot_memory_per_gpu`: planned peak per process against parameter count, with the cards marked.

The function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_utils.units import GIB, MIB

__all__ = ["plot_held_per_process", "plot_memory_per_gpu"]

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


_STRATEGY_STYLE = {"none": ("-", "one process"), "ddp": ("-.", "DDP"), "zero1": ("-.", "ZeRO-1"),
                   "zero2": ("--", "ZeRO-2"), "zero3": ("-", "ZeRO-3 / FSDP")}
_STRATEGY_MARKER = {"zero1": "^", "zero2": "s"}
_PROCESS_COLOURS = {1: "black", 8: "#4e79a7", 64: "#f28e2b", 512: "#59a14f"}


def plot_memory_per_gpu(plans: list[dict], cards: dict[str, int], rule_describes, step: str = "",
                        title: str = "Memory per GPU against parameter count, planned per process"):
    """Draw each strategy's planned peak per process against the model's parameters (log-log); return the Figure.

    ``plans``: dicts with ``parameters``, ``world_size``, ``sharding`` and ``peak`` (bytes), as
    :func:`course_utils.sharding_plans.load_cached_plans` gives them. ``cards``: ``{name: bytes}`` drawn as
    horizontal lines (:func:`course_utils.gpus.figure_cards`). ``rule_describes(plan)``: False marks a
    ZeRO-3 (or one-process) point with a red ring ("16 bytes x P / N" is less than half its peak). The rule
    itself is drawn dotted, one line per number of processes.
    """
    if not isinstance(plans, list) or not plans:
        raise TypeError("plans must be a non-empty list of dicts with parameters, world_size, sharding and peak")
    if not isinstance(cards, dict) or not callable(rule_describes):
        raise TypeError("cards must be a dict of card name -> bytes, rule_describes a function of one plan")
    needed = ("parameters", "world_size", "sharding", "peak")
    if not all(isinstance(plan, dict) and all(key in plan for key in needed) for plan in plans):
        raise ValueError(f"plans must be dicts with {', '.join(needed)} (as load_cached_plans gives them)")
    figure, ax = plt.subplots(figsize=(10, 6.5))
    curves: dict[tuple[int, str], list[dict]] = {}
    ring_label = "ZeRO-3: 16 bytes x P / N below half the peak"
    for plan in plans:
        curves.setdefault((plan["world_size"], plan["sharding"]), []).append(plan)
    for (world_size, strategy), points in curves.items():
        points = sorted(points, key=lambda p: p["parameters"])
        style, name = _STRATEGY_STYLE[strategy]
        colour = _PROCESS_COLOURS.get(world_size, "grey")
        # DDP holds the same on every process, whatever their number: one curve, named so.
        label = name if world_size == 1 else f"{name}, any number of GPUs" if strategy == "ddp" else \
            f"{name}, {world_size} GPUs"
        x = [p["parameters"] for p in points]
        ax.plot(x, [p["peak"] / GIB for p in points], style, marker=_STRATEGY_MARKER.get(strategy, "o"),
                color="purple" if strategy == "ddp" else colour, label=label, markersize=4)
        if strategy in ("none", "zero3"):  # one rule line per process count
            ax.plot(x, [16 * p["parameters"] / world_size / GIB for p in points], ":", color=colour, linewidth=1,
                    label=f"16 bytes x P / {world_size}")
        # The rule is ZeRO-3's (everything divided by N); ZeRO-1, ZeRO-2 and DDP keep whole state and never claimed it.
        off = [p for p in points if strategy not in ("zero1", "zero2", "ddp") and not rule_describes(p)]
        ax.scatter([p["parameters"] for p in off], [p["peak"] / GIB for p in off], s=90, facecolors="none",
                   edgecolors="red", linewidths=1.2, zorder=5, label=ring_label if off else None)
        if off:
            ring_label = None  # one legend entry for all the rings
    for card, num_bytes in cards.items():
        ax.axhline(num_bytes / GIB, color="grey", linewidth=0.8, alpha=0.7)
        ax.text(0.995, num_bytes / GIB * 1.03, f"{card}: {num_bytes / GIB:.1f} GiB", transform=ax.get_yaxis_transform(),
                fontsize=7, color="dimgrey", va="bottom", ha="right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters of the model (count, log scale)")
    ax.set_ylabel("peak memory of one process (GiB, log scale)")
    ax.set_title(title + (f"\n{step}" if step else ""), fontsize=10)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    figure.tight_layout()
    return figure
