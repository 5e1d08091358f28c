"""Lesson 2's figure: one optimizer's state against the parameter count, with the fp32 rules of AdamW and SGD."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from course_utils.units import GIB, MIB

__all__ = ["plot_state_memory_vs_parameters"]


def plot_state_memory_vs_parameters(points, unit="MiB", ax=None):
    """Plot optimizer-state memory against parameter count on log-log axes; return the Figure.

    ``points`` maps a model's name to ``(num_parameters, state_bytes)``; each is
    marked, and named in the legend with its size. Two lines give the fp32 rules: AdamW keeps
    8 bytes per parameter (two states of 4 bytes), SGD with momentum 4 (one
    state). Plain SGD keeps none, which a log axis cannot show. ``unit`` is
    ``"MiB"`` (1024**2 bytes) or ``"GiB"`` (1024**3 bytes).
    """
    if not isinstance(points, dict) or not points:
        raise ValueError("points must be a non-empty dict of name -> (num_parameters, state_bytes)")
    for name, point in points.items():
        if not (isinstance(point, (tuple, list)) and len(point) == 2 and all(_is_positive_number(v) for v in point)):
            raise ValueError(f"points[{name!r}] must be (num_parameters, state_bytes), two positive numbers, got {point!r}")
    if unit not in ("MiB", "GiB"):
        raise ValueError(f"unit must be 'MiB' or 'GiB', got {unit!r}")
    scale = MIB if unit == "MiB" else GIB
    if ax is None:
        figure, ax = plt.subplots(figsize=(8, 5))
    else:
        figure = ax.figure

    counts = [num_parameters for num_parameters, _ in points.values()]
    line_counts = np.geomspace(min(counts) / 3, max(counts) * 3, 50)
    for label, bytes_per_parameter, style in [
        ("AdamW: 8 bytes per parameter (2 fp32 states)", 8, "-"),
        ("SGD with momentum: 4 bytes per parameter (1 fp32 state)", 4, "--"),
    ]:
        ax.plot(line_counts, line_counts * bytes_per_parameter / scale, style, color="0.45", label=label)

    # Names go in the legend: models of similar size would overlap as labels on the plot.
    markers = "osD^vP*X"
    for index, (name, (num_parameters, state_bytes)) in enumerate(points.items()):
        size = state_bytes / scale
        ax.plot(
            num_parameters, size, markers[index % len(markers)], markersize=8, color=f"C{index}",
            label=f"{name}: {num_parameters:,.0f} parameters, {size:,.1f} {unit}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (count, log scale)")
    ax.set_ylabel(f"optimizer state ({unit}, log scale)")
    ax.set_title("Optimizer state grows linearly with the parameter count")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return figure


def _is_positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
