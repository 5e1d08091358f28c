"""Every lesson survives a learner who re-runs: the learner copy, the exercises done, then the whole lesson again.

Learners run a cell twice, do the exercises, and go back to an earlier section.
This drives each lesson in one real kernel (nbclient), the course kernel as
``make lab`` installs it, started from the learner's environment
(``tests/kernel_env.py``), along that path:

1. the LEARNER copy (``notebooks/NN_*.ipynb``) top to bottom: a checked cell
   must show the committed learner output (the exercise checks: "Not attempted
   yet"). A cell whose run took under ``RUN_TWICE_UNDER_S`` is run a second
   time in a row and a checked one must show the same again;
2. the learner does the exercises: each exercise cell (a code cell where the
   solved copy ``notebooks/solutions/NN_*.ipynb`` differs from the learner
   copy) is run in its solved form with the check cells after it, in the
   kernel the lesson left behind; they must show the solved copy's committed
   output ("Correct"); a quick one is run twice in a row, as in step 1;
3. then the whole lesson again, every section in order from the first, with
   the solved cells: every checked cell must show what it showed in steps 1
   and 2 (an exercise cell: its solved output). An exercise that rebinds a
   name a section uses (a 4-batch ``train_dataloader``) changes what that
   section shows when re-run alone; re-run after the sections above it, the
   name is bound again first, so step 2 checks that directly: after each
   exercise, no global name a section's cells read may hold another object.

A checked cell is one tagged ``nbval-check-output`` or an exercise cell. In
every run of every cell, nothing a learner would see as broken may appear: an
error (except in a cell tagged ``raises-exception``), text on stderr (except
``allow-stderr``), a text stand-in where a figure belongs ("<Figure size
640x480 with 1 Axes>" without the image), or a check that itself failed.

Why this shape: it is the path a learner takes, in about two runs of each
lesson (make test's budget: every lesson in 20 minutes on 2 cores, see the
Makefile). Every cell runs at least twice (steps 1 and 3), with all the cells
below it run in between; the quick cells, where a second run in a row is
cheap, also twice in a row; the long ones (training, planning, launching
processes: seconds to a minute each) only in step 3, where their second run
also checks that they survive everything after them. Step 2 checks the solved
answers in the lesson's real state (names, models and processes that the
lesson's cells left behind), which the committed solved copy was built
without; step 3 re-runs the lesson with working answers in place, which define
names, build models and start processes the way a learner's finished work
does (the issue-10 and issue-22 failures: exercises reusing the lesson's
names, an exercise leaving an ``Accelerator`` behind). The browser test then
only checks what needs a browser.

One test class per lesson, so pytest-xdist (``--dist loadscope``) gives each
lesson to whichever worker is free.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import time
import warnings
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from course_utils import REPO_DIR
from kernel_env import COURSE_KERNEL_NAME, KERNEL_ARGUMENTS, course_kernel_spec, learner_env
from tools.notebook_source import TAG_ALLOW_STDERR, lesson_sources, notebook_path, parse_lesson, render_notebook
from tools.notebook_watchdog import CellDeadlineError, WatchedNotebookClient
from tools.notebook_widgets import WIDGET_VIEW

# What a learner must never see, as the browser test defines it (one definition for both tests).
from lab_helpers import CHECK_ERROR_LABEL, PLACEHOLDER_PATTERN

# Minutes per lesson: make test hands the lessons out first; make test-notebooks runs them with nbval.
pytestmark = pytest.mark.rerun

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
LESSONS_DIR = REPO_DIR / "lessons"
CHECKED_TAG = "nbval-check-output"
CELL_TIMEOUT_S = 600
# A cell whose first run took less than this (wall-clock seconds) is run a second time in a
# row: most cells (imports, prints, small computations, exercise checks) take well under a
# second; the long ones are run again in step 3 instead (module docstring).
RUN_TWICE_UNDER_S = 5.0
SECTION_HEADING = re.compile(r"^## ", re.MULTILINE)
# What is compared of an output: the text a learner reads. Images, HTML and widget
# views carry ids and bytes that change from run to run without the result changing.
COMPARED_MIME_TYPES = ("text/plain", "text/markdown")
# An output that is a figure or a widget: its text/plain is the stand-in the front end replaces.
VISUAL_MIME_PREFIXES = ("image/", "application/vnd.jupyter.widget-view")
STAND_IN = re.compile(PLACEHOLDER_PATTERN)

# Lessons that still fail at this commit, with the reason (xfail, strict: a fix makes the test say so).
KNOWN_FAILURES: dict[str, str] = {}


def comparable(outputs) -> list[tuple]:
    """Return what a learner reads in ``outputs``: stream texts and the text forms of rich outputs, in order.

    A widget counts as ``("widget",)``: where it is, not its text.

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
        elif output.output_type in ("display_data", "execute_result") and WIDGET_VIEW in output.data:
            # A widget's text is its repr in a kernel and the build's stand-in in a committed
            # notebook (tools/notebook_widgets.py); what a learner gets is the widget.
            seen.append(("widget",))
        elif output.output_type in ("display_data", "execute_result"):
            seen.append(("data", tuple((mime, output.data[mime]) for mime in COMPARED_MIME_TYPES if mime in output.data)))
        elif output.output_type == "error":
            seen.append(("error", output.ename, output.evalue))
    return seen


