"""Lesson 9's pipeline timeline: one row per stage, a bar per pass, every label inside the image."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from figure_checks import assert_nothing_is_cropped

from course_utils.plots.pipeline import plot_pipeline_timeline


def ideal(p, m):
    """Every pass one millisecond; stage s runs its forwards in slots s .. s + m - 1 (GPipe, forwards only)."""
    return [[(1e-3 * (s + i), 1e-3 * (s + i + 1), "F", i) for i in range(m)] for s in range(p)]


def test_it_draws_a_bar_per_pass_and_a_row_per_stage_with_every_label_kept():
    figure = plot_pipeline_timeline({"GPipe, m = 4": ideal(2, 4), "1F1B, m = 4": ideal(2, 4)})
    try:
        first = figure.axes[0]
        assert len(first.patches) == 8
        assert [t.get_text() for t in first.get_yticklabels()] == ["stage 0", "stage 1"]
        assert "ms" in first.get_xlabel() and figure._suptitle.get_text()
        # drawn from the first start: stage 1's first bar starts one pass later, at 1 ms
        assert min(p.get_x() for p in first.patches) == 0 and sorted({p.get_x() for p in first.patches})[1] == 1.0
        assert_nothing_is_cropped(figure)
    finally:
        plt.close(figure)


def test_it_refuses_an_empty_timeline():
    with pytest.raises(TypeError, match="timelines"):
        plot_pipeline_timeline({})
