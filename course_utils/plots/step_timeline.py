"""Lesson 4's timeline: the memory one training step holds, operation by operation, and an explorer of it.

- :func:`plot_step_timeline` stacks the parts of a
  :class:`course_utils.memory.StepTimeline` (weights, optimizer state,
  gradients, activations, temporaries, coloured as in lesson 4's breakdown)
  along the step's operations, with its phases named and its peak marked.
- :func:`step_timeline_explorer` is the memory explorer's widgets
  (:mod:`course_utils.plots.memory_explorer`) above this figure: the same
  choices, each set-up planned once and drawn again from a cache.
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from course_utils.plots.memory_explorer import TrainingMemoryExplorer
from course_utils.memory import DRAWN_PARTS, StepTimeline
from course_utils.units import GIB, MIB, format_bytes

__all__ = ["plot_step_timeline", "describe_depth", "StepTimelineExplorer", "step_timeline_explorer"]

# As plots.training_memory's breakdown colours them: weights C0, optimizer state C2, the forward
# pass's activations C3, the backward pass's gradients C1, the optimizer step's temporaries C4.
COLOURS = {"weights": "C0", "optimizer state": "C2", "gradients": "C1", "activations": "C3", "temporaries": "C4"}
MAX_DRAWN_POINTS = 1500  # more than the figure's width in pixels


def plot_step_timeline(timeline: StepTimeline, title: str | None = None, ax=None) -> Figure:
    """Draw the memory ``timeline`` holds after each operation, its parts stacked, phases named, peak marked; return the Figure.

    A timeline of many operations is drawn from at most ``MAX_DRAWN_POINTS``
    of them, each standing for a run of neighbours and holding the most of
    them (the peak is always drawn).
    """
    if not isinstance(timeline, StepTimeline):
        raise TypeError(f"timeline must be a StepTimeline (course_utils.memory.plan_step_timeline), "
                        f"got {type(timeline).__name__}")
    if len(timeline.phases) == 0:
        raise ValueError("timeline has no points: nothing was recorded")
    figure, ax = plt.subplots(figsize=(9, 4.6)) if ax is None else (ax.figure, ax)
    unit, size = ("GiB", GIB) if timeline.peak >= 4 * GIB else ("MiB", MIB)
    shown = points_to_draw(timeline)
    ax.stackplot(shown, *(timeline.held[shown, index] / size for index in range(len(DRAWN_PARTS))),
                 labels=DRAWN_PARTS, colors=[COLOURS[part] for part in DRAWN_PARTS], linewidth=0)
    _name_the_phases(ax, timeline)
    peak, at = timeline.peak / size, timeline.peak_index
    ax.plot([at], [peak], marker="v", color="black", markersize=8, zorder=5)
    right_half = at > 0.6 * len(timeline.phases)
    ax.annotate(f"peak {format_bytes(timeline.peak, 2)}\n({timeline.phases[at]})", (at, peak),
                xytext=(-10 if right_half else 10, 6), textcoords="offset points",
                ha="right" if right_half else "left", va="bottom", fontsize="small")
    ax.set_xlim(0, len(timeline.phases) - 1)
    ax.set_ylim(0, peak * 1.3)  # room above the peak for its label and the phases
    ax.set_xlabel("operations of the step, in order (those that change the memory held)")
    ax.set_ylabel(f"memory held ({unit})")
    ax.set_title(title or "Memory held during one training step, operation by operation")
    # Below the axes, where it hides no phase; the tight layout makes room for it.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize="small", ncol=len(DRAWN_PARTS), frameon=False)
    figure.tight_layout()
    return figure


def points_to_draw(timeline: StepTimeline) -> np.ndarray:
    """Return the indices to draw: all, or from each run of neighbours the one holding the most, and the peak."""
    count = len(timeline.phases)
    if count <= MAX_DRAWN_POINTS:
        return np.arange(count)
    totals = timeline.totals
    edges = np.linspace(0, count, MAX_DRAWN_POINTS + 1).astype(int)
    highest = [start + int(np.argmax(totals[start:end])) for start, end in zip(edges[:-1], edges[1:]) if end > start]
    return np.unique(np.array([0, *highest, timeline.peak_index, count - 1]))


def _name_the_phases(ax, timeline: StepTimeline) -> None:
    """Separate the phases with dotted lines and name those wide enough to hold a name."""
    phases = ["optimizer step" if phase == "zero_grad" else phase for phase in timeline.phases]
    starts = [0] + [i for i in range(1, len(phases)) if phases[i] != phases[i - 1]]
    ends = starts[1:] + [len(phases)]
    for start, end in zip(starts, ends):
        if start:
            ax.axvline(start, color="0.4", linewidth=0.8, linestyle=":")
        if end - start >= 0.07 * len(phases):
            ax.text((start + end) / 2, 0.985, phases[start], transform=ax.get_xaxis_transform(), ha="center",
                    va="top", fontsize="x-small", color="0.25")


class StepTimelineExplorer(TrainingMemoryExplorer):
    """The memory explorer's widgets above the chosen set-up's step timeline; redrawn on change.

    The memory explorer's arguments, but ``timeline(model_name, model_side,
    checkpointing, setup)`` returns a :class:`~course_utils.memory.StepTimeline`
    (or raises ``ValueError`` with a reason, shown instead of a figure). A
    set-up drawn before is drawn from the cache (``last_redraw_seconds`` says
    how long it took).
    """

    def __init__(self, model_names, timeline, optimizers, precisions, **options):
        super().__init__(model_names, timeline, optimizers, precisions, **options)

    def redraw(self, change=None):
        """Ask for the chosen set-up's timeline, write its peak, and redraw the figure."""
        from IPython.display import display

        start = time.perf_counter()
        optimizer, precision = self.optimizer.value, self.precision.value
        answer = self.memory(optimizer, precision)
        ax = self.figure.axes[0]
        ax.clear()
        if isinstance(answer, ValueError):
            self.summary.value = f"<b>{optimizer}, {precision}</b>: not planned: {answer}"
        else:
            self.summary.value = (f"<b>{optimizer}, {precision}</b>: peak <b>{format_bytes(answer.peak, 2)}</b> "
                                  f"in {answer.phases[answer.peak_index]}; {describe_depth(answer)}")
            accumulation = f", {self.accumulation.value} accumulated" if self.accumulation.value > 1 else ""
            checkpointing = ", checkpointed" if self.checkpointing.value else ""
            plot_step_timeline(answer, ax=ax, title=(
                f"{self.model.value}, {optimizer}, {precision}: micro-batch {self.batch_size.value} × "
                f"{self.seq_len.value} tokens{accumulation}{checkpointing}"))
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)
        self.last_redraw_seconds = time.perf_counter() - start


