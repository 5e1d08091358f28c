"""An exercise never rebinds a name the lesson's sections use, and the notebooks' README says where exercises are.

Lesson 1's exercise 2 once rebound `train_dataloader` to a 4-batch loader: section 1,
run again afterwards, trained on it (0.577, the majority class, instead of 0.767) and
flipped the Trainer comparison of section 4. The test reads each lesson's source: the
names an exercise cell binds at the top level (in its solution and in its starter)
must not be names that any other code cell binds.
"""

import ast
import re

import jupytext
import pytest

from course_utils import REPO_DIR

LESSONS = sorted((REPO_DIR / "lessons").glob("[0-9][0-9]_*.py"))
_CHECK = re.compile(r"\bex\.q\d+\.check\(\)")


class _TopLevelNames(ast.NodeVisitor):
    """Collect the names a cell binds and reads at its top level (not inside functions, classes or comprehensions)."""

    def __init__(self):
        self.bound, self.read = set(), set()

    def visit_Name(self, node):
        (self.bound if isinstance(node.ctx, (ast.Store, ast.Del)) else self.read).add(node.id)

    def visit_FunctionDef(self, node):
        self.bound.add(node.name)
        for expression in node.decorator_list + node.args.defaults + node.args.kw_defaults:
            if expression is not None:
                self.visit(expression)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.bound.add(node.name)

    def visit_Lambda(self, node):
        pass

    def visit_Import(self, node):
        pass  # binding a module to its own name again changes nothing

    visit_ImportFrom = visit_Import

    def _comprehension(self, node):
        for generator in node.generators:
            self.visit(generator.iter)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def _names(code):
    visitor = _TopLevelNames()
    visitor.visit(ast.parse(code))
    return visitor


def _starter_code(code):
    """Return the cell with its STARTER regions uncommented (the learner's copy) and its SOLUTION regions dropped."""
    lines, region = [], None
    for line in code.splitlines():
        marker = re.match(r"\s*#\s*(BEGIN|END)\s+(SOLUTION|STARTER)\s*$", line)
        if marker:
            region = marker.group(2) if marker.group(1) == "BEGIN" else None
            continue
        if region == "SOLUTION":
            continue
        lines.append(re.sub(r"^(\s*)# ?", r"\1", line, count=1) if region == "STARTER" else line)
    return "\n".join(lines)


def _code_cells(lesson):
    notebook = jupytext.read(lesson, fmt="py:percent")
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda path: path.name[:2])
def test_no_exercise_rebinds_a_name_the_sections_use(lesson):
    cells = _code_cells(lesson)
    exercise_cells = [cell for cell in cells if _CHECK.search(cell)]
    assert exercise_cells, f"{lesson.name} has no exercise checks"
    # A name the sections bind: an exercise that binds it too changes what a section, re-run,
    # reads. A name only an exercise binds is its answer, which a later cell may read on purpose.
    section_names = set()
    for cell in cells:
        if cell not in exercise_cells:
            section_names |= _names(cell).bound
    for cell in exercise_cells:
        for variant in (cell, _starter_code(cell)):
            rebound = _names(variant).bound & section_names
            assert not rebound, (
                f"{lesson.name}: an exercise binds {sorted(rebound)}, which the lesson's sections use; "
                f"give the exercise names of its own:\n{cell}"
            )


def test_the_rebinding_test_catches_the_old_exercise_2_of_lesson_1():
    section = "train_dataloader, eval_dataloader = make()\nfor batch in train_dataloader:\n    pass\n"
    exercise = "model, optimizer, train_dataloader, lr_scheduler = ex.fresh_training_objects()\nex.q2.check()\n"
    assert _names(exercise).bound & (_names(section).bound | _names(section).read) == {"train_dataloader"}
    assert not _names("def f(train_dataloader):\n    train_dataloader = 1\n").bound - {"f"}


def test_the_notebooks_readme_says_which_lessons_gather_their_exercises_at_the_end():
    at_the_end, after_each_part = [], []
    for lesson in LESSONS:
        text = lesson.read_text(encoding="utf-8")
        first_check = _CHECK.search(text).start()
        heading = text.find("# ## Exercises")
        (at_the_end if 0 <= heading < first_check else after_each_part).append(str(int(lesson.name[:2])))
    readme = (REPO_DIR / "notebooks" / "README.md").read_text(encoding="utf-8")
    assert "Each lesson ends with exercises" not in readme

    def listed(numbers):
        return ", ".join(numbers[:-1]) + " and " + numbers[-1] if len(numbers) > 1 else numbers[0]

    assert f"lessons {listed(at_the_end)} gather them in a last section" in " ".join(readme.split())
    if after_each_part:
        assert f"lessons {listed(after_each_part)} place each one right after the part it practises" in " ".join(readme.split())


def _guarded(cell):
    """The names a cell tests with ``"name" not in globals()`` before it reads them."""
    return set(re.findall(r"""["'](\w+)["']\s+not\s+in\s+globals\(\)""", cell))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda path: path.name[:2])
def test_an_exercise_cell_that_needs_a_sections_result_says_which_cell_to_run(lesson):
    """After a kernel restart, an exercise cell runs with only the first cell (the imports) behind it."""
    cells = _code_cells(lesson)
    text = lesson.read_text(encoding="utf-8")
    heading = text.find("# ## Exercises")
    after = text.find("\n# ## ", heading + 1) if heading >= 0 else -1  # the section after the exercises (a summary)
    end = after if after >= 0 else len(text)
    exercise_cells = [cell for cell in cells if _CHECK.search(cell) or (0 <= heading < text.find(cell) < end)]
    exercise_names = set().union(*(_names(cell).bound for cell in exercise_cells))
    section_names = set().union(*(_names(cell).bound for cell in cells[1:] if cell not in exercise_cells))
    for cell in exercise_cells:
        needed = (_names(cell).read & section_names) - exercise_names - _names(cells[0]).bound - _guarded(cell)
        assert not needed, (f"{lesson.name}: an exercise cell reads {sorted(needed)} from the sections without saying "
                            f"which cell to run when it is missing:\n{cell}")


def test_the_guard_test_catches_lesson_8s_old_exercise_2_cell():
    old = 'print({name: peak for name, (_, _, peak) in speed_and_memory.items()})\nex.q2.check()\n'
    new = 'if "speed_and_memory" not in globals():\n    print("run section 8")\nelse:\n    print(speed_and_memory)\n'
    assert "speed_and_memory" in _names(old).read - _guarded(old)
    assert "speed_and_memory" not in _names(new).read - _guarded(new)
