"""What a committed notebook shows where its cells displayed ipywidgets, before the learner runs them.

A widget output carries the widget's view (``application/vnd.jupyter.widget-view+json``,
a model id) and a ``text/plain`` form: the repr the kernel gave it, such as
``VBox(children=(HBox(children=(FloatSlider(value=0.9, ...`` for an explorer or
``planning:   0%|          | 0/4 [00:00<?, ?it/s]`` for a tqdm progress bar (its repr
when it was displayed, before it advanced). nbclient saves the widgets' final state
in the notebook's metadata (``widgets``).

What JupyterLab 4.6 with jupyterlab_widgets 3.0 (ipywidgets 8.1) shows for such an
output of a committed notebook, checked in headless Chromium:

- the notebook as copied, not trusted (every notebook a learner gets: nobody signed
  it on their machine): the widget renderer is not a "safe" renderer, so JupyterLab
  shows the ``text/plain`` form;
- a trusted notebook (``jupyter trust``): the widgets drawn from the saved state,
  offline, without their kernel: progress bars at their end (``100%``), explorers
  with their controls and figure, controls that redraw nothing until the cell runs.

So the build replaces each widget output's ``text/plain`` (``with_widget_texts``) by
what the saved state says: a progress bar's final text (what a trusted notebook
draws, less the timings of the machine that built it), or one sentence naming the controls and saying to run the cell. The view
and the saved state stay, so a trusted notebook still draws them, and a cell run
live replaces the whole output. Nothing here runs a kernel.
"""

from __future__ import annotations

import copy
import html
import re

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# What a widget's repr looks like when it is shown as text: a container or control
# ("VBox(children=...", "FloatSlider(value=..."), or a tqdm bar ("planning:   0%|    | 0/4").
WIDGET_REPR_PATTERN = (
    r"^\(?(VBox|HBox|Box|GridBox|Tab|Accordion|IntSlider|FloatSlider|SelectionSlider|IntRangeSlider|"
    r"FloatRangeSlider|Dropdown|ToggleButtons|Checkbox|Button|Text|HTML|Label|Output|FloatProgress|"
    r"IntProgress|interactive)\(|^[^\n]*\d+%\|[^|\n]*\| *\d+/"
)

_TIMING = re.compile(r"\s*\[[^\]]*(<|it/s|s/it)[^\]]*\]\s*$")
_PROGRESS_MODELS = {"FloatProgressModel", "IntProgressModel"}
_TEXT_MODELS = {"HTMLModel", "LabelModel", "HTMLMathModel"}
# Models a learner moves, clicks or types into (their ``description`` names them).
_CONTROL_MODELS = {
    "IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "SelectionSliderModel",
    "IntRangeSliderModel", "FloatRangeSliderModel", "SelectionRangeSliderModel",
    "DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel", "SelectMultipleModel",
    "CheckboxModel", "ToggleButtonModel", "ButtonModel", "TextModel", "TextareaModel",
    "IntTextModel", "FloatTextModel", "BoundedIntTextModel", "BoundedFloatTextModel", "ComboboxModel",
}  # fmt: skip
RUN_TO_USE = "run this cell to use them."
CLOSED_WIDGET_TEXT = "(a widget this cell closed when it finished)"


def widget_state(notebook) -> dict:
    """Return the saved widget models of ``notebook``, {model id: {"model_name": ..., "state": {...}}} ({} if none)."""
    return notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def _models_under(model_id: str, state: dict) -> list[dict]:
    """Return the saved model ``model_id`` and every model inside it, depth first, in display order."""
    found, pending, seen = [], [model_id], set()
    while pending:
        current = pending.pop(0)
        if current in seen or current not in state:
            continue
        seen.add(current)
        model = state[current]
        found.append(model)
        children = model.get("state", {}).get("children", [])
        pending[:0] = [child.removeprefix("IPY_MODEL_") for child in children if isinstance(child, str)]
    return found


def _plain(markup: str) -> str:
    """Return the text of an HTML widget's value: tags dropped, entities decoded, spaces squeezed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", markup))).strip()


def widget_text(model_id: str, state: dict) -> str:
    """Return the text that stands for widget ``model_id`` (saved in ``state``) where JupyterLab cannot draw it.

    A progress bar (a box holding a progress model and no control): its labels as they
    ended, without tqdm's timings, e.g. ``planning: 100% 4/4``. Other widgets: one
    sentence naming the controls (their descriptions) and saying whether they draw a
    figure. A widget missing from the state was closed by its cell.
    """
    models = _models_under(model_id, state)
    if not models:
        return CLOSED_WIDGET_TEXT
    names = [model.get("model_name") for model in models]
    if any(name in _PROGRESS_MODELS for name in names) and not any(name in _CONTROL_MODELS for name in names):
        texts = [_plain(str(model["state"].get("value", ""))) for model in models if model.get("model_name") in _TEXT_MODELS]
        # tqdm's "[01:46<00:00, 54.62s/it]" says how busy the machine that built the notebook was.
        texts = [_TIMING.sub("", text) for text in texts]
        texts = [text for text in texts if text]
        if not any("%" in text for text in texts):
            bar = next(model["state"] for model in models if model.get("model_name") in _PROGRESS_MODELS)
            span = (bar.get("max", 100) or 0) - (bar.get("min", 0) or 0)
            fraction = ((bar.get("value", 0) or 0) - (bar.get("min", 0) or 0)) / span if span else 1.0
            texts.append(f"{fraction:.0%}")
        return " ".join(texts)
    labels = []
    for model in models:
        label = _plain(str(model.get("state", {}).get("description", "")))
        if model.get("model_name") in _CONTROL_MODELS and label and label not in labels:
            labels.append(label)
    draws_figure = any(
        model.get("model_name") == "OutputModel"
        and any(key.startswith("image/") for output in model["state"].get("outputs", []) for key in output.get("data", {}))
        for model in models
    )  # fmt: skip
    what = f"Interactive controls ({', '.join(labels)})" if labels else "Interactive controls"
    return f"{what}{' and the figure they redraw' if draws_figure else ''}: {RUN_TO_USE}"


def widget_outputs(notebook):
    """Yield ``(cell index, output)`` for every output of ``notebook`` that displays a widget."""
    for index, cell in enumerate(notebook.get("cells", [])):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if WIDGET_VIEW in output.get("data", {}):
                yield index, output


def shown_text(output) -> str:
    """Return an output's ``text/plain`` as one string (on disk it may be a list of lines)."""
    text = output.get("data", {}).get("text/plain", "")
    return text if isinstance(text, str) else "".join(text)


def with_widget_texts(notebook):
    """Return a copy of ``notebook`` whose widget outputs carry ``widget_text`` as their ``text/plain``."""
    notebook = copy.deepcopy(notebook)
    state = widget_state(notebook)
    for _, output in widget_outputs(notebook):
        output["data"]["text/plain"] = widget_text(output["data"][WIDGET_VIEW].get("model_id", ""), state)
    return notebook


def widget_text_problems(notebook) -> list[str]:
    """Return one line per widget output whose ``text/plain`` is not its ``widget_text`` (empty when all are)."""
    state = widget_state(notebook)
    problems = []
    for index, output in widget_outputs(notebook):
        shown = shown_text(output)
        wanted = widget_text(output["data"][WIDGET_VIEW].get("model_id", ""), state)
        if shown != wanted:
            problems.append(f"cell {index}: a widget output shows {shown[:70]!r} as its text, not {wanted[:70]!r}")
    return problems
