"""Figures of lesson 5's levers (making training fit): vanishing bf16 updates, gradient norms, memory against model size,
scores over seeds.

Every figure has a title, labelled axes and units; each function returns the
matplotlib ``Figure`` it drew, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_utils.units import GIB
from course_utils.validation import check_finite_numbers, check_positive_number

__all__ = ["plot_vanishing_updates", "plot_gradient_norms", "plot_memory_against_parameters", "plot_scores_over_seeds"]


def plot_vanishing_updates(relative_updates, changed_share, threshold=None):
    """Plot the share of a weight's entries an update changes, against the update's size relative to each entry.

    ``relative_updates``: the x values (update / |weight|, fractions);
    ``changed_share``: {storage name: share of entries changed, fractions in
    [0, 1], one per x}; ``threshold`` draws a vertical line there (e.g. 1/256).
    """
    check_finite_numbers(relative_updates, "relative_updates", non_negative=True)
    if not isinstance(changed_share, dict) or not changed_share:
        raise ValueError("changed_share must be a non-empty dict of storage name -> shares, one per relative update")
    for name, shares in changed_share.items():
        check_finite_numbers(shares, f"changed_share[{name!r}]", non_negative=True)
        if len(shares) != len(relative_updates):
            raise ValueError(f"changed_share[{name!r}] must hold one share per relative update "
                             f"({len(relative_updates)}), got {len(shares)}")
    if threshold is not None:
        check_positive_number(threshold, "threshold")
    figure, ax = plt.subplots(figsize=(7, 3.5))
    for index, (name, shares) in enumerate(changed_share.items()):
        ax.plot(relative_updates, [100 * share for share in shares], marker="o", markersize=3,
                linewidth=2.5 - index, label=name)
    if threshold is not None:
        ax.axvline(threshold, color="grey", linestyle=":", label=f"1/{round(1 / threshold)} of the weight")
    ax.set_xscale("log")
    ax.set_xlabel("update, relative to the weight it is added to (log scale)")
    ax.set_ylabel("entries that change (%)")
    ax.set_ylim(-5, 105)
    ax.set_title("Adding a small update to a real weight matrix: fp32 against bf16 storage")
    ax.legend(loc="lower right")
    figure.tight_layout()
    return figure


def plot_gradient_norms(grad_norms, max_grad_norm):
    """Plot the norm of the whole gradient at every optimizer step (before clipping), with the clipping threshold."""
    check_finite_numbers(grad_norms, "grad_norms", non_negative=True)
    check_positive_number(max_grad_norm, "max_grad_norm")
    figure, ax = plt.subplots(figsize=(7, 3.2))
    steps = range(1, len(grad_norms) + 1)
    ax.plot(steps, grad_norms, linewidth=1.2, label="gradient norm before clipping")
    ax.axhline(max_grad_norm, color="C3", linestyle="--", label=f"max_grad_norm = {max_grad_norm:g}: clipped above")
    ax.set_ylim(0, 1.4 * max(max(grad_norms), max_grad_norm))  # room above the curves for the legend
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("gradient norm (L2, no unit)")
    ax.set_title("The gradient's norm during fine-tuning, and where clipping acts")
    ax.legend(loc="upper right")
    figure.tight_layout()
    return figure


def plot_memory_against_parameters(lines, budget=None, title="Peak memory of one training step", budget_label="budget"):
    """Plot the planned peak (GiB) against parameter count, one line per combination of levers; return the Figure.

    ``lines``: {combination name: [(parameters, peak bytes), ...]}; ``budget``
    (bytes) draws a horizontal line, labelled ``budget_label``: a GPU's memory,
    in binary units as the card reports it (see ``course_utils.gpus``).
    """
    if not isinstance(lines, dict) or not lines or not all(isinstance(points, list) and points for points in lines.values()):
        raise ValueError("lines must be a non-empty dict of name -> non-empty list of (parameters, peak bytes)")
    if budget is not None:
        check_positive_number(budget, "budget")
    figure, ax = plt.subplots(figsize=(7.5, 4.2))
    for index, (name, points) in enumerate(lines.items()):
        points = sorted(points)
        ax.plot([p / 1e9 for p, _ in points], [peak / GIB for _, peak in points], marker="o", label=name,
                color=f"C{index}")
    if budget is not None:
        ax.axhline(budget / GIB, color="black", linestyle=":", label=f"{budget_label}: {budget / GIB:.2f} GiB")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("parameters (billions)")
    ax.set_ylabel("planned peak of one step (GiB)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    return figure


def plot_scores_over_seeds(scores, baseline=None, title="Validation accuracy over seeds", ylabel="validation accuracy",
                           highlight=None):
    """Draw one column of points per variant, one point per seed (a strip plot), with each median; return the Figure.

    ``scores`` maps a variant's name to ``{seed: score}``; ``baseline`` (a score) draws a
    dashed line (the majority class); ``highlight`` (a seed) rings that seed's points.
    """
    if not isinstance(scores, dict) or not scores or not all(isinstance(v, dict) and v for v in scores.values()):
        raise ValueError("scores must be a non-empty dict of variant -> {seed: score}")
    figure, ax = plt.subplots(figsize=(7.5, 4.2))
    for position, (name, by_seed) in enumerate(scores.items()):
        seeds = sorted(by_seed)
        values = [by_seed[seed] for seed in seeds]
        # Spread the points sideways by seed so that equal scores stay visible.
        offsets = [(index - (len(seeds) - 1) / 2) * 0.06 for index in range(len(seeds))]
        ax.scatter([position + o for o in offsets], values, color=f"C{position}", zorder=3,
                   label=f"{name} ({len(seeds)} seeds)")
        ordered = sorted(values)
        middle = len(ordered) // 2
        median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        ax.hlines(median, position - 0.25, position + 0.25, color=f"C{position}", linewidth=2)
        if highlight in by_seed:
            ax.scatter([position + offsets[seeds.index(highlight)]], [by_seed[highlight]], s=160, facecolors="none",
                       edgecolors="black", zorder=4)
    if baseline is not None:
        ax.axhline(baseline, color="0.4", linestyle="--", linewidth=1, label=f"majority class: {baseline:.3f}")
    ax.set_xticks(range(len(scores)))
    ax.set_xticklabels(list(scores))
    ax.set_xlim(-0.6, len(scores) - 0.4)
    ax.set_xlabel("training (each point one seed; bar: median)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return figure