def broken_outputs(cell) -> list[str]:
    """Return one line per thing in ``cell``'s outputs a learner would see as broken (empty when none).

    Errors are not listed: a cell that raises stops the test on its own (nbclient).
    """
    problems = []
    tags = cell.metadata.get("tags", ())
    for output in cell.outputs:
        if output.output_type == "stream":
            if output.name == "stderr" and TAG_ALLOW_STDERR not in tags:
                problems.append(f"text on stderr: {output.text.strip()[:300]!r}")
            text = output.text
        elif output.output_type in ("display_data", "execute_result"):
            plain = str(output.data.get("text/plain", ""))
            visual = any(mime.startswith(VISUAL_MIME_PREFIXES) for mime in output.data)
            if not visual and STAND_IN.search(plain.strip()):
                problems.append(f"text where a figure belongs: {plain.strip()[:120]!r}")
            text = "\n".join(str(output.data.get(mime, "")) for mime in COMPARED_MIME_TYPES)
        else:
            continue
        if CHECK_ERROR_LABEL in text:
            problems.append(f"the exercise check itself failed: {text.strip()[:300]!r}")
    return problems


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


def exercise_cells(learner, solved, lesson_source: Path | None = None) -> list[int]:
    """Return the indices of the exercise cells: code cells whose learner and solved forms differ.

    Fails (pytest.fail) unless the two copies match cell for cell everywhere else:
    same number of cells, same types and tags, the same code outside the
    exercises. With ``lesson_source``, the exercise cells must also be the cells
    the source gives a SOLUTION region (a copy built from an older source would not).
    """
    rebuild = "rebuild both copies with `python -m tools.build_notebooks --only NN`"
    if len(learner.cells) != len(solved.cells):
        pytest.fail(f"the learner copy has {len(learner.cells)} cells, the solved copy {len(solved.cells)}: "
                    f"they must match cell for cell ({rebuild})", pytrace=False)  # fmt: skip
    exercises = []
    for index, (mine, answer) in enumerate(zip(learner.cells, solved.cells)):
        if mine.cell_type != answer.cell_type or mine.metadata.get("tags", []) != answer.metadata.get("tags", []):
            pytest.fail(f"cell {index} is a {mine.cell_type} cell tagged {mine.metadata.get('tags', [])} in the learner "
                        f"copy, a {answer.cell_type} cell tagged {answer.metadata.get('tags', [])} in the solved copy "
                        f"({rebuild})", pytrace=False)  # fmt: skip
        if mine.cell_type == "code" and mine.source != answer.source:
            exercises.append(index)
    if lesson_source is not None:
        lesson = parse_lesson(lesson_source)
        expected = [
            index for index, (mine, answer)
            in enumerate(zip(render_notebook(lesson, "learner").cells, render_notebook(lesson, "solved").cells))
            if mine.cell_type == "code" and mine.source != answer.source
        ]  # fmt: skip
        if expected != exercises:
            pytest.fail(f"{lesson_source.name} has exercise cells {expected}, the notebooks {exercises}: "
                        f"the notebooks are older than the source ({rebuild})", pytrace=False)  # fmt: skip
    return exercises


