"""Lesson 3's figures: what block-wise 8-bit codes and Adafactor's factored moment keep, and what they cost.

- :func:`plot_quantization_error`: how much block-wise 8-bit codes change each value,
- :func:`plot_factored_second_moment`: Adafactor's rank-1 rebuild next to the full matrix,
- :func:`plot_optimizer_tradeoff`: state bytes per parameter against distance from AdamW's update,
- :func:`plot_optimizer_memory_by_model`: the state of several optimizers over a family of models.

Each returns the matplotlib ``Figure`` it drew on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from course_utils.units import format_bytes
from course_utils.validation import check_non_negative_number

__all__ = [
    "plot_quantization_error",
    "plot_factored_second_moment",
    "plot_optimizer_tradeoff",
    "plot_optimizer_memory_by_model",
    "short_count",
]


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
    own_figure = ax is None
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
    key = "\n".join(f"{number}  {name}: {short_count(parameter_counts[name])}"
                    for number, name in enumerate(models_in_order, start=1))
    # In the layout, so the figure makes room for it: a key left out of the layout is cropped
    # away by the notebook's tight bounding box.
    ax.text(1.02, 1.0, key, transform=ax.transAxes, va="top", ha="left", fontsize="small", family="monospace")
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
    if own_figure:
        figure.set_layout_engine("constrained")
    return figure


def short_count(count):
    """Return a parameter count the way people say it: ``'84.1k'``, ``'65.8M'``, ``'6.61B'``."""
    check_non_negative_number(count, "count")
    for suffix, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return f"{count:,}"


def _figure_and_axes(ax, figsize):
    if ax is None:
        return plt.subplots(figsize=figsize)
    return ax.figure, ax
