"""Each lesson, as a learner sees it in JupyterLab: opened, its outputs rendered, its controls and checks live.

The kernel-driving re-run test (tests/lessons/test_rerun_lessons.py) runs every cell of
every lesson, learner copy and solved answers, and checks what the kernel
sends: no error, no stderr, no figure shown as text, the checked outputs as
committed. This test proves only what needs a browser, without running whole
lessons again. For each learner notebook ``notebooks/0*.ipynb`` (a throw-away
copy of it), in one JupyterLab server:

- opened, its committed outputs render: every committed figure as an image,
  the exercise feedback rendered as Markdown (no ``**`` or ``<span`` shown as
  text), no error or stderr box, no text stand-in where a figure belongs, each
  widget output as the build's text (not its repr), no dialog left open;
- one exercise check run by hand (Ctrl+Enter), after only the cells before the
  first section (the imports it needs), shows its feedback, rendered as Markdown;
- in the lessons with sliders (``LESSONS_WITH_SLIDERS``) the cells above the
  first slider run live (Run > Run All Above Selected Cell), then that cell:
  the ipywidgets controls render, and moving the slider with the keyboard
  redraws the figure under it.

Screenshots of each lesson as opened (and of the slider before and after it
moved) go to test-artifacts/browser/; the kernel is shut down after each lesson.
"""

from __future__ import annotations

import re
import time

import nbformat
import pytest
from lab_helpers import (
    WIDGET_VIEW,
    CHECK_ERROR_LABEL,
    NOTEBOOKS_DIR,
    image_sources,
    move_slider,
    open_dialogs,
    open_notebook,
    read_cells,
    rerun_cell,
    run_all_above,
    screenshot_cell,
    screenshot_notebook,
    wait_for_new_figure,
)

# slow: every lesson in JupyterLab, one module; make test hands it out first among the browser tests (tests/conftest.py).
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSONS = sorted(path.name for path in NOTEBOOKS_DIR.glob("0*.ipynb"))
# Lessons whose figures the learner drives with ipywidgets sliders.
LESSONS_WITH_SLIDERS = ("02", "04")
# The cells above a lesson's first slider run in well under a minute on 2 idle cores; the
# limit leaves room for a busy machine (the browser renders on the same cores). It only
# catches a hung lesson.
RUN_ABOVE_TIMEOUT_S = 300
# A slider's redraw recomputes and redraws one figure; a check runs in seconds.
REDRAW_TIMEOUT_S = 60
CHECK_TIMEOUT_S = 120
SECTION_HEADING = re.compile(r"^## ", re.MULTILINE)
SLIDER_CALL = re.compile(r"explorer\(|interact\(|Slider\(")


def describe(cell: dict) -> str:
    """Return "cell 12 [7]: first line of its source", to name a cell in a failure message."""
    first_line = cell["source"].splitlines()[0] if cell["source"] else ""
    return f"cell {cell['index']} {cell['prompt']} `{first_line[:80]}`"


def problems_a_learner_sees(cells: list[dict]) -> list[str]:
    """Return one line per thing a learner would see as broken in the cells shown (empty when none)."""
    problems = []
    for cell in cells:
        if not cell["isCode"]:
            continue
        for text in cell["stderr"]:
            kind = "an error" if "Traceback" in text or re.search(r"\w+Error\b", text) else "stderr output"
            problems.append(f"{describe(cell)} shows {kind}:\n    " + text[-1500:].replace("\n", "\n    "))
        for text in cell["placeholders"]:
            problems.append(f"{describe(cell)} shows text where a figure or widget belongs: {text[:120]!r}")
        for text in cell["rawMarkup"]:
            problems.append(f"{describe(cell)} shows markup as text instead of rendering it: {text!r}")
        if CHECK_ERROR_LABEL in cell["feedback"]:
            problems.append(f"{describe(cell)}: the exercise check itself failed")
    return problems


def committed_figures(notebook) -> dict[int, int]:
    """Return {cell index: number of image outputs} of the committed notebook's code cells that hold figures."""
    counts = {}
    for index, cell in enumerate(notebook.cells):
        images = sum(1 for output in cell.get("outputs", ()) if any(m.startswith("image/") for m in output.get("data", {})))
        if images:
            counts[index] = images
    return counts


def widget_outputs(notebook) -> list[int]:
    """Return the indices of the committed notebook's code cells that show an ipywidgets widget."""
    return [
        index for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        and any(WIDGET_VIEW in output.get("data", {}) for output in cell.outputs)
    ]  # fmt: skip


def widgets_not_shown_as_built(cells: list[dict], committed) -> list[str]:
    """Return one line per widget output shown neither as a widget nor as the build's text (empty when none)."""
    problems = []
    for index in widget_outputs(committed):
        if cells[index]["widgets"]:
            continue  # drawn from the saved state (a trusted notebook)
        for output in committed.cells[index].outputs:
            text = output.get("data", {}).get("text/plain", "").strip()
            if WIDGET_VIEW in output.get("data", {}) and text not in cells[index]["plainTexts"]:
                problems.append(f"{describe(cells[index])} shows {cells[index]['plainTexts']} "
                                f"where its widget's text {text!r} belongs")  # fmt: skip
    return problems


