"""What a committed notebook shows where a cell displayed a widget, before the learner runs it.

JupyterLab shows a widget output of a notebook nobody trusted (every committed
notebook a learner opens) as its ``text/plain``; tools/notebook_widgets.py gives
that text what the widget's saved state says instead of the kernel's repr
("VBox(children=(...", a tqdm bar stuck at "0%|"). The browser test checks the
same thing in JupyterLab (tests/browser/test_lessons_in_jupyterlab.py).
"""

import re
from pathlib import Path

import nbformat
import pytest

from course_utils import REPO_DIR
from tools.notebook_source import built_notebooks, read_notebook, write_notebook
from tools.notebook_widgets import (
    CLOSED_WIDGET_TEXT,
    WIDGET_REPR_PATTERN,
    WIDGET_STATE,
    WIDGET_VIEW,
    shown_text,
    widget_outputs,
    widget_text,
    widget_text_problems,
    with_widget_texts,
)

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
CHECKED_TAG = "nbval-check-output"


def model(name, **state):
    return {"model_name": name, "model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0", "state": state}


# What tqdm.auto saves for a finished bar: labels on both sides of a FloatProgress, in an HBox.
PROGRESS_STATE = {
    "bar": model("HBoxModel", children=["IPY_MODEL_left", "IPY_MODEL_fill", "IPY_MODEL_right"]),
    "left": model("HTMLModel", description="", value="planning: 100%"),
    "fill": model("FloatProgressModel", description="", min=0.0, max=4.0, value=4.0, bar_style="success"),
    "right": model("HTMLModel", description="", value=" 4/4 [02:08&lt;00:00, 37.07s/it]"),
}
# A course explorer: two sliders over an Output widget holding the figure.
EXPLORER_STATE = {
    "box": model("VBoxModel", children=["IPY_MODEL_row", "IPY_MODEL_out"]),
    "row": model("HBoxModel", children=["IPY_MODEL_b1", "IPY_MODEL_b2"]),
    "b1": model("FloatSliderModel", description="β1", value=0.9),
    "b2": model("FloatSliderModel", description="β2", value=0.999),
    "out": model("OutputModel", outputs=[{"output_type": "display_data", "data": {"image/png": "iVBOR"}, "metadata": {}}]),
}


