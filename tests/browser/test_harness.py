"""The browser harness itself, proven on two small notebooks written by the tests.

If these fail, the lesson tests cannot be trusted: the harness would miss a
figure, a widget, a feedback box or an error that a learner sees.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest
from lab_helpers import (
    image_sources,
    move_slider,
    open_notebook,
    rerun_cell,
    run_all_cells,
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
    # Stands in for an exercise check: the feedback label followed by a colon, as course_utils shows it.
    ("code", 'print("Not attempted yet: replace ____ with your answer.")'),
]

BROKEN_CELLS = [
    # A plot call as the cell's last line: its return value shows as text above the figure.
    ("code", "import matplotlib.pyplot as plt\nplt.plot([0, 1])"),
    ("code", 'import sys\nprint("a warning a learner would see", file=sys.stderr)'),
    ("code", 'raise ValueError("this cell is broken on purpose")'),
    ("code", 'print("never reached: Run All stops at the error")'),
]


@pytest.fixture
def harness_dir(lab_workdir):
    """A folder for the harness notebooks beside the lesson copies, removed afterwards (it would show in screenshots)."""
    folder = lab_workdir / "notebooks" / "harness"
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write_notebook(path, cells):
    """Write an nbformat v4 notebook of ``(kind, source)`` cells, with the course's python3 kernel."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    notebook.cells = [make[kind](source) for kind, source in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


def test_harness_sees_figures_a_moving_slider_and_feedback(lab_page, lab_server, harness_dir, artifacts_dir):
    write_notebook(harness_dir / "harness.ipynb", HARNESS_CELLS)
    open_notebook(lab_page, lab_server, "harness/harness.ipynb")

    cells = run_all_cells(lab_page, timeout_s=120)

    assert [cell["prompt"] for cell in cells if cell["isCode"]] == ["[1]:", "[2]:", "[3]:", "[4]:", "[5]:"]
    assert all(not cell["stderr"] for cell in cells), [cell["stderr"] for cell in cells]
    figure_cell, interact_cell, explorer_cell, feedback_cell = cells[2:]
    assert figure_cell["images"] == 1
    assert interact_cell["sliders"] == 1 and interact_cell["images"] == 1
    assert explorer_cell["sliders"] == 1 and explorer_cell["images"] == 1
    assert feedback_cell["feedback"] == ["Not attempted yet"]
    screenshot_notebook(lab_page, artifacts_dir / "harness.png")

    for cell, readouts in ((interact_cell, ("1", "2")), (explorer_cell, ("2", "4"))):
        before = image_sources(lab_page, cell["index"])
        assert move_slider(lab_page, cell["index"]) == readouts
        after = wait_for_new_figure(lab_page, cell["index"], before, timeout_s=30)
        assert len(after) == 1 and after != before

    rerun = rerun_cell(lab_page, feedback_cell["index"])
    assert rerun["prompt"] == "[6]:"
    assert rerun["feedback"] == ["Not attempted yet"]


def test_harness_reports_placeholders_stderr_and_errors_and_stops_waiting(lab_page, lab_server, harness_dir):
    write_notebook(harness_dir / "broken.ipynb", BROKEN_CELLS)
    open_notebook(lab_page, lab_server, "harness/broken.ipynb")

    cells = run_all_cells(lab_page, timeout_s=60)

    placeholder_cell, stderr_cell, error_cell, unreached_cell = cells
    assert len(placeholder_cell["placeholders"]) == 1 and placeholder_cell["images"] == 1
    assert placeholder_cell["placeholders"][0].startswith("[<matplotlib.lines.Line2D")
    assert stderr_cell["stderr"] == ["a warning a learner would see"]
    assert any("Traceback" in text and "ValueError: this cell is broken on purpose" in text for text in error_cell["stderr"])
    assert unreached_cell["prompt"] == "[ ]:"  # JupyterLab abandons Run All at the error
