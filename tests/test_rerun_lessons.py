"""Every lesson survives a learner who re-runs: each code cell twice in a row, then each section again.

Learners run a cell twice, and go back to an earlier section after doing the
exercises. This drives each lesson's solved copy in a real kernel (nbclient),
as a learner would in JupyterLab:

1. top to bottom, each code cell run twice in a row; the first run of a cell
   tagged ``nbval-check-output`` must show the committed output (what nbval
   checks), the second run the same output again;
2. then, with every exercise done, each section again from its start (a
   Markdown cell with a ``## `` heading starts a section), the last section
   first, so that every section is re-run after all the cells below it (the
   exercises included) and none is rescued by re-running the sections above it
   first; every checked cell must show its first output again.

No cell may raise (except one tagged ``raises-exception``). Why the solved copy: its exercise cells hold working answers, which
define names, build models and start processes the way a learner's finished
work does (the issue-10 failures came from exactly that: exercises reusing the
lesson's names, an exercise leaving an ``Accelerator`` behind); in the learner
copy they hold placeholders, which do nothing. The learner copy is run by nbval
and the browser test. The first pass checks what nbval checks on the solved
copy, so `make test` runs this test instead of nbval on ``notebooks/solutions``.

One test class per lesson, so pytest-xdist (``--dist loadscope``) gives each
lesson to whichever worker is free. Costs about three runs of each lesson.
"""

from __future__ import annotations

import copy
import re

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from course_utils import REPO_DIR
from notebook_source import lesson_sources, notebook_path

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
CHECKED_TAG = "nbval-check-output"
CELL_TIMEOUT_S = 600
SECTION_HEADING = re.compile(r"^## ", re.MULTILINE)
# What is compared of an output: the text a learner reads. Images, HTML and widget
# views carry ids and bytes that change from run to run without the result changing.
COMPARED_MIME_TYPES = ("text/plain", "text/markdown")

# Lessons that still fail at this commit, with the reason (xfail, strict: a fix makes the test say so).
KNOWN_FAILURES: dict[str, str] = {}


def comparable(outputs) -> list[tuple]:
    """Return what a learner reads in ``outputs``: stream texts and the text forms of rich outputs, in order.

    Consecutive pieces of one stream are joined, as the notebook shows them: how a
    print is cut into messages depends on when the kernel flushed (one run gave
    "... = 1,003.8 MiB" and "\n" where another gave one piece).
    """
    seen = []
    for output in outputs:
        if output.output_type == "stream":
            if seen and seen[-1][0] == "stream" and seen[-1][1] == output.name:
                seen[-1] = ("stream", output.name, seen[-1][2] + output.text)
            else:
                seen.append(("stream", output.name, output.text))
        elif output.output_type in ("display_data", "execute_result"):
            seen.append(("data", tuple((mime, output.data[mime]) for mime in COMPARED_MIME_TYPES if mime in output.data)))
        elif output.output_type == "error":
            seen.append(("error", output.ename, output.evalue))
    return seen


def sections(cells) -> list[list[int]]:
    """Return the indices of the code cells of each section, in order (cells before the first heading form one)."""
    found: list[list[int]] = [[]]
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown" and SECTION_HEADING.search(cell.source):
            found.append([])
        elif cell.cell_type == "code":
            found[-1].append(index)
    return [section for section in found if section]


def section_title(cells, first_code_index: int) -> str:
    """Return the ``## `` heading above cell ``first_code_index`` (or "the start")."""
    for cell in reversed(cells[:first_code_index]):
        if cell.cell_type == "markdown":
            match = re.search(r"^## (.+)$", cell.source, re.MULTILINE)
            if match:
                return match.group(1)
    return "the start"


class Rerun:
    """Runs the cells of one notebook in one kernel, any cell any number of times, recording what each showed."""

    def __init__(self, client: NotebookClient, notebook):
        self.client, self.notebook = client, notebook
        self.first_outputs: dict[int, list[tuple]] = {}

    def run(self, index: int, when: str) -> list[tuple]:
        """Run cell ``index`` again; return what it showed. ``when`` says which run, for the failure message."""
        cell = self.notebook.cells[index]
        cell.outputs = []
        try:
            self.client.execute_cell(cell, index)
            raised = None
        except CellExecutionError as error:
            raised = f"{error.ename}: {error.evalue}\n{error}"
        if raised is not None:  # failed outside the except block, so the report shows the error once
            first_line = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
            pytest.fail(f"cell {index} (`{first_line}`), {when}, raised {raised}", pytrace=False)
        return comparable(cell.outputs)

    def is_checked(self, index: int) -> bool:
        return CHECKED_TAG in self.notebook.cells[index].metadata.get("tags", ())

    def expect_same(self, index: int, shown: list[tuple], expected: list[tuple], when: str) -> None:
        if self.is_checked(index) and shown != expected:
            first_line = self.notebook.cells[index].source.strip().splitlines()[0][:70]
            pytest.fail(
                f"cell {index} (`{first_line}`), tagged {CHECKED_TAG}, {when}, showed\n{shown}\ninstead of\n{expected}",
                pytrace=False,
            )