def with_its_checks(cells, exercise: int) -> list[int]:
    """Return ``exercise`` and the code cells after it, up to the next Markdown cell, that run a check."""
    group = [exercise]
    for index in range(exercise + 1, len(cells)):
        if cells[index].cell_type == "markdown":
            break
        if ".check(" in cells[index].source:
            group.append(index)
    return group


class KernelHung(RuntimeError):
    """A cell whose run did not end: nbclient's timeout or the watchdog's deadline stopped it."""


class Kernel:
    """One kernel running cells of a lesson, any cell any number of times, failing at the first broken output."""

    def __init__(self, client: WatchedNotebookClient):
        self.client = client

    def run(self, cell, index: int, when: str) -> list[tuple]:
        """Run a copy of ``cell`` (cell ``index`` of its notebook); return what it showed. ``when`` names the run.

        ``self.last_run_s`` is then how long the run took (wall clock, seconds).
        """
        cell = copy.deepcopy(cell)
        cell.outputs = []
        started = time.perf_counter()
        try:
            self.client.execute_cell(cell, index)
            self.last_run_s = time.perf_counter() - started
            failure = None
        except CellExecutionError as error:
            failure = f"{describe(cell, index)}, {when}, raised {error.ename}: {error.evalue}\n{error}"
        except (CellDeadlineError, CellTimeoutError) as error:
            raise KernelHung(f"{describe(cell, index)}, {when}: {error}") from error
        if failure is not None:  # failed outside the except block, so the report shows the error once
            pytest.fail(failure, pytrace=False)
        problems = broken_outputs(cell)
        if problems:
            pytest.fail(f"{describe(cell, index)}, {when}, shows " + "; ".join(problems), pytrace=False)
        return comparable(cell.outputs)


# Printed in the kernel to see which object each of the learner's global names holds (a dict
# comprehension: its loop names stay inside it, so running it changes no global).
_GLOBALS_SNIPPET = (
    "print(__import__('json').dumps({k: [id(v), type(v).__name__] for k, v in globals().items()"
    " if not k.startswith('_') and k not in ('In', 'Out', 'get_ipython', 'exit', 'quit')}))"
)


def global_objects(kernel: Kernel) -> dict[str, tuple]:
    """Return {global name: (id, type name)} of the names the lesson's cells made in ``kernel``."""
    cell = nbformat.v4.new_code_cell(_GLOBALS_SNIPPET)
    kernel.client.execute_cell(cell, 0, store_history=False)
    text = "".join(output.text for output in cell.outputs if output.output_type == "stream" and output.name == "stdout")
    return {name: tuple(value) for name, value in json.loads(text).items()}


def names_read(source: str) -> set[str]:
    """Return the global names a cell's code reads, function bodies included (not their own locals).

    IPython's ``%``/``!`` lines are skipped.
    """
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    found: set[str] = set()

    def visit(node, local: frozenset) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for outside in [*getattr(node, "decorator_list", []), *args.defaults, *filter(None, args.kw_defaults)]:
                visit(outside, local)  # evaluated where the function is defined
            body = node.body if isinstance(node.body, list) else [node.body]
            inside = [child for statement in body for child in ast.walk(statement)]
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
            stored = {n.id for n in inside if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            declared_global = {name for n in inside if isinstance(n, ast.Global) for name in n.names}
            for statement in body:
                visit(statement, local | params | (stored - declared_global))
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            found.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, frozenset())
    return found


def readers_of_names(cells, section_cells: list[list[int]], exercises: list[int]) -> dict[str, list[int]]:
    """Return {name: the code cells outside the exercises' sections that read it}."""
    exercise_sections = [section for section in section_cells if set(section) & set(exercises)]
    readers: dict[str, list[int]] = {}
    for section in section_cells:
        if section in exercise_sections:
            continue
        for index in section:
            for name in names_read(cells[index].source):
                readers.setdefault(name, []).append(index)
    return readers