def notebook_with(state, model_id, text):
    cell = nbformat.v4.new_code_cell("show()", outputs=[
        nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": model_id, "version_major": 2}, "text/plain": text}),
        nbformat.v4.new_output("stream", name="stdout", text="done\n"),
    ])  # fmt: skip
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A"), cell])
    notebook.metadata["widgets"] = {WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return notebook


def test_a_finished_progress_bar_reads_as_it_ended_without_the_build_machines_timings():
    assert widget_text("bar", PROGRESS_STATE) == "planning: 100% 4/4"


def test_a_progress_bar_without_a_percentage_label_gets_its_fraction():
    state = {"bar": model("HBoxModel", children=["IPY_MODEL_fill"]), "fill": model("IntProgressModel", min=0, max=8, value=2)}
    assert widget_text("bar", state) == "25%"


def test_controls_read_as_one_sentence_naming_them_and_their_figure():
    assert widget_text("box", EXPLORER_STATE) == "Interactive controls (β1, β2) and the figure they redraw: run this cell to use them."
    without_figure = {**EXPLORER_STATE, "out": model("OutputModel", outputs=[])}
    assert widget_text("box", without_figure) == "Interactive controls (β1, β2): run this cell to use them."


def test_a_widget_missing_from_the_saved_state_was_closed_by_its_cell():
    assert widget_text("gone", PROGRESS_STATE) == CLOSED_WIDGET_TEXT


def test_the_texts_replace_only_the_widgets_text_form_and_leave_the_rest():
    built = notebook_with(PROGRESS_STATE, "bar", "planning:   0%|          | 0/4 [00:00<?, ?it/s]")
    assert widget_text_problems(built) == [
        "cell 1: a widget output shows 'planning:   0%|          | 0/4 [00:00<?, ?it/s]' as its text, not 'planning: 100% 4/4'"
    ]
    fixed = with_widget_texts(built)
    assert widget_text_problems(fixed) == []
    assert fixed.cells[1].outputs[0].data["text/plain"] == "planning: 100% 4/4"
    assert fixed.cells[1].outputs[0].data[WIDGET_VIEW] == built.cells[1].outputs[0].data[WIDGET_VIEW]
    assert fixed.cells[1].outputs[1] == built.cells[1].outputs[1] and fixed.metadata == built.metadata
    assert built.cells[1].outputs[0].data["text/plain"].startswith("planning:   0%")  # a copy was changed


@pytest.mark.parametrize("text", [
    "VBox(children=(HBox(children=(FloatSlider(value=0.9, continuous_update=False, description='β1'…",
    "planning:   0%|          | 0/4 [00:00<?, ?it/s]",
    "GAN epochs:  45%|████▌     | 27/60 [00:10<00:12,  2.61it/s]",
    "interactive(children=(IntSlider(value=1, description='slope'),",
])  # fmt: skip
def test_a_widgets_repr_is_recognised_as_one(text):
    assert re.search(WIDGET_REPR_PATTERN, text)


@pytest.mark.parametrize("text", ["planning: 100% 4/4", "Interactive controls (β1): run this cell to use them."])
def test_the_builds_texts_are_not_reprs(text):
    assert not re.search(WIDGET_REPR_PATTERN, text)


def test_the_builder_gives_committed_copies_their_widget_texts_without_running_them(tmp_path):
    from tools import build_notebooks as builder

    notebooks = tmp_path / "notebooks"
    options = ["--lessons-dir", str(Path(__file__).parents[1] / "fixtures" / "lessons"), "--notebooks-dir", str(notebooks)]
    assert builder.main(options + ["--no-execute"]) == 0
    path = notebooks / "00_demo.ipynb"
    committed = read_notebook(path)
    code = next(index for index, cell in enumerate(committed.cells) if cell.cell_type == "code")
    committed.cells[code].outputs = notebook_with(EXPLORER_STATE, "box", "VBox(children=(...").cells[1].outputs
    committed.metadata["widgets"] = notebook_with(EXPLORER_STATE, "box", "").metadata["widgets"]
    write_notebook(committed, path, tmp_path / "backups")
    assert builder.main(options + ["--check"]) == 1

    assert builder.main(options + ["--widget-texts"]) == 0
    assert widget_text_problems(read_notebook(path)) == []
    assert builder.main(options + ["--check"]) == 0
    assert not (tmp_path / "backups").exists() and not (notebooks / ".backups").exists()


# ----------------------------------------------------------------------------- the committed notebooks

COMMITTED = built_notebooks(NOTEBOOKS_DIR)


@pytest.mark.parametrize("path", COMMITTED, ids=[str(path.relative_to(NOTEBOOKS_DIR)) for path in COMMITTED])
def test_no_committed_notebook_shows_a_widgets_repr_as_text(path):
    notebook = read_notebook(path)
    reprs = [(index, shown_text(output)) for index, output in widget_outputs(notebook)
             if re.search(WIDGET_REPR_PATTERN, shown_text(output))]
    assert reprs == [], f"{path}: widget outputs shown as their repr (cell, text): {reprs}"
    problems = widget_text_problems(notebook)
    assert problems == [], f"{path}:\n" + "\n".join(problems) + (
        f"\nfix with: python -m tools.build_notebooks --widget-texts --only {path.name[:2]}")


@pytest.mark.parametrize("path", COMMITTED, ids=[str(path.relative_to(NOTEBOOKS_DIR)) for path in COMMITTED])
def test_no_checked_cell_shows_a_widget(path):
    # nbval compares a checked cell's text/plain: a widget's is the kernel's repr live
    # and the build's text committed, so the comparison would fail on every run.
    notebook = read_notebook(path)
    checked = [index for index, _ in widget_outputs(notebook) if CHECKED_TAG in notebook.cells[index].metadata.get("tags", ())]
    assert checked == [], f"{path}: cells tagged {CHECKED_TAG} that show a widget: {checked}"
