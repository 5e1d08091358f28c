"""Each lesson, used the way a learner uses it: opened in JupyterLab, run from the Run menu, looked at.

nbval proves the notebooks execute; this proves what a learner sees. For each
learner notebook ``notebooks/0*.ipynb`` (a throw-away copy of it), in one
JupyterLab server, one lesson after another:

- Run > Run All Cells runs every code cell, and no cell shows an error, a
  traceback, a stderr box, "Error displaying widget", or a text stand-in where
  a figure or widget belongs ("<Figure size 640x480 with 1 Axes>"); no dialog
  (such as "kernel died") is left open;
- the lesson's figures are displayed;
- every exercise check shows its feedback ("Not attempted yet" in the learner
  copy), and a check run again by hand (Ctrl+Enter) shows it again;
- in lessons 2 and 4 the ipywidgets controls are rendered, and moving a slider
  with the keyboard redraws the figure under it.

Screenshots of each lesson (and of the slider before and after it moved) go to
test-artifacts/browser/; the kernel is shut down after each lesson.
"""

from __future__ import annotations

import re
import time

import pytest
from lab_helpers import (
    CHECK_ERROR_LABEL,
    NOTEBOOKS_DIR,
    image_sources,
    move_slider,
    open_dialogs,
    open_notebook,
    rerun_cell,
    run_all_cells,
    screenshot_cell,
    screenshot_notebook,
    wait_for_new_figure,
)

pytestmark = pytest.mark.browser

LESSONS = sorted(path.name for path in NOTEBOOKS_DIR.glob("0*.ipynb"))
# Lessons whose figures the learner drives with ipywidgets sliders.
LESSONS_WITH_SLIDERS = ("02", "04")
# A lesson runs in about a minute in a kernel on 2 idle cores; the limit leaves room for a
# busy machine (the browser renders on the same cores). It only catches a hung lesson.
RUN_ALL_TIMEOUT_S = 600
# A slider's redraw recomputes and redraws one figure.
REDRAW_TIMEOUT_S = 60


def describe(cell: dict) -> str:
    """Return "cell 12 [7]: first line of its source", to name a cell in a failure message."""
    first_line = cell["source"].splitlines()[0] if cell["source"] else ""
    return f"cell {cell['index']} {cell['prompt']} `{first_line[:80]}`"


def was_run(cell: dict) -> bool:
    """Return True for a code cell that ran (it has an execution count) or holds no code."""
    return not cell["source"] or bool(re.fullmatch(r"\[\d+\]:", cell["prompt"]))


def problems_a_learner_sees(cells: list[dict]) -> list[str]:
    """Return one line per thing a learner would see as broken after Run All (empty when none)."""
    problems = []
    code_cells = [cell for cell in cells if cell["isCode"]]
    for cell in code_cells:
        for text in cell["stderr"]:
            kind = "an error" if "Traceback" in text or re.search(r"\w+Error\b", text) else "stderr output"
            problems.append(f"{describe(cell)} shows {kind}:\n    " + text[-1500:].replace("\n", "\n    "))
        for text in cell["widgetErrors"]:
            problems.append(f"{describe(cell)} shows a widget error: {text}")
        for text in cell["placeholders"]:
            problems.append(f"{describe(cell)} shows text where a figure or widget belongs: {text[:120]!r}")
        if CHECK_ERROR_LABEL in cell["feedback"]:
            problems.append(f"{describe(cell)}: the exercise check itself failed")
    never_run = [cell for cell in code_cells if not was_run(cell)]
    if never_run:
        problems.append(
            f"{len(never_run)} code cells never ran (Run All stops at an error), "
            f"from {describe(never_run[0])} on"
        )
    return problems


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs_in_jupyterlab_and_shows_figures_widgets_and_feedback(
    lesson, lab_page, lab_server, artifacts_dir, lesson_times
):
    stem = lesson.removesuffix(".ipynb")
    open_notebook(lab_page, lab_server, lesson)
    started, cell_seconds = time.monotonic(), {}
    try:
        cells = run_all_cells(lab_page, timeout_s=RUN_ALL_TIMEOUT_S, cell_seconds=cell_seconds)
    finally:
        lesson_times[stem] = (time.monotonic() - started, cell_seconds)
    screenshot = screenshot_notebook(lab_page, artifacts_dir / f"{stem}.png")[0]

    problems = problems_a_learner_sees(cells)
    problems += [f"a dialog is open: {text!r}" for text in open_dialogs(lab_page)]

    if sum(cell["images"] for cell in cells) == 0:
        problems.append("no figure is displayed anywhere in the lesson")

    # Cells Run All never reached are reported above; their checks would only repeat it.
    check_cells = [cell for cell in cells if cell["isCode"] and ".check()" in cell["source"] and was_run(cell)]
    for cell in check_cells:
        if not cell["feedback"]:
            problems.append(f"{describe(cell)} runs an exercise check but shows no feedback")
    if check_cells:
        rerun = rerun_cell(lab_page, check_cells[0]["index"])
        if not rerun["feedback"] or rerun["stderr"]:
            problems.append(f"{describe(rerun)} run again by hand shows {rerun['feedback'] or rerun['stderr']}")

    if lesson[:2] in LESSONS_WITH_SLIDERS:
        problems += check_a_slider_redraws_its_figure(lab_page, cells, stem, artifacts_dir)

    assert not problems, f"{lesson} in JupyterLab (screenshot {screenshot}):\n" + "\n".join(problems)


def check_a_slider_redraws_its_figure(page, cells: list[dict], stem: str, artifacts_dir) -> list[str]:
    """Move the first slider that sits above a figure and return the problems seen (empty when it redraws)."""
    widget_cells = [cell for cell in cells if cell["widgets"]]
    if not widget_cells:
        return ["no ipywidgets control is rendered in the lesson"]
    slider_cells = [cell for cell in widget_cells if cell["sliders"] and cell["images"]]
    if not slider_cells:
        return [f"no slider is shown with a figure (widgets in {[describe(cell) for cell in widget_cells]})"]
    index = slider_cells[0]["index"]
    screenshot_cell(page, index, artifacts_dir / f"{stem}-slider-before.png")
    before = image_sources(page, index)
    readout_before, readout_after = move_slider(page, index)
    if readout_after == readout_before:
        return [f"{describe(slider_cells[0])}: the slider did not move with the arrow keys (readout {readout_before})"]
    try:
        wait_for_new_figure(page, index, before, timeout_s=REDRAW_TIMEOUT_S)
    except Exception as error:  # Playwright's TimeoutError: report it with the rest
        return [f"{describe(slider_cells[0])}: moving the slider {readout_before} -> {readout_after} "
                f"did not redraw the figure within {REDRAW_TIMEOUT_S} s ({type(error).__name__})"]
    finally:
        screenshot_cell(page, index, artifacts_dir / f"{stem}-slider-after.png")
    return []
