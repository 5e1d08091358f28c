"""Figures of AdamW: its moving averages and step sizes (lesson 2).

:func:`plot_moving_averages` draws the static figure; :func:`moving_average_explorer`
puts the same figure under two sliders (beta1, beta2) and redraws it when they move.
Every figure has a title, labelled axes and units.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_utils.adamw import DEFAULT_BETA1, DEFAULT_BETA2, DEFAULT_EPS, DEFAULT_LR, ema_traces

__all__ = ["plot_moving_averages", "moving_average_explorer", "MovingAverageExplorer"]

FIGURE_SIZE = (8, 7)


def plot_moving_averages(gradients, beta1=DEFAULT_BETA1, beta2=DEFAULT_BETA2, lr=DEFAULT_LR, eps=DEFAULT_EPS):
    """Plot AdamW's two moving averages and its update over a 1-D gradient sequence; return the Figure.

    Three panels share the step axis: the gradients with their moving average
    ``m`` (raw and bias-corrected), the root of the squared-gradient average
    ``sqrt(v)`` (in gradient units, raw and bias-corrected), and the update
    ``m_hat / (sqrt(v_hat) + eps)`` in units of ``lr``.
    """
    traces = ema_traces(gradients, beta1=beta1, beta2=beta2, lr=lr, eps=eps)
    figure, _ = plt.subplots(3, 1, figsize=FIGURE_SIZE, sharex=True)
    _draw_moving_averages(figure, traces, beta1, beta2, lr)
    return figure


def _draw_moving_averages(figure, traces, beta1, beta2, lr):
    """Draw the three panels of :func:`plot_moving_averages` on ``figure``'s three axes, from ``ema_traces`` output."""
    gradient_ax, second_moment_ax, update_ax = figure.axes
    steps = range(1, len(traces["gradient"]) + 1)
    for ax in figure.axes:
        ax.clear()

    gradient_ax.plot(steps, traces["gradient"], ".", color="0.6", markersize=3, label="gradient g")
    gradient_ax.plot(steps, traces["exp_avg"], "--", color="C0", label="m, raw moving average")
    gradient_ax.plot(steps, traces["exp_avg_hat"], color="C0", linewidth=2, label="m̂, bias-corrected")
    gradient_ax.set_ylabel("gradient")
    gradient_ax.set_title(f"First moment: moving average of the gradients (β1 = {beta1:g})")

    second_moment_ax.plot(steps, traces["gradient"].abs(), ".", color="0.6", markersize=3, label="|g|")
    second_moment_ax.plot(steps, traces["exp_avg_sq"].sqrt(), "--", color="C1", label="√v, raw")
    second_moment_ax.plot(steps, traces["exp_avg_sq_hat"].sqrt(), color="C1", linewidth=2, label="√v̂, bias-corrected")
    second_moment_ax.set_ylabel("gradient magnitude")
    second_moment_ax.set_title(f"Second moment: moving average of the squared gradients (β2 = {beta2:g})")

    update_ax.plot(steps, traces["update_without_bias_correction"] / lr, "--", color="C2", label="m / (√v + ε), no bias correction")
    update_ax.plot(steps, traces["update"] / lr, color="C2", linewidth=2, label="m̂ / (√v̂ + ε), AdamW")
    update_ax.axhline(0, color="0.3", linewidth=0.8)
    update_ax.set_ylabel("update (units of lr)")
    update_ax.set_xlabel("optimizer step")
    update_ax.set_title("Resulting step: what AdamW subtracts from the weight, divided by lr")

    for ax in figure.axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    figure.tight_layout()


class MovingAverageExplorer:
    """Two sliders (beta1, beta2) above :func:`plot_moving_averages`'s figure, redrawn when a slider moves.

    Displaying the explorer in JupyterLab shows ``widget`` (an ipywidgets
    ``VBox``). The figure is a ``matplotlib.figure.Figure`` kept outside pyplot,
    so the notebook shows it only inside the widget's ``Output``.
    """

    def __init__(self, gradients, beta1=DEFAULT_BETA1, beta2=DEFAULT_BETA2, lr=DEFAULT_LR, eps=DEFAULT_EPS):
        import ipywidgets as widgets

        # Validate everything once, before any widget exists.
        ema_traces(gradients, beta1=beta1, beta2=beta2, lr=lr, eps=eps)
        self.gradients, self.lr, self.eps = gradients, lr, eps
        # Redraw on release, not at every pixel of a drag: a redraw takes a tenth of a second.
        self.beta1_slider = widgets.FloatSlider(
            value=beta1, min=0.0, max=0.99, step=0.01, description="β1", continuous_update=False, readout_format=".2f"
        )
        self.beta2_slider = widgets.FloatSlider(
            value=beta2, min=0.5, max=0.9999, step=0.0001, description="β2", continuous_update=False, readout_format=".4f"
        )
        self.output = widgets.Output()
        self.figure = Figure(figsize=FIGURE_SIZE)
        self.figure.subplots(3, 1, sharex=True)
        self.redraw_count = 0
        for slider in (self.beta1_slider, self.beta2_slider):
            slider.observe(self.redraw, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.beta1_slider, self.beta2_slider]), self.output])
        self.redraw()

    def redraw(self, change=None):
        """Recompute the moving averages for the sliders' betas and show the figure again."""
        from IPython.display import display

        beta1, beta2 = self.beta1_slider.value, self.beta2_slider.value
        traces = ema_traces(self.gradients, beta1=beta1, beta2=beta2, lr=self.lr, eps=self.eps)
        _draw_moving_averages(self.figure, traces, beta1, beta2, self.lr)
        self.redraw_count += 1
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def moving_average_explorer(gradients, beta1=DEFAULT_BETA1, beta2=DEFAULT_BETA2, lr=DEFAULT_LR, eps=DEFAULT_EPS):
    """Return a :class:`MovingAverageExplorer`: sliders for beta1 and beta2 that redraw the moving averages live.

    Make it the last expression of a cell to show it. Outside a live kernel
    (a static copy of the notebook) the sliders do not work: the lesson draws
    :func:`plot_moving_averages` as well.
    """
    return MovingAverageExplorer(gradients, beta1=beta1, beta2=beta2, lr=lr, eps=eps)
