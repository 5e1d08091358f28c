"""Lesson 4's step timeline: how long a set-up takes to plan, and to redraw once planned (target: under 1 s).

For each set-up of the explorer's models (GPT-2 to a 70B-shaped Llama), the
first ``plan_step_timeline`` (the planner's fake step recorded on copies of
the model, extrapolated to its depth), then a redraw as the explorer does it
for a set-up it has seen: the timeline from the cache, drawn, and rendered to
PNG as a notebook shows it. Redraws are timed ``REDRAWS`` times; the median
and the slowest are printed. Run alone with ``python -m benchmarks.bench_step_timeline``.
"""

import io
import statistics
import time

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

from course_utils import memory, models  # noqa: E402
from course_utils.plots import step_timeline as timeline_plots  # noqa: E402

REDRAWS = 5
# (model, optimizer, mixed_precision, checkpointing); 4 sequences of 128 tokens, as lesson 4's figures.
SETUPS = [
    ("GPT-2 with its LM head", "adamw", "bf16", False),
    ("GPT-2 with its LM head", "adamw", "bf16", True),
    ("GPT-2 with its LM head", "adamw8bit", "bf16", False),
    ("Mistral-7B-shaped (GQA)", "adamw8bit", "bf16", True),
    ("Llama-2-70B-shaped (GQA)", "adamw", "bf16", False),
]


def redraw_seconds(model, optimizer, mixed_precision) -> float:
    """Seconds to draw a planned set-up again: the cached timeline, the figure, its PNG."""
    import matplotlib.pyplot as plt

    start = time.perf_counter()
    timeline = memory.plan_step_timeline(model, optimizer, 4, 128, mixed_precision=mixed_precision)
    figure = timeline_plots.plot_step_timeline(timeline)
    figure.savefig(io.BytesIO(), format="png")
    seconds = time.perf_counter() - start
    plt.close(figure)
    return seconds


def main() -> dict:
    figures = {}
    print(f"{'set-up':>58} {'points':>7} {'first plan':>11} {'redraw median':>14} {'slowest':>8}")
    for name, optimizer, mixed_precision, checkpointing in SETUPS:
        model = models.fine_tuning_architectures(torch.float32, checkpointing)[name]
        start = time.perf_counter()
        timeline = memory.plan_step_timeline(model, optimizer, 4, 128, mixed_precision=mixed_precision)
        first = time.perf_counter() - start
        redraws = [redraw_seconds(model, optimizer, mixed_precision) for _ in range(REDRAWS)]
        label = f"{name}, {optimizer}, {mixed_precision}{', checkpointed' if checkpointing else ''}"
        print(f"{label:>58} {len(timeline.phases):>7,} {first:>10.1f}s {statistics.median(redraws):>13.2f}s "
              f"{max(redraws):>7.2f}s", flush=True)
        figures[label] = {"first": first, "redraw_median": statistics.median(redraws), "redraw_max": max(redraws)}
    return figures


if __name__ == "__main__":
    main()
