"""Lesson 1's figures: loss curves, and the three ways to train measured the same way on their own code."""

import inspect

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils import loops, plots  # noqa: E402
from course_utils.plots import training  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def labelled_lines(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def assert_every_text_inside_the_saved_image(figure):
    """Everything drawn fits the figure, so the inline backend's tight crop cuts nothing off."""
    figure.canvas.draw()
    drawn = figure.get_tightbbox(figure.canvas.get_renderer())  # inches, drawn artists only
    width, height = figure.get_size_inches()
    tolerance = 0.02
    assert drawn.x0 >= -tolerance and drawn.y0 >= -tolerance, drawn
    assert drawn.x1 <= width + tolerance and drawn.y1 <= height + tolerance, drawn


# --------------------------------------------------------------------------- loss curves


def test_loss_curves_draw_each_history_and_its_moving_average():
    plain, accelerated = [1.0, 0.9, 0.8, 0.85, 0.6, 0.5], [1.0, 0.95, 0.7, 0.8, 0.65, 0.4]
    figure = plots.plot_loss_curves({"plain": plain, "accelerate": accelerated}, title="Two loops", smooth=3)
    (ax,) = figure.axes
    lines = labelled_lines(ax)
    assert set(lines) == {"plain (3-step average)", "accelerate (3-step average)"}
    assert np.allclose(lines["plain (3-step average)"].get_ydata(), plots.moving_average(plain, 3))
    assert list(lines["plain (3-step average)"].get_xdata()) == [3, 4, 5, 6]
    raw = [line for line in ax.get_lines() if line.get_label().startswith("_")]
    assert [list(line.get_ydata()) for line in raw] == [plain, accelerated]
    assert ax.get_title() == "Two loops"
    assert ax.get_xlabel() == "optimizer step" and "nats" in ax.get_ylabel()
    assert_every_text_inside_the_saved_image(figure)


def test_without_smoothing_each_curve_is_the_raw_losses():
    figure = plots.plot_loss_curves({"run": [0.7, 0.6, 0.65]})
    (line,) = figure.axes[0].get_lines()
    assert line.get_label() == "run" and list(line.get_ydata()) == [0.7, 0.6, 0.65]


def test_curves_that_coincide_stay_distinguishable():
    figure = plots.plot_loss_curves({"a": [1.0, 0.5], "b": [1.0, 0.5]})
    first, second = figure.axes[0].get_lines()
    assert (first.get_linestyle(), first.get_linewidth()) != (second.get_linestyle(), second.get_linewidth())


def test_moving_average_averages_each_window():
    assert plots.moving_average([1, 2, 3, 4, 5], 2) == pytest.approx([1.5, 2.5, 3.5, 4.5])
    assert plots.moving_average([2.0, 4.0], 1) == pytest.approx([2.0, 4.0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plots.plot_loss_curves({}), "histories must be a non-empty dict"),
        (lambda: plots.plot_loss_curves({"a": []}), r"histories\['a'\] is empty"),
        (lambda: plots.plot_loss_curves({"a": [1.0]}, smooth=0), "smooth must be a positive int"),
        (lambda: plots.moving_average([1.0], 2), "fewer than window=2"),
        (lambda: plots.moving_average([1.0], 0), "window must be a positive int"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------- three ways to train


def test_a_call_counts_once_whatever_its_arguments_and_a_loop_counts_its_body():
    def configured(model):
        """A docstring is not a statement."""
        settings = dict(
            a=1,
            b=2,
            c=3,
        )
        return settings

    def looped(items):
        total = 0
        for item in items:
            # a comment is not a statement
            total += item
        return total

    assert plots.count_statements(configured) == 2
    assert plots.count_statements(looped) == 4


def test_the_twins_write_every_step_part_and_the_trainer_none():
    every_part = list(training.TRAINING_STEP_PARTS)
    assert plots.training_step_parts_in(loops.train_plain) == every_part
    assert plots.training_step_parts_in(loops.train_accelerate) == every_part
    assert plots.training_step_parts_in(loops.train_with_trainer) == []


def test_a_step_part_named_only_in_a_comment_is_not_counted():
    def commented(optimizer):
        # optimizer.zero_grad() is left to someone else
        optimizer.step()

    assert plots.training_step_parts_in(commented) == ["optimizer step"]


def test_the_three_ways_are_placed_at_their_measured_statements_and_parts():
    functions = {"plain loop": loops.train_plain, "Accelerate loop": loops.train_accelerate,
                 "Trainer": loops.train_with_trainer}
    figure = plots.plot_trainer_versus_accelerator(functions)
    (ax,) = figure.axes
    points = [tuple(collection.get_offsets()[0]) for collection in ax.collections]
    expected = [(plots.count_statements(f), len(plots.training_step_parts_in(f))) for f in functions.values()]
    assert points == expected
    trainer_statements = plots.count_statements(loops.train_with_trainer)
    assert trainer_statements < plots.count_statements(loops.train_accelerate)  # the easiest, as the lesson says
    names = [text.get_text().split("\n")[0] for text in ax.texts]
    assert names == list(functions)
    assert ax.get_title() and "statements" in ax.get_xlabel() and "parts" in ax.get_ylabel()
    assert_every_text_inside_the_saved_image(figure)


def test_three_ways_names_a_bad_argument():
    with pytest.raises(ValueError, match="training_functions must be a non-empty dict"):
        plots.plot_trainer_versus_accelerator({})
    with pytest.raises(TypeError, match=r"training_functions\['x'\] must be a function"):
        plots.plot_trainer_versus_accelerator({"x": 3})


def test_the_training_module_exports_what_it_defines():
    defined = {name for name, value in vars(training).items()
               if not name.startswith("_") and inspect.isfunction(value) and value.__module__ == training.__name__}
    assert set(training.__all__) == defined
    for name in defined:
        assert getattr(plots, name) is getattr(training, name)