def setup_cells(notebook) -> list[int]:
    """Return the code cells before the first ``## `` section: the imports and the exercises' checker."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown" and SECTION_HEADING.search(cell.source):
            break
        if cell.cell_type == "code":
            found.append(index)
    return found


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_opens_with_its_outputs_rendered_and_its_check_and_sliders_live(
    lesson, lab_page, lab_server, artifacts_dir, lesson_times
):
    stem = lesson.removesuffix(".ipynb")
    committed = nbformat.read(NOTEBOOKS_DIR / lesson, as_version=4)
    started = time.monotonic()
    try:
        problems = check_the_lesson(lab_page, lab_server, lesson, committed, artifacts_dir)
    finally:
        lesson_times[stem] = time.monotonic() - started
    assert not problems, f"{lesson} in JupyterLab (screenshots in {artifacts_dir}):\n" + "\n".join(problems)


def check_the_lesson(page, server, lesson: str, committed, artifacts_dir) -> list[str]:
    """Open ``lesson`` and do what the module docstring says; return the problems seen (empty when none)."""
    stem = lesson.removesuffix(".ipynb")
    open_notebook(page, server, lesson)

    # As opened: the committed outputs, rendered. A committed notebook is not trusted, so
    # JupyterLab shows each widget output as its text: the build's (a progress bar as it
    # ended, a sentence for controls; tools/notebook_widgets.py), never the repr.
    cells = read_cells(page)
    screenshot_notebook(page, artifacts_dir / f"{stem}.png")
    problems = problems_a_learner_sees(cells)
    problems += widgets_not_shown_as_built(cells, committed)
    problems += [f"a dialog is open: {text!r}" for text in open_dialogs(page)]
    figures = committed_figures(committed)
    if not figures:
        problems.append("the committed lesson shows no figure anywhere")
    for index, count in figures.items():
        if cells[index]["images"] < count:
            problems.append(f"{describe(cells[index])} holds {count} figures, {cells[index]['images']} render as images")
    check_cells = [cell for cell in cells if cell["isCode"] and ".check()" in cell["source"]]
    if not check_cells:
        problems.append("the lesson has no exercise check")
    for cell in check_cells:
        if not cell["markdownFeedback"]:
            problems.append(f"{describe(cell)} runs an exercise check but shows no feedback rendered as Markdown")

    # Live: the first slider (its lesson's cells above it run first), then one check by hand.
    slider_lesson = lesson[:2] in LESSONS_WITH_SLIDERS
    if slider_lesson:
        problems += check_a_slider_redraws_its_figure(page, committed, stem, artifacts_dir)
    if check_cells:
        if not slider_lesson:  # there, the cells above the slider included these
            for index in setup_cells(committed):
                rerun_cell(page, index, timeout_s=CHECK_TIMEOUT_S)
        check = rerun_cell(page, check_cells[0]["index"], timeout_s=CHECK_TIMEOUT_S)
        if not check["markdownFeedback"] or check["stderr"]:
            problems.append(f"{describe(check)} run by hand shows {check['markdownFeedback'] or check['stderr']}, "
                            "not its feedback rendered as Markdown")  # fmt: skip
        problems += problems_a_learner_sees([check])
    problems += [f"a dialog is open after the live runs: {text!r}" for text in open_dialogs(page)]
    return problems


def check_a_slider_redraws_its_figure(page, committed, stem: str, artifacts_dir) -> list[str]:
    """Run the cells above the first slider, then it; move the slider; return the problems seen (empty when it redraws)."""
    slider_cells = [index for index in widget_outputs(committed) if SLIDER_CALL.search(committed.cells[index].source)]
    if not slider_cells:
        return ["the lesson shows no slider (no cell with a widget output calls an explorer, interact or a Slider)"]
    index = slider_cells[0]
    above = run_all_above(page, index, timeout_s=RUN_ABOVE_TIMEOUT_S)
    problems = [f"running the cells above the slider: {line}" for line in problems_a_learner_sees(above[:index])]
    if problems:
        return problems
    cell = rerun_cell(page, index, timeout_s=RUN_ABOVE_TIMEOUT_S)
    problems = problems_a_learner_sees([cell])
    problems += [f"{describe(cell)} shows a widget error: {text}" for text in cell["widgetErrors"]]
    if not (cell["sliders"] and cell["images"]):
        return problems + [f"{describe(cell)} shows {cell['sliders']} sliders and {cell['images']} figures, run live"]
    screenshot_cell(page, index, artifacts_dir / f"{stem}-slider-before.png")
    before = image_sources(page, index)
    readout_before, readout_after = move_slider(page, index)
    if readout_after == readout_before:
        return problems + [f"{describe(cell)}: the slider did not move with the arrow keys (readout {readout_before})"]
    try:
        wait_for_new_figure(page, index, before, timeout_s=REDRAW_TIMEOUT_S)
    except Exception as error:  # Playwright's TimeoutError: report it with the rest
        problems.append(f"{describe(cell)}: moving the slider {readout_before} -> {readout_after} "
                        f"did not redraw the figure within {REDRAW_TIMEOUT_S} s ({type(error).__name__})")  # fmt: skip
    finally:
        screenshot_cell(page, index, artifacts_dir / f"{stem}-slider-after.png")
    return problems
