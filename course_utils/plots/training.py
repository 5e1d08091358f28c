"""Figures about training runs: loss curves (lesson 1). Every figure has a title, labelled axes and units.

Each function draws on a new figure (or the ``ax`` it is given) and returns the
matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["plot_loss_curves", "moving_average"]


def plot_loss_curves(histories, title="Training loss", ax=None, smooth=1):
    """Plot one loss curve per entry of ``histories`` (name -> list of per-step losses).

    ``smooth`` > 1 also draws a moving average over that many steps, which is
    easier to read than the noisy per-batch loss. Returns the Figure.
    """
    if not isinstance(histories, dict) or not histories:
        raise ValueError("histories must be a non-empty dict of name -> list of losses")
    if not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")
    for name, losses in histories.items():
        if len(losses) == 0:
            raise ValueError(f"histories[{name!r}] is empty: there is no loss to plot")
    figure, ax = _figure_and_axes(ax, figsize=(7, 3.5))
    # Dashed lines of decreasing width so that curves which coincide stay visible.
    styles = [("-", 3.0), ("--", 1.6), (":", 1.4), ("-.", 1.2)]
    for index, (name, losses) in enumerate(histories.items()):
        linestyle, width = styles[index % len(styles)]
        steps = range(1, len(losses) + 1)
        if smooth > 1 and len(losses) >= smooth:
            ax.plot(steps, losses, alpha=0.25, linewidth=0.8, color=f"C{index}")
            averaged = moving_average(losses, smooth)
            ax.plot(range(smooth, len(losses) + 1), averaged, linestyle, linewidth=width, color=f"C{index}",
                    label=f"{name} ({smooth}-step average)")
        else:
            ax.plot(steps, losses, linestyle, linewidth=width, color=f"C{index}", label=name)
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def moving_average(values, window):
    """Return the averages of every ``window`` consecutive ``values`` (len(values) - window + 1 floats)."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    if len(values) < window:
        raise ValueError(f"values has {len(values)} entries, fewer than window={window}")
    total = sum(values[:window])
    averages = [total / window]
    for index in range(window, len(values)):
        total += values[index] - values[index - window]
        averages.append(total / window)
    return averages


def _figure_and_axes(ax, figsize):
    if ax is None:
        figure, ax = plt.subplots(figsize=figsize)
        return figure, ax
    return ax.figure, ax
