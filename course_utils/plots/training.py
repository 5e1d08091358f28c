"""Figures about training runs (lesson 1): loss curves, and three ways to train. Every figure has a title, labelled axes and units.

Each function draws on a new figure (or the ``ax`` it is given) and returns the
matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import matplotlib.pyplot as plt

from course_utils.validation import check_python_function

__all__ = [
    "plot_loss_curves",
    "moving_average",
    "plot_trainer_versus_accelerator",
    "training_step_parts_in",
    "count_statements",
]

# The parts of a training step, and the code that shows a function does it itself.
TRAINING_STEP_PARTS = {
    "zero_grad": "zero_grad(",
    "forward": "outputs = model(",
    "loss": "loss = outputs.loss",
    "backward": "backward(",
    "optimizer step": "optimizer.step(",
    "scheduler step": "lr_scheduler.step(",
}


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


def count_statements(function):
    """Return how many statements ``function``'s body holds, nested ones included, its docstring left out.

    A call counts once however many lines its arguments take, and a ``for``
    loop counts once plus the statements inside it: a measure of what a user
    writes that is the same for a loop and for a configured ``Trainer``.
    """
    body = _function_node(function).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return sum(1 for statement in body for node in ast.walk(statement) if isinstance(node, ast.stmt))


def training_step_parts_in(function):
    """Return the names of the training-step parts (zero_grad, forward, ...) written in ``function``'s code."""
    code = ast.unparse(_function_node(function))  # no comments: a part named in a comment is not done
    return [part for part, marker in TRAINING_STEP_PARTS.items() if marker in code]


def plot_trainer_versus_accelerator(training_functions, ax=None):
    """Plot, for each training function, the statements it takes against the step parts it writes itself.

    ``training_functions`` maps a display name to a function. Every function is
    measured the same way, on its own code (:func:`count_statements`,
    :func:`training_step_parts_in`). Returns the Figure.
    """
    if not isinstance(training_functions, dict) or not training_functions:
        raise ValueError("training_functions must be a non-empty dict of name -> function")
    for name, function in training_functions.items():
        if not callable(function):
            raise TypeError(f"training_functions[{name!r}] must be a function, got {type(function).__name__}")
    figure, ax = _figure_and_axes(ax, figsize=(7.5, 4))
    for index, (name, function) in enumerate(training_functions.items()):
        statements, parts = count_statements(function), len(training_step_parts_in(function))
        ax.scatter(statements, parts, s=160, color=f"C{index}", zorder=3)
        ax.annotate(f"{name}\n{statements} statements, {parts} parts", (statements, parts), textcoords="offset points",
                    xytext=(0, 14 if index % 2 == 0 else -34), ha="center", fontsize="small")
    ax.set_title("What you write and what you control: three ways to train")
    ax.set_xlabel("statements of training code you write (a call counts once, with all its arguments)")
    ax.set_ylabel(f"parts of the training step\nin your code (of {len(TRAINING_STEP_PARTS)})")
    ax.set_ylim(-2, len(TRAINING_STEP_PARTS) + 2)
    right = max(count_statements(function) for function in training_functions.values())
    ax.set_xlim(0, right * 1.25 + 2)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _function_node(function):
    """The ``ast.FunctionDef`` of ``function``'s source."""
    check_python_function(function, "function")
    return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]


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
