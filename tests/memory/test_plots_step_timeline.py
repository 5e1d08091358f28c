"""Specification of plots.step_timeline (lesson 4): the figure is titled, labelled, drawn from the timeline's bytes, nothing cropped; its explorer plans a set-up once."""


import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils.plots import step_timeline as plot_module  # noqa: E402
from course_utils.memory import DRAWN_PARTS, StepTimeline  # noqa: E402
from course_utils.units import MIB  # noqa: E402
from figure_checks import assert_nothing_is_cropped  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def made_up_timeline(points=40, blocks=4, extrapolated=False):
    """A timeline with a forward ramp, a backward pass trading activations for gradients, and an optimizer bump (bytes)."""
    half = points // 2
    activations = np.concatenate([np.arange(half), np.arange(half, 0, -1)]) * MIB
    gradients = np.concatenate([np.zeros(half), np.arange(half)]) * MIB // 2
    held = np.zeros((points + 3, len(DRAWN_PARTS)), dtype=np.int64)
    held[:, 0], held[:, 1] = 10 * MIB, 20 * MIB
    held[:points, 2], held[:points, 3] = gradients, activations
    held[points:, 2] = gradients[-1]
    held[points + 1, 4] = 3 * MIB
    phases = ("forward 1",) * half + ("backward 1",) * half + ("optimizer step",) * 2 + ("zero_grad",)
    return StepTimeline(phases, ("op",) * (points + 3), held, blocks, blocks, extrapolated)


def test_the_figure_stacks_the_parts_marks_the_peak_and_names_the_phases():
    timeline = made_up_timeline()
    figure = plot_module.plot_step_timeline(timeline, title="a step")
    ax = figure.axes[0]
    assert ax.get_title() == "a step" and "operations" in ax.get_xlabel() and ax.get_ylabel() == "memory held (MiB)"
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(DRAWN_PARTS)
    texts = [text.get_text() for text in ax.texts]
    assert {"forward 1", "backward 1"} <= set(texts)
    (marker,) = [line for line in ax.lines if line.get_marker() == "v"]
    assert marker.get_ydata()[0] == pytest.approx(timeline.peak / MIB)
    assert marker.get_xdata()[0] == timeline.peak_index
    # The stack's top at the peak is the peak.
    top = ax.collections[len(DRAWN_PARTS) - 1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(timeline.peak / MIB)
    assert_nothing_is_cropped(figure)


def test_a_long_timeline_is_drawn_from_fewer_points_keeping_the_peak():
    timeline = made_up_timeline(points=3 * plot_module.MAX_DRAWN_POINTS)
    drawn = plot_module.points_to_draw(timeline)
    assert len(drawn) <= plot_module.MAX_DRAWN_POINTS + 3 and timeline.peak_index in drawn
    assert drawn[0] == 0 and drawn[-1] == len(timeline.phases) - 1


def test_the_depth_is_said_in_words():
    assert "extrapolated" in plot_module.describe_depth(made_up_timeline(extrapolated=True))
    shallow = StepTimeline(("forward 1",), ("op",), np.ones((1, len(DRAWN_PARTS)), np.int64), 32, 8, False)
    assert "first 8 of 32 blocks" in plot_module.describe_depth(shallow)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="timeline must be a StepTimeline"):
        plot_module.plot_step_timeline({"peak": 1})


def test_the_explorer_plans_a_set_up_once_and_says_why_one_is_refused():
    pytest.importorskip("ipywidgets")
    asked = []

    def timeline(model, model_side, checkpointing, setup):
        asked.append((model, setup.optimizer))
        if setup.optimizer == "sgd":
            raise ValueError("the planner cannot follow this one")
        return made_up_timeline()

    explorer = plot_module.step_timeline_explorer(["tiny"], timeline, {"adamw": ("adamw", {}), "refused": ("sgd", {})},
                                                  {"fp32": ("float32", "no")})
    assert "peak" in explorer.summary.value and explorer.figure.axes[0].get_title()
    explorer.optimizer.value = "refused"
    assert "the planner cannot follow this one" in explorer.summary.value
    explorer.optimizer.value = "adamw"
    assert asked == [("tiny", "adamw"), ("tiny", "sgd")]
