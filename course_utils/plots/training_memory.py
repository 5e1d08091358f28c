"""Lesson 4's figures: the peak memory of one training step, and how it grows with the model.

- :func:`plot_training_memory_breakdown`: one bar per set-up, as tall as the step's peak, split
  into what is held throughout (weights, optimizer state) and what the peak's phase adds;
- :func:`plot_peak_memory_vs_parameters`: the peak against the parameter count, one line per
  optimizer and precision, with the memory of common GPUs marked.

A set-up's memory is read from a ``course_utils.memory.TrainingMemory`` or a dict with the same
keys (bytes): ``weights``, ``gradients``, ``optimizer_state``, ``activations``, ``peak``,
``phase_of_peak``. Each function returns the matplotlib ``Figure`` it drew on.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from course_utils.plots.memory_efficient import short_count
from course_utils import gpus
from course_utils.units import GIB, MIB

__all__ = ["plot_training_memory_breakdown", "plot_peak_memory_vs_parameters", "read_memory"]

# What the rest of the peak is, above weights and optimizer state, in each phase.
_REST_OF_THE_PEAK = {
    "forward": "activations (+ temporaries)",
    "backward": "activations not yet freed + gradients",
    "optimizer step": "gradients + the step's temporaries",
}


def read_memory(label, memory):
    """Return ``memory`` (a TrainingMemory or a dict) as a dict of bytes and the phase; name what is missing."""
    keys = ("weights", "gradients", "optimizer_state", "activations", "peak")
    values = {}
    for key in keys:
        value = memory.get(key) if isinstance(memory, Mapping) else getattr(memory, key, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{label!r}: {key} must be a non-negative number of bytes, got {value!r}")
        values[key] = value
    phase = memory.get("phase_of_peak") if isinstance(memory, Mapping) else getattr(memory, "phase_of_peak", None)
    if not isinstance(phase, str):
        raise ValueError(f"{label!r}: phase_of_peak must be the name of a phase, got {phase!r}")
    if values["weights"] + values["optimizer_state"] > values["peak"] * (1 + 1e-9):
        raise ValueError(f"{label!r}: the peak is below weights + optimizer state, which are held throughout the step")
    values["phase_of_peak"] = phase
    return values


def _unit_for(num_bytes):
    return ("GiB", GIB) if num_bytes >= 4 * GIB else ("MiB", MIB)


def plot_training_memory_breakdown(setups, title="Peak memory of one training step", ax=None, xlabel="set-up"):
    """Draw one bar per set-up, as tall as its peak; return the Figure.

    ``setups`` maps a bar label to its memory. Each bar stacks the weights and
    the optimizer state, held during the whole step, and the rest of the peak,
    named after the phase the peak falls in (what that phase holds on top).
    The peak, not the sum of the four parts: the parts are never all alive at once.
    """
    if not isinstance(setups, Mapping) or not setups:
        raise ValueError("setups must be a non-empty dict of label -> TrainingMemory (or dict of bytes)")
    parts = {label: read_memory(label, memory) for label, memory in setups.items()}
    unit, size = _unit_for(max(p["peak"] for p in parts.values()))
    figure, ax = (plt.subplots(figsize=(max(6.5, 1.9 * len(parts) + 4), 4.8)) if ax is None else (ax.figure, ax))
    in_legend = set()
    for position, (label, part) in enumerate(parts.items()):
        rest = part["peak"] - part["weights"] - part["optimizer_state"]
        bottom = 0.0
        for name, value, colour in (
            ("weights", part["weights"], "C0"),
            ("optimizer state", part["optimizer_state"], "C2"),
            (f"{part['phase_of_peak']}: {_REST_OF_THE_PEAK.get(part['phase_of_peak'], 'the rest')}", rest,
             {"forward": "C3", "backward": "C1", "optimizer step": "C4"}.get(part["phase_of_peak"], "C5")),
        ):
            ax.bar(position, value / size, bottom=bottom, color=colour, width=0.6,
                   label=None if name in in_legend else name)
            in_legend.add(name)
            bottom += value / size
        digits = 2 if part["peak"] / size < 10 else 1
        ax.text(position, bottom, f"peak {part['peak'] / size:,.{digits}f} {unit}\n({part['phase_of_peak']})",
                ha="center", va="bottom", fontsize="small")
    ax.set_xticks(range(len(parts)))
    ax.set_xticklabels(list(parts), fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"memory at the peak ({unit})")
    ax.set_ylim(0, max(p["peak"] for p in parts.values()) / size * 1.3)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    # Beside the axes, inside the layout: inside the axes it would hide the first bar's label.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.set_layout_engine("constrained")
    return figure


def plot_peak_memory_vs_parameters(parameter_counts, peaks, title="Peak memory of a training step against model size",
                                   gpu_cards=None, groups=None, per_parameter=True):
    """Plot each line's peak (log scale) against the parameter count (log scale), GPUs marked; return the Figure.

    ``parameter_counts`` maps a model name to its parameter count; ``peaks`` maps
    a line label (an optimizer and a precision) to ``{model name: peak bytes}``.
    ``groups`` maps each line label to ``(optimizer, precision)``: lines of one
    optimizer share a colour, lines of one precision a dash pattern and a marker.
    Without it every line gets a colour and a dash of its own.
    Horizontal lines mark ``gpu_cards`` (``{card name: bytes}``; by default ``gpus.figure_cards()``,
    each card's memory as nvidia-smi reports it, in binary units like the axis).
    With ``per_parameter`` a second panel shows the same peaks in bytes per
    parameter, where lines that the first panel's log scale draws together come apart.
    """
    if not isinstance(parameter_counts, Mapping) or not parameter_counts:
        raise ValueError("parameter_counts must be a non-empty dict of model name -> parameter count")
    if not isinstance(peaks, Mapping) or not peaks:
        raise ValueError("peaks must be a non-empty dict of line label -> {model name: peak bytes}")
    for label, by_model in peaks.items():
        unknown = set(by_model) - set(parameter_counts)
        if unknown:
            raise ValueError(f"peaks[{label!r}] names models missing from parameter_counts: {sorted(unknown)}")
    legend_title = "colour: optimizer; dashes and marker: precision" if groups is not None else None
    if groups is None:
        groups = {label: (label, label) for label in peaks}
    if not isinstance(groups, Mapping) or any(
        not isinstance(groups.get(label), tuple) or len(groups[label]) != 2 for label in peaks
    ):
        raise ValueError("groups must map every line label of peaks to an (optimizer, precision) pair")
    colours = {optimizer: f"C{i % 10}" for i, optimizer in enumerate(dict.fromkeys(g[0] for g in groups.values()))}
    # Lines that nearly coincide (fp32 and mixed precision) stay visible as different dashes.
    looks = dict(zip(dict.fromkeys(g[1] for g in groups.values()),
                     [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1, 1, 1)), "v")] * 4))
    figure, axes = plt.subplots(1, 2 if per_parameter else 1, figsize=(13, 6.5) if per_parameter else (10, 6.5),
                                squeeze=False, layout="constrained")
    ax = axes[0][0]
    order = sorted(parameter_counts, key=parameter_counts.get)
    for label, by_model in peaks.items():
        names = [name for name in order if name in by_model]
        optimizer, precision = groups[label]
        linestyle, marker = looks[precision]
        style = {"marker": marker, "linestyle": linestyle, "linewidth": 1.8, "color": colours[optimizer]}
        ax.plot([parameter_counts[n] for n in names], [by_model[n] / GIB for n in names], label=label, **style)
        if per_parameter:
            axes[0][1].plot([parameter_counts[n] for n in names], [by_model[n] / parameter_counts[n] for n in names],
                            **style)
    if gpu_cards is None:
        gpu_cards = gpus.figure_cards()
    if not isinstance(gpu_cards, Mapping) or any(
        isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0 for size in gpu_cards.values()
    ):
        raise ValueError(f"gpu_cards must be a dict of card name -> memory in bytes (> 0), got {gpu_cards!r}")
    for card, size in gpu_cards.items():
        ax.axhline(size / GIB, color="0.35", linewidth=0.9, linestyle=(0, (4, 3)), zorder=0)
        ax.annotate(f"{card}: {size / GIB:.1f} GiB", (1.0, size / GIB), xycoords=("axes fraction", "data"),
                    xytext=(-3, 2), textcoords="offset points", ha="right", fontsize="x-small", color="0.25")
    # Models of similar size would overlap as labels in a row: write each up its own grey line, from the bottom
    # (of the first panel only: in the second the lines cross that corner).
    for name in order:
        ax.annotate(f"{name} ({short_count(parameter_counts[name])})", (parameter_counts[name], 0.02),
                    xycoords=("data", "axes fraction"), xytext=(-3, 0), textcoords="offset points",
                    rotation=90, ha="right", va="bottom", fontsize="x-small", color="0.3")
    for panel in axes[0]:
        for name in order:
            panel.axvline(parameter_counts[name], color="0.88", linewidth=0.8, zorder=0)
        panel.set_xscale("log")
        panel.xaxis.set_major_formatter(FuncFormatter(lambda x, _: short_count(x)))
        panel.set_xlabel("parameters (log scale)")
        panel.grid(alpha=0.3, which="major")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylabel("peak memory of one training step (GiB, log scale)")
    if per_parameter:
        ax.set_title("the peak, with the memory of common GPUs")
        axes[0][1].set_ylim(bottom=0)
        axes[0][1].set_ylabel("peak memory / parameter count (bytes per parameter)")
        axes[0][1].set_title("the same peaks per parameter (models as on the left)")
        figure.suptitle(title)
    else:
        ax.set_title(title)
    # Below both panels, inside the layout ("outside" places it beside the axes, not off the image).
    figure.legend(loc="outside lower center", ncols=3, fontsize="small", title=legend_title, title_fontsize="small")
    return figure