def expect_no_name_rebound(cells, exercise: int, before: dict, after: dict, readers: dict[str, list[int]]) -> None:
    """Fail if exercise cell ``exercise`` rebound a global that a section of the lesson reads."""
    rebound = sorted(name for name in before if name in after and after[name] != before[name] and name in readers)
    if rebound:
        uses = "; ".join(f"`{name}`, which {describe(cells[readers[name][0]], readers[name][0])} in section "
                         f"'{section_title(cells, readers[name][0])}' reads" for name in rebound)  # fmt: skip
        pytest.fail(f"exercise {describe(cells[exercise], exercise)} rebinds "
                    f"{uses}: re-running that section after the exercise would use the exercise's object; "
                    f"give the exercise names of its own", pytrace=False)  # fmt: skip


def describe(cell, index: int) -> str:
    """Return "cell 12 (`first line`)", to name a cell in a failure message."""
    lines = cell.source.strip().splitlines()
    return f"cell {index} (`{lines[0][:70] if lines else ''}`)"


def expect_same(cell, index: int, shown: list[tuple], expected: list[tuple], when: str) -> None:
    if shown != expected:
        pytest.fail(f"{describe(cell, index)}, {when}, showed\n{shown}\ninstead of\n{expected}", pytrace=False)


def rerun_lesson(lesson: str, notebooks_dir=NOTEBOOKS_DIR, lessons_dir: Path | None = LESSONS_DIR,
                 run_twice_under_s: float = RUN_TWICE_UNDER_S) -> None:
    """Drive lesson ``lesson`` along the learner's path (module docstring); fail at the first cell that breaks.

    The notebooks are read from ``notebooks_dir``; their committed outputs are
    what the first runs must show. With ``lessons_dir``, the exercise cells are
    checked against ``lessons_dir/<lesson>.py``. A cell whose first run took
    less than ``run_twice_under_s`` seconds is run again at once.
    """
    learner_path = notebook_path(notebooks_dir, lesson, "learner")
    learner = nbformat.read(learner_path, as_version=4)
    solved = nbformat.read(notebook_path(notebooks_dir, lesson, "solved"), as_version=4)
    source = Path(lessons_dir) / f"{lesson}.py" if lessons_dir is not None else None
    exercises = exercise_cells(learner, solved, source)
    checked = {index for index, cell in enumerate(learner.cells) if CHECKED_TAG in cell.metadata.get("tags", ())}
    checked.update(exercises)
    code_cells = [index for index, cell in enumerate(learner.cells) if cell.cell_type == "code"]

    course_kernel_spec()  # the kernel named below is the course's, as make venv installs it
    client = WatchedNotebookClient(
        copy.deepcopy(learner), label=lesson, timeout=CELL_TIMEOUT_S, kernel_name=COURSE_KERNEL_NAME,
        resources={"metadata": {"path": str(learner_path.parent)}},  # the learner copy's folder, as in make lab
        extra_arguments=KERNEL_ARGUMENTS,  # the kernel's own log, not cell output (tests/kernel_env.py)
    )  # fmt: skip
    shown: dict[int, list[tuple]] = {}  # what each checked cell must show when re-run
    with client.setup_kernel(env=learner_env()):
        kernel = Kernel(client)

        def run_once_or_twice(cell, index, when, expected):
            first = kernel.run(cell, index, when)
            if index in checked and expected is not None:
                expect_same(cell, index, first, expected, f"{when} (as committed)")
            shown[index] = first
            if kernel.last_run_s < run_twice_under_s:
                again = kernel.run(cell, index, f"{when}, a second time in a row")
                if index in checked:
                    expect_same(cell, index, again, first, f"{when}, a second time in a row")

        # 1. The learner copy, as committed (a notebook never executed has nothing to compare with).
        for index in code_cells:
            cell = learner.cells[index]
            run_once_or_twice(cell, index, "run in the learner copy", comparable(cell.outputs) if cell.outputs else None)

        # 2. The exercises done: the solved form of each, then its checks. None may rebind a
        # name a section reads: re-running that section alone would then use the exercise's.
        readers = readers_of_names(solved.cells, sections(solved.cells), exercises)
        for exercise in exercises:
            before = global_objects(kernel)
            for index in with_its_checks(solved.cells, exercise):
                cell = solved.cells[index]
                run_once_or_twice(cell, index, "run with the solved answer after the whole learner copy",
                                  comparable(cell.outputs))  # fmt: skip
            expect_no_name_rebound(solved.cells, exercise, before, global_objects(kernel), readers)

        # 3. The whole lesson again, section after section in order, with the answers in place.
        # A cell that reads an answer (committed differently in the two copies, such as "answer
        # exercise 1 first" against the verdict) must now show what the solved copy shows.
        for section in sections(solved.cells):
            when = f"when the section '{section_title(solved.cells, section[0])}' was re-run after the exercises"
            for index in section:
                again = kernel.run(solved.cells[index], index, when)
                if index in checked:
                    reads_an_answer = comparable(solved.cells[index].outputs) != comparable(learner.cells[index].outputs)
                    expected = comparable(solved.cells[index].outputs) if reads_an_answer else shown[index]
                    expect_same(solved.cells[index], index, again, expected, when)


