"""Figures about speed (lesson 8): timings with their spread, a profiled step's timeline, tokens/s against memory.

Each function draws on a new figure and returns the matplotlib ``Figure``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from course_utils.speed import Timing
from course_utils.validation import check_positive_number, is_real_number
from course_utils.units import MIB

__all__ = ["plot_timings", "timeline_spans", "plot_timeline", "plot_speed_against_memory"]


def plot_timings(timings: dict[str, Timing], title: str, scale: float = 1e3, unit: str = "ms"):
    """Draw one horizontal bar per timing (its median), with a line from its fastest to its slowest run."""
    if not isinstance(timings, dict) or not timings or not all(isinstance(t, Timing) for t in timings.values()):
        raise ValueError("timings must be a non-empty dict of name -> Timing")
    check_positive_number(scale, "scale")
    figure, ax = plt.subplots(figsize=(7.5, 0.55 * len(timings) + 1.4))
    names = list(timings)[::-1]
    medians = [timings[name].median * scale for name in names]
    low = [timings[name].minimum * scale for name in names]
    high = [timings[name].maximum * scale for name in names]
    ax.barh(names, medians, color=[f"C{i}" for i in range(len(names))][::-1], alpha=0.8)
    ax.hlines(range(len(names)), low, high, color="black", linewidth=1.5, label="fastest to slowest run")
    ax.set_title(title)
    ax.set_xlabel(f"time per call ({unit}): bar = median, line = fastest to slowest run")
    ax.set_xlim(0, max(high) * 1.1)
    ax.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def timeline_spans(profile, lanes: tuple[str, ...]) -> list[tuple[str, str, float, float]]:
    """Return (lane, name, start ms, duration ms) for the profiled ranges named in ``lanes`` and the operators inside them.

    ``profile`` is a finished ``torch.profiler.profile``. A range opened with
    ``torch.profiler.record_function(lane)`` gives a span in its own lane; the
    operators called directly inside one give spans in the lane "operators".
    Times start at the first span.
    """
    if not hasattr(profile, "events"):
        raise TypeError(f"profile must be a finished torch.profiler.profile, got {type(profile).__name__}")
    spans = []
    for event in profile.events():
        start, end = event.time_range.start, event.time_range.end
        if event.name in lanes:
            spans.append((event.name, event.name, start, end - start))
        elif event.cpu_parent is not None and event.cpu_parent.name in lanes:
            spans.append(("operators", _short_name(event.name), start, end - start))
    if not spans:
        return []
    origin = min(span[2] for span in spans)
    return [(lane, name, (start - origin) / 1e3, duration / 1e3) for lane, name, start, duration in spans]


def _short_name(name: str) -> str:
    """Return a profiler event's name, shorter: "MmBackward0 (backward)" for autograd's long node names."""
    prefix = "autograd::engine::evaluate_function: "
    if name.startswith(prefix):
        name = f"{name[len(prefix):]} (backward)"
    return name if len(name) <= 40 else name[:39] + "…"


def plot_timeline(spans: list[tuple[str, str, float, float]], title: str, label_operators: int = 5):
    """Draw ``spans`` (from :func:`timeline_spans`) as a timeline, one row per lane.

    The ``label_operators`` operators with the most time get a colour and a legend entry; the rest are grey.
    """
    if not spans:
        raise ValueError("spans is empty: nothing was profiled in the lanes asked for")
    lanes = list(dict.fromkeys(lane for lane, *_ in spans if lane != "operators"))
    if any(lane == "operators" for lane, *_ in spans):
        lanes.append("operators")
    total_by_name: dict[str, float] = {}
    for lane, name, _, duration in spans:
        if lane == "operators":
            total_by_name[name] = total_by_name.get(name, 0.0) + duration
    named = sorted(total_by_name, key=total_by_name.get, reverse=True)[:label_operators]
    colours = {name: f"C{index + 2}" for index, name in enumerate(named)}
    # Constrained layout keeps the legend, below the axes, inside the figure.
    figure, ax = plt.subplots(figsize=(9, 0.6 * len(lanes) + 2.4), layout="constrained")
    for lane, name, start, duration in spans:
        row = lanes.index(lane)
        colour = colours.get(name, "lightgrey") if lane == "operators" else f"C{row % 2}"
        ax.barh(row, max(duration, 1e-3), left=start, color=colour, edgecolor="none", height=0.7)
    handles = [Patch(color=colour, label=name) for name, colour in colours.items()]
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first profiled range (ms)")
    ax.set_title(title)
    if colours:
        figure.legend(handles=handles, loc="outside lower center", ncol=2, fontsize="small",
                      title="the operators with the most time in these ranges")
    return figure


def plot_speed_against_memory(points: dict[str, tuple[Timing, float, int]], title: str):
    """Draw each set-up at (peak memory, tokens/s), tokens/s as median with its slowest-fastest range.

    ``points`` maps a name to (Timing of one optimizer step, tokens per step, peak bytes).
    """
    if not isinstance(points, dict) or not points:
        raise ValueError("points must be a non-empty dict of name -> (Timing, tokens per step, peak bytes)")
    for name, point in points.items():
        if not (isinstance(point, tuple) and len(point) == 3 and isinstance(point[0], Timing)
                and is_real_number(point[1]) and point[1] > 0 and is_real_number(point[2]) and point[2] >= 0):
            raise ValueError(f"points[{name!r}] must be (Timing, tokens per step, peak bytes), got {point!r:.80}")
    figure, ax = plt.subplots(figsize=(7.5, 4.5))
    for index, (name, (timing, tokens, peak)) in enumerate(points.items()):
        median, slowest, fastest = timing.rate(tokens)
        ax.errorbar(peak / MIB, median, yerr=[[median - slowest], [fastest - median]], fmt="o", color=f"C{index}",
                    capsize=4, markersize=8, label=name)
    ax.set_title(title)
    ax.set_xlabel("peak memory of one training step, planned (MiB)")
    ax.set_ylabel("tokens per second (median,\nbar: slowest to fastest run)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    return figure
