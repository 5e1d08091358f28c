"""Figures about pipeline parallelism (lesson 9). Every figure has a title, labelled axes and units.

- :func:`plot_pipeline_timeline`: when each stage computed each pass, one row per stage, one panel per run:
  the bubble is the white space.

The function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

__all__ = ["plot_pipeline_timeline"]

_COLOURS = {"F": "#4e79a7", "B": "#f28e2b"}


def plot_pipeline_timeline(timelines: dict, title: str = "When each stage computed, one step"):
    """Draw, for each run, one row per stage with a bar per pass; return the Figure.

    ``timelines`` maps a run's label (e.g. "GPipe, m = 8") to a list, per stage,
    of ``(start, end, kind, micro_batch)``: times in seconds on one clock,
    ``kind`` "F" (forward) or "B" (backward). Times are drawn in milliseconds from
    the run's first start.
    """
    if not isinstance(timelines, dict) or not timelines or not all(
            isinstance(stages, (list, tuple)) and stages and all(stage for stage in stages)
            for stages in timelines.values()):
        raise TypeError("timelines must be a non-empty dict of label -> list, per stage, of (start, end, kind, micro)")
    figure, axes = plt.subplots(len(timelines), 1, figsize=(9, 1.3 + 1.1 * sum(len(s) for s in timelines.values())),
                                squeeze=False)
    for ax, (label, stages) in zip(axes[:, 0], timelines.items()):
        origin = min(start for stage in stages for start, *_ in stage)
        for row, stage in enumerate(stages):
            for start, end, kind, micro in stage:
                left, width = 1e3 * (start - origin), 1e3 * (end - start)
                ax.barh(row, width, left=left, height=0.7, color=_COLOURS[kind], edgecolor="white", linewidth=0.5)
                ax.text(left + width / 2, row, str(micro), ha="center", va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(stages)), [f"stage {s}" for s in range(len(stages))])
        ax.invert_yaxis()
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("time since the step's first pass (ms)")
    # The key above the panels, under the title, where it hides no bar.
    figure.legend(handles=[Patch(color=_COLOURS["F"], label="forward (micro-batch number)"),
                           Patch(color=_COLOURS["B"], label="backward")],
                  loc="upper center", bbox_to_anchor=(0.5, 0.95), ncol=2, fontsize=8, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 0.92))
    return figure
