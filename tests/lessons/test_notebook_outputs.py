"""The committed, executed notebooks show what a learner should see at each exercise check.

Every check cell (one that calls ``ex.qN.check()``) shows "Correct" in the solved
copy, and "Not attempted yet" in the learner copy, which still holds the
placeholders. Read from the notebooks as committed (``build_notebooks.py``
executed them), so nothing runs here.
"""

import re

import nbformat
import pytest

from course_utils import REPO_DIR
from tools.notebook_source import lesson_sources, notebook_path

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
# A call of an exercise's check on a line of code (not in a comment): `ex.q2.check()`.
CHECK_CALL = re.compile(r"^[^#\n]*\b\w+\.q(\d+)\.check\(\)", re.MULTILINE)
LESSONS = [path.stem for path in lesson_sources(REPO_DIR / "lessons")]


def check_cells(path):
    """Return ``[(cell index, exercise number, verdict texts)]`` for every check cell of the notebook at ``path``.

    The verdict texts are the plain-text (or Markdown) forms of the cell's rich outputs.
    """
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `python -m tools.build_notebooks --only {path.name[:2]}`")
    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "code":
            continue
        calls = CHECK_CALL.findall(cell.source)
        if not calls:
            continue
        texts = [
            output.data.get("text/plain") or output.data.get("text/markdown", "")
            for output in cell.outputs
            if output.output_type in ("display_data", "execute_result")
        ]
        found.append((index, calls[-1], texts))
    return found


def says(text, number, verdict):
    """Return True when ``text`` is exercise ``number``'s feedback and gives ``verdict`` ("Incorrect" is not "Correct")."""
    return re.search(rf"Exercise {number}\b\W+{verdict}\b", text) is not None


def verdicts(path):
    return [(index, number, [text for text in texts if "Exercise" in text]) for index, number, texts in check_cells(path)]


# What every check cell of a committed copy must say: its answers are filled in only in the solved copy.
VERDICT_OF_EACH_COPY = {"solved": "Correct", "learner": "Not attempted yet"}


@pytest.mark.parametrize("variant", VERDICT_OF_EACH_COPY)
@pytest.mark.parametrize("lesson", LESSONS)
def test_every_check_of_a_committed_copy_gives_that_copys_verdict(lesson, variant):
    path = notebook_path(NOTEBOOKS_DIR, lesson, variant)
    verdict = VERDICT_OF_EACH_COPY[variant]
    cells = verdicts(path)
    assert cells, f"{path}: no cell calls ex.qN.check()"
    wrong = [(index, texts) for index, number, texts in cells
             if len(texts) != 1 or not says(texts[0], number, verdict)]
    assert not wrong, f"{path}: check cells (index, verdicts) that do not say {verdict}: {wrong}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_both_copies_check_the_same_exercises(lesson):
    numbers = [[number for _, number, _ in check_cells(notebook_path(NOTEBOOKS_DIR, lesson, variant))]
               for variant in ("learner", "solved")]
    assert numbers[0] == numbers[1] and numbers[0] == sorted(numbers[0], key=int)


def test_a_verdict_that_is_not_correct_is_caught(tmp_path):
    # The verdict test must fail on an Incorrect verdict: "Incorrect" contains "correct".
    cell = nbformat.v4.new_code_cell("ex.q1.check()", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": "[Exercise 1] Incorrect: the warm-up is 10 steps too long"})])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    ((_, number, texts),) = verdicts(path)
    assert not says(texts[0], number, "Correct")
    assert says(texts[0], number, "Incorrect")


# --------------------------------------------------------------------------- no answer before the learner's


# A decimal with two or more digits after the point ("11.93"): specific enough that a
# second one equal to it in the learner copy is the same number, not chance.
SPECIFIC_NUMBER = re.compile(r"(?<![\w.])\d+\.\d{2,}(?![\w.])")


def output_text(cell) -> str:
    """Return what a code cell's outputs show as text: its streams, and the plain and Markdown forms of the rest."""
    shown = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            shown.append(output.text)
        elif output.output_type in ("display_data", "execute_result"):
            shown += [output.data.get("text/plain", ""), output.data.get("text/markdown", "")]
    return "\n".join(shown)


def answer_lines(learner_cells, solved_cells) -> set[str]:
    """Return the output lines the solved copy shows only because its exercises are answered.

    From the first cell whose source differs (the first exercise: its solution in
    one copy, its placeholder in the other), each line a cell of the solved copy
    shows that the same cell of the learner copy does not.
    """
    first = next(index for index, (mine, solved) in enumerate(zip(learner_cells, solved_cells))
                 if mine.source != solved.source)  # fmt: skip
    lines = set()
    for mine, solved in zip(learner_cells[first:], solved_cells[first:]):
        shown = {line.strip() for line in output_text(mine).splitlines()}
        lines |= {line.strip() for line in output_text(solved).splitlines() if line.strip() not in shown | {""}}
    return lines


def answers_shown(learner_cells, solved_cells) -> list[str]:
    """Return each answer line, or specific number of one, that the learner copy shows somewhere already."""
    answers = answer_lines(learner_cells, solved_cells)
    shown = "\n".join(output_text(cell) for cell in learner_cells)
    lines = {line.strip() for line in shown.splitlines()}
    numbers = set(SPECIFIC_NUMBER.findall(shown))
    return sorted({line for line in answers if line in lines}
                  | {number for line in answers for number in SPECIFIC_NUMBER.findall(line) if number in numbers})


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_learner_copy_shows_an_exercises_answer_before_the_learner_gives_it(lesson):
    # Issue 32: lesson 4's learner copy showed what answers exercise 1.
    learner, solved = (nbformat.read(notebook_path(NOTEBOOKS_DIR, lesson, variant), as_version=4).cells
                       for variant in ("learner", "solved"))  # fmt: skip
    assert answer_lines(learner, solved), "the solved copy shows no answer at all: the comparison found nothing"
    assert answers_shown(learner, solved) == []


def test_an_answer_shown_anywhere_in_the_learner_copy_is_caught():
    def code(source, text):
        return nbformat.v4.new_code_cell(source, outputs=[nbformat.v4.new_output("stream", name="stdout", text=text)])

    solved = [code("budget = 13", "budget: 13 GiB\n"), code("peak = 11.93", ""),
              code("print(peak)", "your answer: 11.93 GiB -> fits\n")]
    learner = [code("budget = 13", "budget: 13 GiB\n"), code("peak = ____", ""),
               code("print(peak)", "answer exercise 1 first\n")]
    assert answers_shown(learner, solved) == []
    learner[0].outputs[0].text = "budget: 13 GiB\nwith 8-bit AdamW the peak is 11.93 GiB\n"  # the answer, early
    assert answers_shown(learner, solved) == ["11.93"]
    learner[0].outputs[0].text = "your answer: 11.93 GiB -> fits\n"
    assert answers_shown(learner, solved) == ["11.93", "your answer: 11.93 GiB -> fits"]