LESSONS = [path.stem for path in lesson_sources(LESSONS_DIR)]


def _lesson_test_class(lesson: str) -> type:
    marks = [pytest.mark.xfail(reason=KNOWN_FAILURES[lesson], strict=True)] if lesson in KNOWN_FAILURES else []

    def test_learner_copy_then_the_exercises_then_the_lesson_again(self):
        missing = [variant for variant in ("learner", "solved") if not notebook_path(NOTEBOOKS_DIR, lesson, variant).is_file()]
        if missing:
            pytest.fail(f"{lesson}: no {' or '.join(missing)} notebook; "
                        f"build it with `python -m tools.build_notebooks --only {lesson[:2]}`")  # fmt: skip
        try:
            rerun_lesson(lesson)
        except KernelHung as hung:
            # A client still waiting for a kernel that has finished its cell is a fault of the
            # connection, not of the lesson. The one cause found (a lost wake-up on the shell
            # socket, which stalled the cells with an Output widget) is fixed in
            # tools/notebook_watchdog.py; should another remain, say so and run the lesson
            # once more in a new kernel; a second hang fails the test.
            warnings.warn(f"{lesson}: {hung}; running the lesson once more in a new kernel", stacklevel=1)
            rerun_lesson(lesson)

    test = test_learner_copy_then_the_exercises_then_the_lesson_again
    for mark in marks:
        test = mark(test)
    return type(f"TestRerunLesson{lesson[:2]}", (), {"__doc__": f"Re-running {lesson}.", test.__name__: test})


for _lesson in LESSONS:
    globals()[f"TestRerunLesson{_lesson[:2]}"] = _lesson_test_class(_lesson)


# --------------------------------------------------------------------------- the harness itself


def test_a_print_cut_into_two_stream_messages_reads_as_one():
    one = [nbformat.v4.new_output("stream", name="stdout", text="total 1.0 MiB\n")]
    two = [nbformat.v4.new_output("stream", name="stdout", text="total 1.0 MiB"),
           nbformat.v4.new_output("stream", name="stdout", text="\n")]
    assert comparable(one) == comparable(two)
    assert comparable(one) != comparable([nbformat.v4.new_output("stream", name="stdout", text="total 2.0 MiB\n")])


def test_a_widget_compares_by_where_it_is_not_by_its_text():
    def widget(text):
        return nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "a1"}, "text/plain": text})

    live, committed = widget("planning:   0%|          | 0/3"), widget("planning: 100% 3/3")
    assert comparable([live]) == comparable([committed])
    assert comparable([live]) != comparable([nbformat.v4.new_output("display_data", data={"text/plain": "planning: 100% 3/3"})])
    assert comparable([live]) != comparable([])


def test_sections_start_at_second_level_headings():
    cells = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_markdown_cell("## One"), nbformat.v4.new_code_cell("b = 2"), nbformat.v4.new_code_cell("c = 3"),
        nbformat.v4.new_markdown_cell("### not a section"), nbformat.v4.new_code_cell("d = 4"),
        nbformat.v4.new_markdown_cell("## Two"), nbformat.v4.new_code_cell("e = 5"),
    ]).cells  # fmt: skip
    assert sections(cells) == [[1], [3, 4, 6], [8]]


