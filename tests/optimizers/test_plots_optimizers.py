"""Lesson 2's figures show AdamW's moving averages, and the explorer redraws them when a slider moves."""

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils import adamw, plots  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def line_by_label(ax, label):
    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    return line


def test_moving_average_figure_has_three_titled_panels_with_labelled_axes():
    figure = plots.plot_moving_averages(adamw.noisy_gradients(num_steps=60))
    assert len(figure.axes) == 3
    for ax in figure.axes:
        assert ax.get_title() and ax.get_ylabel()
    assert figure.axes[-1].get_xlabel() == "optimizer step"
    assert "units of lr" in figure.axes[-1].get_ylabel()


def test_moving_average_figure_draws_the_traces_adamw_computes():
    gradients = adamw.noisy_gradients(num_steps=60)
    figure = plots.plot_moving_averages(gradients, beta1=0.8, beta2=0.99, lr=1e-2)
    traces = adamw.ema_traces(gradients, beta1=0.8, beta2=0.99, lr=1e-2)
    first, second, update = figure.axes
    assert np.allclose(line_by_label(first, "m̂, bias-corrected").get_ydata(), traces["exp_avg_hat"])
    assert np.allclose(line_by_label(second, "√v̂, bias-corrected").get_ydata(), traces["exp_avg_sq_hat"].sqrt())
    assert np.allclose(line_by_label(update, "m̂ / (√v̂ + ε), AdamW").get_ydata(), traces["update"] / 1e-2)
    assert "β1 = 0.8" in first.get_title() and "β2 = 0.99" in second.get_title()


def test_explorer_redraws_the_figure_when_a_slider_moves():
    gradients = adamw.noisy_gradients(num_steps=60)
    explorer = plots.moving_average_explorer(gradients, beta1=0.9, beta2=0.999)
    assert explorer.redraw_count == 1
    explorer.beta1_slider.value = 0.5
    explorer.beta2_slider.value = 0.9
    assert explorer.redraw_count == 3
    first_moment_ax = explorer.figure.axes[0]
    expected = adamw.ema_traces(gradients, beta1=0.5, beta2=0.9)["exp_avg_hat"]
    assert np.allclose(line_by_label(first_moment_ax, "m̂, bias-corrected").get_ydata(), expected)
    assert "β1 = 0.5" in first_moment_ax.get_title()


def test_explorer_is_an_ipywidgets_box_of_two_sliders_and_an_output():
    import ipywidgets

    explorer = plots.moving_average_explorer(adamw.noisy_gradients(num_steps=30))
    sliders, output = explorer.widget.children
    assert isinstance(output, ipywidgets.Output)
    assert [slider.description for slider in sliders.children] == ["β1", "β2"]
    assert "application/vnd.jupyter.widget-view+json" in explorer._repr_mimebundle_()


def test_explorer_figure_stays_out_of_pyplot_so_the_notebook_shows_it_once():
    plt.close("all")
    plots.moving_average_explorer(adamw.noisy_gradients(num_steps=30))
    assert plt.get_fignums() == []


def test_bad_betas_are_named():
    with pytest.raises(ValueError, match="beta1 must"):
        plots.plot_moving_averages([1.0, 2.0], beta1=1.0)
    with pytest.raises(ValueError, match="beta2 must"):
        plots.moving_average_explorer([1.0, 2.0], beta2=2)
    with pytest.raises(ValueError, match="gradients must"):
        plots.plot_moving_averages([])


def test_adamw_module_exports_what_it_defines():
    import inspect

    from course_utils.plots import adamw

    defined = {name for name, value in vars(adamw).items()
               if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
               and value.__module__ == adamw.__name__}
    assert set(adamw.__all__) == defined
    for name in defined:
        assert getattr(plots, name) is getattr(adamw, name)


# plot_state_memory_vs_parameters lives in plots/memory.py but belongs to lesson 2's optimizer state.


def test_state_memory_plot_marks_each_model_on_log_log_axes_in_mib():
    points = {"small": (84_000, 84_000 * 8), "distilbert-base-cased": (65_783_042, 65_783_042 * 8)}
    figure = plots.plot_state_memory_vs_parameters(points)
    (ax,) = figure.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "MiB" in ax.get_ylabel() and "parameters" in ax.get_xlabel() and ax.get_title()
    marker = line_by_label(ax, "distilbert-base-cased: 65,783,042 parameters, 501.9 MiB")
    assert marker.get_xdata()[0] == 65_783_042
    assert marker.get_ydata()[0] == pytest.approx(65_783_042 * 8 / 1024**2)


def test_state_memory_plot_draws_the_adamw_and_sgd_rules():
    figure = plots.plot_state_memory_vs_parameters({"model": (1e6, 8e6)}, unit="GiB")
    (ax,) = figure.axes
    adamw_line = line_by_label(ax, "AdamW: 8 bytes per parameter (2 fp32 states)")
    sgd_line = line_by_label(ax, "SGD with momentum: 4 bytes per parameter (1 fp32 state)")
    assert np.allclose(adamw_line.get_ydata(), adamw_line.get_xdata() * 8 / 1024**3)
    assert np.allclose(sgd_line.get_ydata(), sgd_line.get_xdata() * 4 / 1024**3)
    assert "GiB" in ax.get_ylabel()


def test_state_memory_plot_names_bad_arguments():
    with pytest.raises(ValueError, match="points must be"):
        plots.plot_state_memory_vs_parameters({})
    with pytest.raises(ValueError, match=r"points\['m'\] must be"):
        plots.plot_state_memory_vs_parameters({"m": (0, 8)})
    with pytest.raises(ValueError, match="unit must be"):
        plots.plot_state_memory_vs_parameters({"m": (1, 8)}, unit="MB")