def rerun_lesson(lesson: str, notebooks_dir=NOTEBOOKS_DIR, committed=None) -> None:
    """Drive lesson ``lesson``'s solved copy through both passes; fail at the first cell that breaks.

    ``committed`` (default: the solved notebook in ``notebooks_dir``) is the
    notebook run, and whose outputs the first run of a checked cell must show.
    """
    path = notebook_path(notebooks_dir, lesson, "solved")
    if committed is None:
        committed = nbformat.read(path, as_version=4)
    notebook = copy.deepcopy(committed)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # the kernel's own log, not cell output
    )  # fmt: skip
    with client.setup_kernel():
        runner = Rerun(client, notebook)
        code_cells = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
        for index in code_cells:
            first = runner.run(index, "run once")
            if committed.cells[index].outputs:  # a notebook never executed has nothing to compare with
                runner.expect_same(index, first, comparable(committed.cells[index].outputs), "run once (as committed)")
            runner.first_outputs[index] = first
            again = runner.run(index, "run a second time in a row")
            runner.expect_same(index, again, first, "run a second time in a row")
        # Last section first: each section is re-run after every later cell ran
        # again, so none is rescued by the re-run of an earlier section.
        for section in reversed(sections(notebook.cells)):
            when = f"when the section '{section_title(notebook.cells, section[0])}' was re-run after the exercises"
            for index in section:
                shown = runner.run(index, when)
                runner.expect_same(index, shown, runner.first_outputs[index], when)


LESSONS = [path.stem for path in lesson_sources(REPO_DIR / "lessons")]


def _lesson_test_class(lesson: str) -> type:
    marks = [pytest.mark.xfail(reason=KNOWN_FAILURES[lesson], strict=True)] if lesson in KNOWN_FAILURES else []

    def test_each_cell_twice_then_each_section_again(self):
        if not notebook_path(NOTEBOOKS_DIR, lesson, "solved").is_file():
            pytest.fail(f"{lesson}: no solved notebook; build it with `python scripts/build_notebooks.py --only {lesson[:2]}`")
        rerun_lesson(lesson)

    for mark in marks:
        test_each_cell_twice_then_each_section_again = mark(test_each_cell_twice_then_each_section_again)
    return type(f"TestRerunLesson{lesson[:2]}", (), {
        "__doc__": f"Re-running {lesson}.",
        "test_each_cell_twice_then_each_section_again": test_each_cell_twice_then_each_section_again,
    })


for _lesson in LESSONS:
    globals()[f"TestRerunLesson{_lesson[:2]}"] = _lesson_test_class(_lesson)


# --------------------------------------------------------------------------- the harness itself


def _notebook(*cells):
    notebook = nbformat.v4.new_notebook(cells=list(cells))
    notebook.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def test_a_print_cut_into_two_stream_messages_reads_as_one():
    one = [nbformat.v4.new_output("stream", name="stdout", text="total 1.0 MiB\n")]
    two = [nbformat.v4.new_output("stream", name="stdout", text="total 1.0 MiB"),
           nbformat.v4.new_output("stream", name="stdout", text="\n")]
    assert comparable(one) == comparable(two)
    assert comparable(one) != comparable([nbformat.v4.new_output("stream", name="stdout", text="total 2.0 MiB\n")])


def test_sections_start_at_second_level_headings():
    cells = _notebook(
        nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_markdown_cell("## One"), nbformat.v4.new_code_cell("b = 2"), nbformat.v4.new_code_cell("c = 3"),
        nbformat.v4.new_markdown_cell("### not a section"), nbformat.v4.new_code_cell("d = 4"),
        nbformat.v4.new_markdown_cell("## Two"), nbformat.v4.new_code_cell("e = 5"),
    ).cells  # fmt: skip
    assert sections(cells) == [[1], [3, 4, 6], [8]]


def _drive(tmp_path, notebook):
    path = tmp_path / "solutions" / "99_demo.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook, path)
    rerun_lesson("99_demo", notebooks_dir=tmp_path)


def _checked(source, text):
    cell = nbformat.v4.new_code_cell(source, outputs=[nbformat.v4.new_output("stream", name="stdout", text=text)])
    cell.metadata.tags = [CHECKED_TAG]
    return cell


def test_a_cell_that_fails_when_run_twice_is_caught(tmp_path):
    notebook = _notebook(nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("del x"))
    with pytest.raises(pytest.fail.Exception, match="cell 1 .*run a second time in a row, raised"):
        _drive(tmp_path, notebook)


def test_a_checked_cell_that_keeps_training_a_global_is_caught(tmp_path):
    notebook = _notebook(nbformat.v4.new_code_cell("steps = 0"), _checked("steps += 1\nprint(steps)", "1\n"))
    with pytest.raises(pytest.fail.Exception, match="second time in a row, showed"):
        _drive(tmp_path, notebook)


def test_an_exercise_reusing_a_lesson_name_is_caught_when_the_section_is_rerun(tmp_path):
    notebook = _notebook(
        nbformat.v4.new_markdown_cell("## Lesson"),
        nbformat.v4.new_code_cell("model = 'lesson model'"),
        nbformat.v4.new_markdown_cell("## Use it"),
        _checked("print(model)", "lesson model\n"),
        nbformat.v4.new_markdown_cell("## Exercises"),
        nbformat.v4.new_code_cell("model = 'my answer'"),
    )  # fmt: skip
    # Re-running section 'Use it' after the exercises prints the exercise's model.
    with pytest.raises(pytest.fail.Exception, match="'Use it' was re-run after the exercises, showed"):
        _drive(tmp_path, notebook)


def test_a_rerunnable_notebook_passes(tmp_path):
    notebook = _notebook(
        nbformat.v4.new_markdown_cell("## Lesson"),
        nbformat.v4.new_code_cell("model = 'lesson model'"),
        _checked("print(model)", "lesson model\n"),
        nbformat.v4.new_markdown_cell("## Exercises"),
        nbformat.v4.new_code_cell("my_model = 'my answer'"),
    )  # fmt: skip
    _drive(tmp_path, notebook)
