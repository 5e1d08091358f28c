"""Lesson 4's explorer: widgets for every choice that changes a training step's memory, above its peak.

Model, optimizer, precision, batch size, sequence length, activation
checkpointing and gradient accumulation: each change asks the planner for the
step's memory and redraws :func:`~course_utils.plots.training_memory.plot_training_memory_breakdown`
for the chosen set-up next to the same set-up with a reference optimizer, with
the peak and its phase in words, and a progress bar while the planner works on
a set-up it has not seen. The reference differs only in its optimizer,
so the planner reuses the chosen set-up's forward and backward passes and plans
only its optimizer step. Answers are cached, so going back to a set-up already
seen is instant.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from matplotlib.figure import Figure

from course_utils.memory import TrainingSetup, reporting_progress
from course_utils.plots.training_memory import plot_training_memory_breakdown, read_memory
from course_utils.units import format_bytes

__all__ = ["TrainingMemoryExplorer", "training_memory_explorer"]


class TrainingMemoryExplorer:
    """Widgets above a bar chart of the chosen set-up's peak and the reference optimizer's; redrawn on change.

    ``optimizers`` is ``{label: (optimizer name, options)}`` and
    ``precisions`` ``{label: (model side, mixed_precision)}``: from the chosen
    labels, batch, length and accumulation the explorer makes a
    :class:`course_utils.memory.TrainingSetup`, and
    ``estimate(model_name, model_side, checkpointing, setup)`` returns its
    ``TrainingMemory`` (bytes) or raises ``ValueError`` with a reason (shown
    instead of a number); ``model_side`` is the precision's first item (the
    lesson's dtype), passed on as it is. ``reference_optimizer`` (default: the
    first optimizer) is drawn beside the chosen set-up: same model, precision,
    batch, length, checkpointing and accumulation.
    ``last_redraw_seconds`` is how long the latest redraw took.
    """

    def __init__(self, model_names: Sequence[str], estimate: Callable, optimizers: Mapping[str, tuple],
                 precisions: Mapping[str, tuple], batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                 seq_lens: Sequence[int] = (128, 256, 512, 1024, 2048), accumulation_steps: Sequence[int] = (1, 2, 4, 8),
                 reference_optimizer: str | None = None, initial: dict | None = None):
        import ipywidgets as widgets

        for name, options in (("model_names", model_names), ("batch_sizes", batch_sizes), ("seq_lens", seq_lens),
                              ("accumulation_steps", accumulation_steps)):
            if isinstance(options, str) or not isinstance(options, Sequence) or len(options) == 0:
                raise ValueError(f"{name} must be a non-empty list, got {options!r}")
        for name, table, item in (("optimizers", optimizers, "(optimizer name, options)"),
                                  ("precisions", precisions, "(model side, mixed_precision)")):
            if (not isinstance(table, Mapping) or len(table) == 0
                    or not all(isinstance(v, tuple) and len(v) == 2 for v in table.values())):
                raise ValueError(f"{name} must be a non-empty dict of label -> {item}, got {table!r}")
        if not callable(estimate):
            raise TypeError("estimate must be a function of (model_name, model_side, checkpointing, setup) returning "
                            f"a TrainingMemory, got {type(estimate).__name__}")
        self._estimate = estimate
        self._optimizers, self._precisions = dict(optimizers), dict(precisions)
        self._cache: dict[tuple, object] = {}
        if reference_optimizer is not None and reference_optimizer not in optimizers:
            raise ValueError(f"reference_optimizer must be one of optimizers {list(optimizers)}, got {reference_optimizer!r}")
        self.reference_optimizer = next(iter(optimizers)) if reference_optimizer is None else reference_optimizer
        initial = {"model": model_names[0], "optimizer": next(iter(optimizers)), "precision": next(iter(precisions)),
                   "batch_size": batch_sizes[0], "seq_len": seq_lens[0], "checkpointing": False,
                   "accumulation": accumulation_steps[0], **(initial or {})}
        wide = {"style": {"description_width": "initial"}}
        self.model = widgets.Dropdown(options=list(model_names), value=initial["model"], description="model", **wide)
        self.optimizer = widgets.Dropdown(options=list(optimizers), value=initial["optimizer"], description="optimizer", **wide)
        self.precision = widgets.ToggleButtons(options=list(precisions), value=initial["precision"], description="precision", **wide)
        # Redraw on release, not at every pixel of a drag.
        self.batch_size = widgets.SelectionSlider(options=list(batch_sizes), value=initial["batch_size"],
                                                  description="micro-batch", continuous_update=False, **wide)
        self.seq_len = widgets.SelectionSlider(options=list(seq_lens), value=initial["seq_len"],
                                               description="tokens/seq", continuous_update=False, **wide)
        self.checkpointing = widgets.Checkbox(value=initial["checkpointing"], description="activation checkpointing", **wide)
        self.accumulation = widgets.SelectionSlider(options=list(accumulation_steps), value=initial["accumulation"],
                                                    description="accumulation steps", continuous_update=False, **wide)
        self.summary = widgets.HTML()
        # Shown while the planner follows a new set-up (seconds): how many of its model copies are done.
        self.progress = widgets.IntProgress(min=0, max=1, description="model copies followed",
                                            layout=widgets.Layout(visibility="hidden"), **wide)
        self.output = widgets.Output()
        self.figure = Figure(figsize=(9, 4.6))
        self.figure.subplots()
        self.last_redraw_seconds = 0.0
        controls = (self.model, self.optimizer, self.precision, self.batch_size, self.seq_len,
                    self.checkpointing, self.accumulation)
        for control in controls:
            control.observe(self.redraw, names="value")
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.optimizer]), self.precision,
            widgets.HBox([self.batch_size, self.seq_len]), widgets.HBox([self.checkpointing, self.accumulation]),
            self.summary, self.progress, self.output,
        ])
        self.redraw()

    def memory(self, optimizer: str, precision: str):
        """Return the planner's answer for the current widgets with ``optimizer`` and ``precision`` (cached)."""
        name, options = self._optimizers[optimizer]
        model_side, mixed_precision = self._precisions[precision]
        try:
            setup = TrainingSetup(name, self.batch_size.value, self.seq_len.value, mixed_precision,
                                  self.accumulation.value, options)
        except (TypeError, ValueError) as error:  # a choice the set-up refuses, with its reason
            return ValueError(str(error))
        # The set-up is its own cache key; the model is named by the choices it is built from.
        key = (self.model.value, model_side, self.checkpointing.value, setup)
        if key not in self._cache:
            # A set-up not seen before takes seconds: say so while the old numbers are still shown.
            self.summary.value = (f"<i>planning {self.model.value} with {optimizer}, {precision}: "
                                  f"a new set-up takes a few seconds…</i>")
            self.progress.value, self.progress.max = 0, 1
            self.progress.layout.visibility = "visible"
            try:
                with reporting_progress(self._show_progress):
                    self._cache[key] = self._estimate(*key)
            except ValueError as error:  # refused by the planner, with its reason
                self._cache[key] = error
            finally:
                self.progress.layout.visibility = "hidden"
        return self._cache[key]

    def _show_progress(self, done: int, total: int) -> None:
        self.progress.max = total
        self.progress.value = done

    def redraw(self, change=None):
        """Ask for the chosen set-up and its reference optimizer, write the peak and its phase, and redraw the bars."""
        from IPython.display import display

        start = time.perf_counter()
        precision = self.precision.value
        bars, lines = {}, []
        for optimizer in dict.fromkeys([self.optimizer.value, self.reference_optimizer]):
            label = optimizer
            answer = self.memory(optimizer, precision)
            if isinstance(answer, ValueError):
                lines.append(f"<b>{optimizer}, {precision}</b>: not estimated: {answer}")
                continue
            bars[label] = answer
            numbers = read_memory(label, answer)
            lines.append(f"<b>{optimizer}, {precision}</b>: peak <b>{format_bytes(numbers['peak'], 2)}</b> "
                         f"during the {numbers['phase_of_peak']}")
        self.summary.value = "<br>".join(lines)
        ax = self.figure.axes[0]
        ax.clear()
        if bars:
            accumulation = f", {self.accumulation.value} accumulated" if self.accumulation.value > 1 else ""
            checkpointing = ", checkpointed" if self.checkpointing.value else ""
            plot_training_memory_breakdown(
                bars, ax=ax, xlabel="optimizer",
                title=f"{self.model.value}, {precision}: micro-batch {self.batch_size.value} × "
                      f"{self.seq_len.value} tokens{accumulation}{checkpointing}",
            )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)
        self.last_redraw_seconds = time.perf_counter() - start

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def training_memory_explorer(model_names, estimate, optimizers, precisions, **options) -> TrainingMemoryExplorer:
    """Return a :class:`TrainingMemoryExplorer`; make it the last expression of a cell to show it.

    Outside a live kernel (a static copy of the notebook) the widgets do not
    work: draw :func:`plot_training_memory_breakdown` as well.
    """
    return TrainingMemoryExplorer(model_names, estimate, optimizers, precisions, **options)