def test_a_figure_shown_as_text_stderr_and_a_failed_check_are_broken_outputs():
    figure = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure size 640x480 with 1 Axes>"})
    stand_in = nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure size 640x480 with 1 Axes>"})
    line = nbformat.v4.new_output("execute_result", data={"text/plain": "[<matplotlib.lines.Line2D at 0x7f>]"})
    warning = nbformat.v4.new_output("stream", name="stderr", text="UserWarning: careful\n")
    failed = nbformat.v4.new_output("display_data", data={"text/markdown": f"**Exercise 1: {CHECK_ERROR_LABEL}:** oops"})
    assert broken_outputs(nbformat.v4.new_code_cell("", outputs=[figure])) == []
    for output, problem in ((stand_in, "figure belongs"), (line, "figure belongs"), (warning, "stderr"), (failed, "itself failed")):
        found = broken_outputs(nbformat.v4.new_code_cell("", outputs=[output]))
        assert len(found) == 1 and problem in found[0], found
    allowed = nbformat.v4.new_code_cell("", outputs=[warning], metadata={"tags": [TAG_ALLOW_STDERR]})
    assert broken_outputs(allowed) == []


# A lesson source for the harness tests: a section that makes a name, one that uses it, and an exercise.
DEMO_LESSON = '''# %% [markdown]
# ## Lesson

# %%
model = "lesson model"

# %% [markdown]
# ## Use it

# %% tags=["nbval-check-output"]
print(model)

# %% [markdown]
# ## Exercises

# %%
# BEGIN SOLUTION
{solution}
# END SOLUTION
# BEGIN STARTER
# my_model = None
# END STARTER
print("Correct" if my_model == "my answer" else "Not attempted yet")
'''


def _drive(tmp_path, solution='my_model = "my answer"', edit=None, run_twice_under_s=RUN_TWICE_UNDER_S):
    """Build the demo lesson's two copies with committed outputs, apply ``edit(learner, solved)``, drive them."""
    (tmp_path / "lessons").mkdir(parents=True)
    source = tmp_path / "lessons" / "99_demo.py"
    source.write_text(DEMO_LESSON.format(solution=solution))
    lesson = parse_lesson(source)
    notebooks = {variant: render_notebook(lesson, variant) for variant in ("learner", "solved")}
    for variant, feedback in (("learner", "Not attempted yet\n"), ("solved", "Correct\n")):
        cells = notebooks[variant].cells
        cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text="lesson model\n")]
        cells[5].outputs = [nbformat.v4.new_output("stream", name="stdout", text=feedback)]
    if edit is not None:
        edit(notebooks["learner"], notebooks["solved"])
    for variant, notebook in notebooks.items():
        path = notebook_path(tmp_path / "notebooks", "99_demo", variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)
    rerun_lesson("99_demo", notebooks_dir=tmp_path / "notebooks", lessons_dir=tmp_path / "lessons",
                 run_twice_under_s=run_twice_under_s)


def test_the_names_a_cell_reads_include_globals_read_in_functions_not_their_locals():
    source = "%matplotlib inline\ndef train(steps, lr=base_lr):\n    held = model.size\n    return held * steps * scale\nprint(train(2))"
    assert names_read(source) == {"base_lr", "model", "scale", "print", "train"}
    assert names_read("def f():\n    global counter\n    counter = counter + 1") == {"counter"}


def test_a_rerunnable_lesson_passes(tmp_path):
    _drive(tmp_path)


def test_copies_that_do_not_match_cell_for_cell_are_reported(tmp_path):
    def shared_cell_differs(learner, solved):
        solved.cells[1].source = 'model = "another model"'

    with pytest.raises(pytest.fail.Exception, match=r"exercise cells \[5\], the notebooks \[1, 5\]"):
        _drive(tmp_path, edit=shared_cell_differs)


def test_a_cell_that_fails_when_run_twice_is_caught(tmp_path):
    def deleting(learner, solved):
        for notebook in (learner, solved):
            notebook.cells[3].source = 'print(model)\ndel model'

    with pytest.raises(pytest.fail.Exception, match="cell 3 .*run in the learner copy, a second time in a row, raised NameError"):
        _drive(tmp_path, edit=deleting)


def test_a_checked_cell_that_keeps_changing_a_global_is_caught(tmp_path):
    def counting(learner, solved):
        for notebook in (learner, solved):
            notebook.cells[1].source = 'model = "lesson model"\nsteps = 0'
            notebook.cells[3].source = 'steps += 1\nprint(model if steps == 1 else steps)'

    with pytest.raises(pytest.fail.Exception, match="run in the learner copy, a second time in a row, showed"):
        _drive(tmp_path, edit=counting)


