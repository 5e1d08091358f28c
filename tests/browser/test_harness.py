"""The browser harness itself, proven on two small notebooks written by the tests.

If these fail, the lesson tests cannot be trusted: the harness would miss a
figure, a widget, a feedback box or an error that a learner sees, in outputs
run live or in outputs as committed.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest
from lab_helpers import (
    WIDGET_VIEW,
    image_sources,
    move_slider,
    open_notebook,
    read_cells,
    rerun_cell,
    run_all_above,
    screenshot_notebook,
    wait_for_new_figure,
)

pytestmark = pytest.mark.browser

HARNESS_CELLS = [
    ("markdown", "# Harness check\nA figure, a slider that redraws a figure, and exercise feedback."),
    ("code", "import matplotlib.pyplot as plt\nimport ipywidgets as widgets"),
    ("code", "fig, ax = plt.subplots(figsize=(3, 2))\nax.plot([0, 1], [0, 1])\nplt.show()"),
    (
        "code",
        "def draw(slope=1):\n"
        "    fig, ax = plt.subplots(figsize=(3, 2))\n"
        "    ax.plot([0, 1], [0, slope])\n"
        "    ax.set_ylim(0, 10)\n"
        "    plt.show()\n\n"
        "widgets.interact(draw, slope=widgets.IntSlider(min=1, max=9, value=1));",
    ),
    # The course's explorers: a slider that redraws on release, into an Output widget.
    (
        "code",
        "from IPython.display import display\n"
        "output = widgets.Output()\n"
        "batch = widgets.SelectionSlider(options=[1, 2, 4, 8], value=2, description='batch', continuous_update=False)\n"
        "def redraw(change=None):\n"
        "    fig, ax = plt.subplots(figsize=(3, 2))\n"
        "    ax.bar([0], [batch.value])\n"
        "    with output:\n"
        "        output.clear_output(wait=True)\n"
        "        plt.show()\n"
        "batch.observe(redraw, names='value')\n"
        "redraw()\n"
        "widgets.VBox([batch, output])",
    ),
    # Stands in for an exercise check: the feedback label followed by a colon, in Markdown, as course_utils shows it.
    ("code", 'from IPython.display import Markdown, display\n'
             'display(Markdown("**Exercise 1: Not attempted yet:** replace `____` with your answer."))'),
]

# A 1 x 1 PNG: a figure as a committed notebook holds it.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
# Committed outputs, opened without running: what the harness must see in each (see the test).
COMMITTED_OUTPUTS = [
    ("figure", nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"})),
    ("feedback", nbformat.v4.new_output("display_data", data={
        "text/markdown": "**Exercise 1: Correct:** well done", "text/plain": "<IPython.core.display.Markdown object>"})),
    ("markup as text", nbformat.v4.new_output("stream", name="stdout", text="**Exercise 1: Correct:** well done\n")),
    ("stderr", nbformat.v4.new_output("stream", name="stderr", text="a warning a learner would see\n")),
    ("stand-in", nbformat.v4.new_output("execute_result", execution_count=1,
                                        data={"text/plain": "[<matplotlib.lines.Line2D at 0x7f0>]"})),
    ("error", nbformat.v4.new_output("error", ename="ValueError", evalue="broken on purpose",
                                     traceback=["Traceback (most recent call last)", "ValueError: broken on purpose"])),
    # A widget output of a committed (untrusted) notebook: JupyterLab shows its text.
    ("widget repr", nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "a1", "version_major": 2, "version_minor": 0},
        "text/plain": "planning:   0%|          | 0/4 [00:00<?, ?it/s]"})),
    ("widget text", nbformat.v4.new_output("display_data", data={
        WIDGET_VIEW: {"model_id": "b2", "version_major": 2, "version_minor": 0}, "text/plain": "planning: 100% 4/4"})),
]  # fmt: skip


@pytest.fixture
def harness_dir(lab_workdir):
    """A folder for the harness notebooks beside the lesson copies, removed afterwards (it would show in screenshots)."""
    folder = lab_workdir / "notebooks" / "harness"
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write_notebook(path, cells):
    """Write an nbformat v4 notebook of ``(kind, source)`` cells, or code cells given as nbformat cells, with the course's python3 kernel."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    notebook.cells = [cell if isinstance(cell, dict) else make[cell[0]](cell[1]) for cell in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


def test_harness_sees_figures_a_moving_slider_and_feedback(lab_page, lab_server, harness_dir, artifacts_dir):
    write_notebook(harness_dir / "harness.ipynb", HARNESS_CELLS)
    open_notebook(lab_page, lab_server, "harness/harness.ipynb")

    cells = run_all_above(lab_page, 5, timeout_s=120)

    assert [cell["prompt"] for cell in cells if cell["isCode"]] == ["[1]:", "[2]:", "[3]:", "[4]:", "[ ]:"]
    assert all(not cell["stderr"] for cell in cells), [cell["stderr"] for cell in cells]
    figure_cell, interact_cell, explorer_cell = cells[2:5]
    assert figure_cell["images"] == 1
    assert interact_cell["sliders"] == 1 and interact_cell["images"] == 1
    assert explorer_cell["sliders"] == 1 and explorer_cell["images"] == 1
    screenshot_notebook(lab_page, artifacts_dir / "harness.png")

    for cell, readouts in ((interact_cell, ("1", "2")), (explorer_cell, ("2", "4"))):
        before = image_sources(lab_page, cell["index"])
        assert move_slider(lab_page, cell["index"]) == readouts
        after = wait_for_new_figure(lab_page, cell["index"], before, timeout_s=30)
        assert len(after) == 1 and after != before

    feedback = rerun_cell(lab_page, 5)
    assert feedback["prompt"] == "[5]:"
    assert feedback["feedback"] == feedback["markdownFeedback"] == ["Not attempted yet"]
    assert feedback["rawMarkup"] == []
    assert rerun_cell(lab_page, 5)["prompt"] == "[6]:"


def test_harness_reads_committed_outputs_without_running(lab_page, lab_server, harness_dir):
    cells = [nbformat.v4.new_code_cell(f"# {name}", outputs=[output]) for name, output in COMMITTED_OUTPUTS]
    cells[0].execution_count = 1
    write_notebook(harness_dir / "committed.ipynb", cells)
    open_notebook(lab_page, lab_server, "harness/committed.ipynb")

    figure, feedback, markup, stderr, stand_in, error, widget_repr, widget_text = read_cells(lab_page)

    assert figure["images"] == 1 and figure["placeholders"] == [] and figure["stderr"] == []
    assert feedback["markdownFeedback"] == ["Correct"] and feedback["rawMarkup"] == []
    assert markup["markdownFeedback"] == [] and len(markup["rawMarkup"]) == 1
    assert stderr["stderr"] == ["a warning a learner would see"]
    assert stand_in["placeholders"] == ["[<matplotlib.lines.Line2D at 0x7f0>]"] and stand_in["images"] == 0
    assert any("ValueError: broken on purpose" in text for text in error["stderr"])
    assert widget_repr["placeholders"] == ["planning:   0%|          | 0/4 [00:00<?, ?it/s]"]
    assert widget_text["placeholders"] == [] and widget_text["plainTexts"] == ["planning: 100% 4/4"]
    # Run in the fresh kernel, the cell gets the number it was committed with: the wait must not depend on it changing.
    assert rerun_cell(lab_page, 0)["prompt"] == "[1]:"
