"""Figures for the memory lessons: what optimizers and training steps hold, against model size (lessons 2 and 3).

Lesson 2 draws :func:`plot_state_memory_vs_parameters`: one optimizer's state against parameter count.

Lesson 3 draws:

- :func:`plot_quantization_error`: how much block-wise 8-bit codes change each value,
- :func:`plot_factored_second_moment`: Adafactor's rank-1 rebuild next to the full matrix,
- :func:`plot_optimizer_tradeoff`: state bytes per parameter against distance from AdamW's update,
- :func:`plot_optimizer_memory_by_model`: optimizer state of several optimizers over a family of models,
- :func:`plot_training_memory_breakdown`: stacked bars of weights, gradients, optimizer state and activations,
- :func:`training_memory_explorer`: the same bars under widgets (model, optimizer, precision, batch, length).

Every figure has a title, labelled axes and units (MiB = 1024**2 bytes, GiB = 1024**3 bytes).
Each plotting function returns the matplotlib ``Figure`` it drew on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

__all__ = [
    "plot_state_memory_vs_parameters",
    "MEMORY_COMPONENTS",
    "format_bytes",
    "plot_quantization_error",
    "plot_factored_second_moment",
    "plot_optimizer_tradeoff",
    "plot_optimizer_memory_by_model",
    "plot_training_memory_breakdown",
    "TrainingMemoryExplorer",
    "training_memory_explorer",
]

# What a training step holds, bottom to top of a stacked bar, and how each is drawn.
MEMORY_COMPONENTS = {
    "weights": ("weights", "C0"),
    "gradients": ("gradients", "C1"),
    "optimizer_state": ("optimizer state", "C2"),
    "activations": ("activations", "C3"),
}
MIB = 1024**2
GIB = 1024**3
_BYTE_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("bytes", 1))


def format_bytes(num_bytes: float, digits: int = 1) -> str:
    """Return ``num_bytes`` in the largest binary unit that keeps it at least 1: ``'501.9 MiB'``, ``'12.3 GiB'``."""
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)) or not math.isfinite(num_bytes) or num_bytes < 0:
        raise ValueError(f"num_bytes must be a non-negative number, got {num_bytes!r}")
    for unit, size in _BYTE_UNITS:
        if num_bytes >= size or size == 1:
            if size == 1:
                return f"{num_bytes:,.0f} bytes"
            return f"{num_bytes / size:,.{digits}f} {unit}"
    raise AssertionError("unreachable")



# --------------------------------------------------------------------------- one optimizer against model size (lesson 2)


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


# --------------------------------------------------------------------------- 8-bit codes and factored moments


def plot_quantization_error(original, restored, block_size=256, title="What 8-bit block-wise codes do to each value", ax=None):
    """Plot each value's relative error against its size within its block, one colour per method; return the Figure.

    ``original`` is a tensor; ``restored`` maps a method name to the tensor it
    gave back after quantising and dequantising ``original`` in blocks of
    ``block_size`` elements. The x axis is ``|value| / absmax of its block``
    (1 = the block's largest value), the y axis ``|restored - value| / |value|``;
    a value rounded to zero has relative error 1 (100 %). Zeros in ``original``
    are left out. At most 4,000 values per method are drawn.
    """
    if not isinstance(original, torch.Tensor) or original.numel() == 0:
        raise ValueError("original must be a non-empty torch.Tensor")
    if not isinstance(restored, Mapping) or not restored:
        raise ValueError("restored must be a non-empty dict of method name -> restored tensor")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    values = original.detach().float().flatten()
    padding = (-values.numel()) % block_size
    absmax = torch.cat([values, values.new_zeros(padding)]).view(-1, block_size).abs().amax(dim=1)
    absmax = absmax.repeat_interleave(block_size)[: values.numel()]
    keep = values != 0
    # The same random subset for every method, so the clouds are comparable.
    generator = torch.Generator().manual_seed(0)
    chosen = keep.nonzero().flatten()
    chosen = chosen[torch.randperm(chosen.numel(), generator=generator)[:4000]]
    relative_size = (values[chosen].abs() / absmax[chosen]).numpy()
    figure, ax = _figure_and_axes(ax, figsize=(7, 4))
    for index, (name, tensor) in enumerate(restored.items()):
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != values.numel():
            raise ValueError(f"restored[{name!r}] must be a tensor with as many elements as original ({values.numel():,})")
        back = tensor.detach().float().flatten()
        error = ((back - values).abs() / values.abs())[keep]
        lost = (back[keep] == 0).float().mean().item()
        # Errors beyond 1000 % (tiny values rounded up to the smallest code) are drawn at 1000 %.
        shown = ((back[chosen] - values[chosen]).abs() / values[chosen].abs()).clamp(min=1e-5, max=10.0).numpy()
        label = f"{name}: median error {error.median().item():.1%}, {lost:.1%} of values rounded to 0"
        ax.scatter(relative_size, shown, s=4, alpha=0.35, color=f"C{index}", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(5e-6, 20)
    ax.axhline(1.0, color="0.3", linewidth=0.8, linestyle=":")
    ax.text(0.99, 1.0, "100 %: the value is lost (rounded to 0)", transform=ax.get_yaxis_transform(),
            ha="right", va="bottom", fontsize="x-small", color="0.3")
    ax.set_xlabel("|value| / largest |value| of its block (log scale)")
    ax.set_ylabel("relative error after quantise + dequantise\n(log scale, clipped at 1000 %)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y * 100:.{max(0, -int(math.floor(math.log10(y * 100))))}f} %"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    legend = ax.legend(loc="lower left", fontsize="small", markerscale=3)
    for handle in legend.legend_handles:
        handle.set_alpha(1)
    figure.tight_layout()
    return figure


def plot_factored_second_moment(full, rebuilt, title="Adafactor: the squared-gradient average and its rank-1 rebuild"):
    """Draw the full matrix and its rebuild from row and column means side by side, on one log colour scale; return the Figure.

    ``full`` is an ``n x m`` non-negative matrix (e.g. AdamW's ``exp_avg_sq``
    for one weight); ``rebuilt`` the same shape (e.g. from
    :func:`course_utils.quantization.reconstruct_second_moment`). The titles
    give how many numbers each one needs: ``n * m`` against ``n + m``.
    """
    for name, matrix in (("full", full), ("rebuilt", rebuilt)):
        if not isinstance(matrix, torch.Tensor) or matrix.dim() != 2:
            raise ValueError(f"{name} must be a 2-D torch.Tensor, got {type(matrix).__name__}")
    if full.shape != rebuilt.shape:
        raise ValueError(f"full and rebuilt must have the same shape, got {tuple(full.shape)} and {tuple(rebuilt.shape)}")
    full, rebuilt = full.detach().float(), rebuilt.detach().float()
    positive = torch.cat([full[full > 0], rebuilt[rebuilt > 0]])
    if positive.numel() == 0:
        raise ValueError("full and rebuilt are all zeros: there is nothing to draw on a log scale")
    norm = LogNorm(vmin=positive.min().item(), vmax=positive.max().item())
    rows, cols = full.shape
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True, layout="constrained")
    floor = norm.vmin  # log colours cannot show 0: draw zeros as the smallest colour
    for ax, matrix, subtitle in (
        (left, full, f"full: {rows} × {cols} = {rows * cols:,} numbers"),
        (right, rebuilt, f"rank-1 rebuild from {rows} + {cols} = {rows + cols:,} numbers"),
    ):
        image = ax.imshow(matrix.clamp(min=floor).numpy(), norm=norm, cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_title(subtitle, fontsize="medium")
        ax.set_xlabel(f"column (input feature, 0-{cols - 1})")
    left.set_ylabel(f"row (output feature, 0-{rows - 1})")
    error = ((rebuilt - full).norm() / full.norm().clamp(min=1e-30)).item()
    figure.colorbar(image, ax=[left, right], label="average squared gradient (log scale)")
    figure.suptitle(f"{title}\n(relative error of the rebuild, Frobenius norm: {error:.1%})")
    return figure


def plot_optimizer_tradeoff(points, num_steps=None, title="Memory against fidelity: what each optimizer trades", ax=None):
    """Plot one point per optimizer: state bytes per parameter (x) against its distance from AdamW's update (y).

    ``points`` maps an optimizer name to ``(state_bytes_per_parameter, distance)``,
    both measured: the state from the optimizer's tensors after a step, the
    distance as ``||update - AdamW's update|| / ||AdamW's update||`` after the
    same ``num_steps`` gradients. Returns the Figure.
    """
    if not isinstance(points, Mapping) or not points:
        raise ValueError("points must be a non-empty dict of optimizer name -> (bytes per parameter, distance)")
    for name, point in points.items():
        if not (isinstance(point, (tuple, list)) and len(point) == 2 and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in point)):
            raise ValueError(f"points[{name!r}] must be (bytes per parameter, distance), two non-negative numbers, got {point!r}")
    figure, ax = _figure_and_axes(ax, figsize=(7, 4.2))
    for index, (name, (bytes_per_parameter, distance)) in enumerate(points.items()):
        ax.scatter([bytes_per_parameter], [distance], s=80, color=f"C{index}", zorder=3)
        ax.annotate(
            f"{name}\n{bytes_per_parameter:.2f} B/param, {distance:.0%}",
            (bytes_per_parameter, distance), textcoords="offset points", xytext=(8, 6), fontsize="small",
        )
    largest_x = max(x for x, _ in points.values())
    largest_y = max(y for _, y in points.values())
    ax.set_xlim(0, largest_x * 1.35 + 0.5)
    ax.set_ylim(-0.05 * max(largest_y, 0.1), max(largest_y, 0.1) * 1.3)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0%}"))
    ax.set_xlabel("optimizer state (bytes per parameter, measured)")
    steps = f" after {num_steps} steps" if num_steps else ""
    ax.set_ylabel(f"distance from AdamW's update{steps}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


# --------------------------------------------------------------------------- memory against model size


def plot_optimizer_memory_by_model(parameter_counts, state_bytes, title="Optimizer state against model size", ax=None):
    """Plot each optimizer's state (bytes, log scale) against parameter count (log scale); return the Figure.

    ``parameter_counts`` maps a model name to its parameter count;
    ``state_bytes`` maps an optimizer name to ``{model name: state bytes}``
    for some or all of those models. Points of one optimizer are joined in
    order of parameter count; model names label the x positions.
    """
    if not isinstance(parameter_counts, Mapping) or not parameter_counts:
        raise ValueError("parameter_counts must be a non-empty dict of model name -> parameter count")
    if not isinstance(state_bytes, Mapping) or not state_bytes:
        raise ValueError("state_bytes must be a non-empty dict of optimizer name -> {model name: bytes}")
    for optimizer_name, by_model in state_bytes.items():
        unknown = set(by_model) - set(parameter_counts)
        if unknown:
            raise ValueError(f"state_bytes[{optimizer_name!r}] names models missing from parameter_counts: {sorted(unknown)}")
    models_in_order = sorted(parameter_counts, key=parameter_counts.get)
    figure, ax = _figure_and_axes(ax, figsize=(11, 5))
    markers = "osD^v<>"
    for index, (optimizer_name, by_model) in enumerate(state_bytes.items()):
        names = [name for name in models_in_order if name in by_model]
        ax.plot(
            [parameter_counts[name] for name in names], [by_model[name] for name in names],
            marker=markers[index % len(markers)], color=f"C{index}", label=optimizer_name,
        )
    # Models of similar size would overlap as names on the plot: number them, name them beside it.
    for number, name in enumerate(models_in_order, start=1):
        ax.axvline(parameter_counts[name], color="0.85", linewidth=0.8, zorder=0)
        ax.annotate(str(number), (parameter_counts[name], 1.0), xycoords=("data", "axes fraction"), ha="center",
                    va="bottom", fontsize="small", xytext=(0, 2 + 10 * (number % 2)), textcoords="offset points")
    key = "\n".join(f"{number}  {name}: {_short_count(parameter_counts[name])}"
                    for number, name in enumerate(models_in_order, start=1))
    key_text = ax.text(1.02, 1.0, key, transform=ax.transAxes, va="top", ha="left", fontsize="small", family="monospace")
    key_text.set_in_layout(False)  # placed by hand in the space tight_layout leaves on the right
    ax.set_xscale("log")
    ax.set_yscale("log")
    # Ticks at powers of 32 bytes read as round binary sizes: 1 MiB, 32 MiB, 1 GiB, 32 GiB.
    ax.yaxis.set_major_locator(LogLocator(base=32))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_bytes(y, digits=0) if y > 0 else "0"))
    ax.set_xlabel("parameters (log scale)")
    ax.set_ylabel("optimizer state (log scale)")
    ax.set_title(title, pad=22)
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper left", fontsize="small")
    # Leave the right quarter of the figure to the key of model names.
    figure.tight_layout(rect=(0, 0, 0.76, 1))
    return figure


def _short_count(count):
    """Return a parameter count the way people say it: ``'84.1k'``, ``'65.8M'``, ``'6.61B'``."""
    for suffix, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return f"{count:,}"


def plot_training_memory_breakdown(breakdowns, title="Memory of one training step", ax=None, notes=None, xlabel="setup"):
    """Draw one stacked bar per entry: weights, gradients, optimizer state and activations; return the Figure.

    ``breakdowns`` maps a bar label to the bytes of each part, either a dict
    with the keys of :data:`MEMORY_COMPONENTS` or an object with those
    attributes (such as ``course_utils.memory.TrainingMemory``). A part that
    is ``None`` is unknown: the bar says "not estimated" instead of inventing
    a number. An optional ``peak`` (key or attribute) is drawn as a black
    line: a step's peak can exceed the sum, when temporaries are alive at
    the same time. ``notes`` maps a label to a line printed under its bar;
    ``xlabel`` names what the bars are.
    """
    if not isinstance(breakdowns, Mapping) or not breakdowns:
        raise ValueError("breakdowns must be a non-empty dict of label -> memory breakdown")
    notes = dict(notes or {})
    parts = {label: _memory_parts(label, breakdown) for label, breakdown in breakdowns.items()}
    largest = max(max(sum(v for v in p["components"].values() if v), p["peak"] or 0) for p in parts.values())
    unit, size = _unit_for(largest)
    figure, ax = _figure_and_axes(ax, figsize=(max(6, 1.9 * len(parts) + 2.5), 4.8))
    positions = range(len(parts))
    unknown_height = largest / size * 0.1  # the hatched box of a part that is not estimated
    peak_in_legend, in_legend = False, set()
    for position, (label, part) in zip(positions, parts.items()):
        bottom, unknown = 0.0, []
        for key, (name, colour) in MEMORY_COMPONENTS.items():
            value = part["components"][key]
            if value is None:
                unknown.append((name, colour))
                continue
            ax.bar(position, value / size, bottom=bottom, color=colour, width=0.6, label=None if key in in_legend else name)
            in_legend.add(key)
            bottom += value / size
        digits = 1 if unit == "GiB" else 0
        total_text = f"sum {bottom:,.{digits}f} {unit}"
        top = bottom
        for name, colour in unknown:
            ax.bar(position, unknown_height, bottom=top, color="white", edgecolor=colour, hatch="//", width=0.6)
            ax.text(position, top + unknown_height / 2, f"{name}: not estimated", ha="center", va="center",
                    fontsize="x-small", backgroundcolor="white")
            top += unknown_height
            total_text = f"{bottom:,.{digits}f} {unit} + ?"
        if part["peak"] is not None:
            ax.hlines(part["peak"] / size, position - 0.38, position + 0.38, color="black", linewidth=2.5,
                      label=None if peak_in_legend else "peak")
            peak_in_legend = True
            total_text = f"sum {bottom:,.{digits}f} {unit}\npeak {part['peak'] / size:,.{digits}f} {unit}"
            top = max(top, part["peak"] / size)
        ax.text(position, top, total_text, ha="center", va="bottom", fontsize="small")
    ax.set_xticks(list(positions))
    ax.set_xticklabels([f"{label}\n{notes[label]}" if label in notes else label for label in parts], fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(0, largest / size * 1.3)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    # Beside the axes: inside, the legend would hide the labels of the first bar.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    figure.tight_layout()
    return figure


def _memory_parts(label, breakdown):
    """Return ``{"components": {key: bytes or None}, "peak": bytes or None}`` from a dict or an object."""
    def read(key):
        if isinstance(breakdown, Mapping):
            return breakdown.get(key)
        return getattr(breakdown, key, None)

    components = {}
    for key in MEMORY_COMPONENTS:
        value = read(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"breakdowns[{label!r}].{key} must be a non-negative number of bytes or None, got {value!r}")
        components[key] = value
    if all(value is None for value in components.values()):
        raise ValueError(f"breakdowns[{label!r}] has none of {list(MEMORY_COMPONENTS)}")
    peak = read("peak")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak < 0):
        raise ValueError(f"breakdowns[{label!r}].peak must be a non-negative number of bytes or None, got {peak!r}")
    return {"components": components, "peak": peak}


def _unit_for(num_bytes):
    """Return ``("MiB", 2**20)`` or ``("GiB", 2**30)``: GiB once the largest value passes 4 GiB."""
    return ("GiB", 1024**3) if num_bytes >= 4 * 1024**3 else ("MiB", 1024**2)


def _figure_and_axes(ax, figsize):
    if ax is None:
        return plt.subplots(figsize=figsize)
    return ax.figure, ax


# --------------------------------------------------------------------------- the interactive explorer


class TrainingMemoryExplorer:
    """Widgets (model, optimizer, precision, batch size, sequence length) above a stacked bar, redrawn on change.

    ``estimate(model_name, optimizer, precision, batch_size, seq_len)`` returns
    a breakdown as :func:`plot_training_memory_breakdown` reads it (bytes of
    weights, gradients, optimizer state, activations, optional peak). Next to
    the chosen configuration the figure draws the same model, batch and
    length with ``reference`` = ``(optimizer, precision)``, so a saving shows
    at a glance. Displaying the explorer in JupyterLab shows ``widget`` (an
    ipywidgets ``VBox``); the figure is kept outside pyplot, so the notebook
    shows it only inside the widget.
    """

    def __init__(self, model_names, estimate, optimizers, precisions=("fp32",), batch_sizes=(1, 2, 4, 8, 16, 32, 64),
                 seq_lens=(64, 128, 256, 512, 1024, 2048), reference=None, initial=None):
        import ipywidgets as widgets

        for name, options in (("model_names", model_names), ("optimizers", optimizers), ("precisions", precisions),
                              ("batch_sizes", batch_sizes), ("seq_lens", seq_lens)):
            if isinstance(options, str) or not isinstance(options, Sequence) or len(options) == 0:
                raise ValueError(f"{name} must be a non-empty list, got {options!r}")
        for name, options in (("batch_sizes", batch_sizes), ("seq_lens", seq_lens)):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in options):
                raise ValueError(f"{name} must hold positive ints, got {options!r}")
        if not callable(estimate):
            raise TypeError(f"estimate must be a function (model, optimizer, precision, batch, length) -> breakdown, got {type(estimate).__name__}")
        self.estimate = estimate
        self.reference = tuple(reference) if reference is not None else (optimizers[0], precisions[0])
        initial = {"model": model_names[0], "optimizer": optimizers[0], "precision": precisions[0],
                   "batch_size": batch_sizes[len(batch_sizes) // 2], "seq_len": seq_lens[len(seq_lens) // 2], **(initial or {})}
        # Redraw on release, not at every pixel of a drag.
        self.model = widgets.Dropdown(options=list(model_names), value=initial["model"], description="model")
        self.optimizer = widgets.Dropdown(options=list(optimizers), value=initial["optimizer"], description="optimizer")
        self.precision = widgets.ToggleButtons(options=list(precisions), value=initial["precision"], description="precision")
        self.batch_size = widgets.SelectionSlider(options=list(batch_sizes), value=initial["batch_size"],
                                                  description="batch size", continuous_update=False)
        self.seq_len = widgets.SelectionSlider(options=list(seq_lens), value=initial["seq_len"],
                                               description="tokens/seq", continuous_update=False)
        self.output = widgets.Output()
        self.figure = Figure(figsize=(8, 4.8))
        self.figure.subplots()
        self.redraw_count = 0
        for control in (self.model, self.optimizer, self.precision, self.batch_size, self.seq_len):
            control.observe(self.redraw, names="value")
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.optimizer]),
            self.precision,
            widgets.HBox([self.batch_size, self.seq_len]),
            self.output,
        ])
        self.redraw()

    def breakdowns(self):
        """Return ``{bar label: breakdown}`` for the current widget values: the chosen setup, then the reference."""
        model, batch_size, seq_len = self.model.value, self.batch_size.value, self.seq_len.value
        chosen = (self.optimizer.value, self.precision.value)
        bars = {}
        for optimizer, precision in (chosen, self.reference):
            label = f"{optimizer}, {precision}"
            if label not in bars:
                bars[label] = self.estimate(model, optimizer, precision, batch_size, seq_len)
        return bars

    def redraw(self, change=None):
        """Estimate the chosen setup and its reference, and show the stacked bars again."""
        from IPython.display import display

        ax = self.figure.axes[0]
        ax.clear()
        plot_training_memory_breakdown(
            self.breakdowns(), ax=ax,
            title=f"{self.model.value}: one training step, batch {self.batch_size.value} × {self.seq_len.value} tokens",
        )
        self.redraw_count += 1
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def training_memory_explorer(model_names, estimate, optimizers, precisions=("fp32",), **options):
    """Return a :class:`TrainingMemoryExplorer`; make it the last expression of a cell to show it.

    Outside a live kernel (a static copy of the notebook) the widgets do not
    work: draw :func:`plot_training_memory_breakdown` as well.
    """
    return TrainingMemoryExplorer(model_names, estimate, optimizers, precisions, **options)