def test_a_long_cell_is_run_again_with_the_whole_lesson_and_compared(tmp_path):
    # A cell too long to be run twice in a row (here: every cell) still runs a second time
    # in step 3; one that counts its runs where the lesson's first cells cannot reset it is caught.
    def counting_in_the_process(learner, solved):
        for notebook in (learner, solved):
            notebook.cells[3].source = 'import sys\nsys.runs = getattr(sys, "runs", 0) + 1\nprint(model if sys.runs == 1 else sys.runs)'

    _drive(tmp_path / "short", run_twice_under_s=0)
    with pytest.raises(pytest.fail.Exception, match="cell 3 .*'Use it' was re-run after the exercises, showed"):
        _drive(tmp_path / "long", edit=counting_in_the_process, run_twice_under_s=0)


def test_a_cell_that_reads_the_answer_shows_the_solved_copys_output_once_the_exercise_is_done(tmp_path):
    # Lesson 4 prints "answer exercise 1 first" under its exercise in the learner copy, and
    # the verdict from the learner's answer once there is one: the solved copy's output.
    def reading_the_answer(learner, solved):
        for notebook, shown in ((learner, "answer the exercise first\n"), (solved, "your answer: my answer\n")):
            cell = nbformat.v4.new_code_cell(
                'print("answer the exercise first" if my_model is None else f"your answer: {my_model}")',
                metadata={"tags": [CHECKED_TAG]}, outputs=[nbformat.v4.new_output("stream", name="stdout", text=shown)],
            )
            notebook.cells.append(cell)

    _drive(tmp_path, edit=reading_the_answer)


def test_a_wrong_solved_answer_is_caught(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"cell 5 .*with the solved answer after the whole learner copy \(as committed\)"):
        _drive(tmp_path, solution='my_model = "a wrong answer"')


def test_an_exercise_rebinding_a_name_a_section_reads_is_caught(tmp_path):
    # Re-running section 'Use it' alone after the exercise would print the exercise's model
    # (issue 22: lesson 1's exercise 2 left `train_dataloader` a 4-batch loader).
    with pytest.raises(pytest.fail.Exception, match=r"exercise cell 5 .* rebinds `model`, which cell 3 \(`print\(model\)`\) "
                                                    r"in section 'Use it' reads"):
        _drive(tmp_path, solution='my_model = model = "my answer"')
    # Through globals() too, and rebinding the exercise's own names is fine.
    with pytest.raises(pytest.fail.Exception, match="rebinds `model`"):
        _drive(tmp_path / "globals", solution='my_model = "my answer"\nglobals()["model"] = "other"')
    _drive(tmp_path / "own", solution='my_model = "draft"\nmy_model = "my answer"')


def test_a_cell_showing_a_figure_as_text_is_caught(tmp_path):
    def stand_in(learner, solved):
        for notebook in (learner, solved):
            notebook.cells[1].source = 'model = "lesson model"\nclass F:\n    def __repr__(self):\n' \
                                       '        return "<Figure size 640x480 with 1 Axes>"\nF()'

    with pytest.raises(pytest.fail.Exception, match="cell 1 .*text where a figure belongs"):
        _drive(tmp_path, edit=stand_in)


def test_a_lesson_whose_kernel_hung_is_run_once_more_with_a_warning_and_a_second_hang_fails(monkeypatch):
    runs = []

    def hangs(times):
        def rerun(lesson):
            runs.append(lesson)
            if len(runs) <= times:
                raise KernelHung("cell 3 (`train()`), run once in the learner copy: had not finished")
        return rerun

    lesson = LESSONS[0]
    test = _lesson_test_class(lesson)().test_learner_copy_then_the_exercises_then_the_lesson_again
    monkeypatch.setitem(globals(), "rerun_lesson", hangs(1))
    with pytest.warns(UserWarning, match=r"cell 3 \(`train\(\)`\).*running the lesson once more in a new kernel"):
        test()
    assert runs == [lesson, lesson]
    runs.clear()
    monkeypatch.setitem(globals(), "rerun_lesson", hangs(2))
    with pytest.warns(UserWarning), pytest.raises(KernelHung, match="had not finished"):
        test()
    assert runs == [lesson, lesson]