def describe_depth(timeline: StepTimeline) -> str:
    """Return in words which copy of the model the timeline is of: the whole, extrapolated, or a shallow copy."""
    if not isinstance(timeline, StepTimeline):
        raise TypeError(f"timeline must be a StepTimeline (memory.plan_step_timeline's), got {type(timeline).__name__}")
    if timeline.blocks is None:
        return "the model followed whole"
    if timeline.extrapolated:
        return f"all {timeline.blocks} blocks, extrapolated from copies with fewer (checked point for point)"
    if timeline.blocks_drawn == timeline.blocks:
        return f"all {timeline.blocks} blocks, followed whole"
    return (f"a copy with its first {timeline.blocks_drawn} of {timeline.blocks} blocks (the full depth did not "
            "extrapolate point for point): its peak is the copy's, not the model's")


def step_timeline_explorer(model_names, timeline, optimizers, precisions, **options) -> StepTimelineExplorer:
    """Return a :class:`StepTimelineExplorer`; make it the last expression of a cell to show it.

    ``options`` are the memory explorer's (``batch_sizes``, ``seq_lens``,
    ``accumulation_steps``, ``initial``). Outside a live kernel the widgets do
    not work: draw :func:`plot_step_timeline` as well.
    """
    return StepTimelineExplorer(model_names, timeline, optimizers, precisions, **options)
