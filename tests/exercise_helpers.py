"""Self-test helpers for exercises: every lesson's known-wrong answers fail, its reference passes.

Import them in a lesson's test file (pyproject.toml's ``pythonpath`` puts ``tests/`` on the path)::

    from exercise_helpers import assert_correct, assert_incorrect, assert_not_attempted
    from course_utils.exercises import ____, lesson1

    def test_q1_rejects_a_count_that_includes_the_frozen_layers():
        assert_incorrect(lesson1.q1, reason_contains="frozen", hides=65_783_042, num_params=66_362_880)

Each helper evaluates without displaying anything and returns the Result, so
a test can look further if it needs to.
"""

from __future__ import annotations

import re
import textwrap

from course_utils import REPO_DIR
from course_utils.exercises import Exercise, Outcome, Result, ____

_NOT_GIVEN = object()


def _evaluate(exercise: Exercise, values: dict) -> Result:
    if not isinstance(exercise, Exercise):
        raise TypeError(f"exercise must be an Exercise instance, got {type(exercise).__name__}")
    return exercise.evaluate(**values)


def _explain(result: Result, wanted: str) -> str:
    """Return an assertion message showing what was wanted and what the learner would read."""
    message = f"expected {wanted}, got {result.outcome.name}: {result.message}"
    if result.outcome is Outcome.CHECK_ERROR and result.exception is not None:
        message += "\n(the exercise's check itself raised; its traceback is the cause of this failure)"
    return message


def _fail_from(result: Result, message: str) -> AssertionError:
    error = AssertionError(message)
    error.__cause__ = result.exception if result.outcome is Outcome.CHECK_ERROR else None
    return error


def assert_correct(exercise: Exercise, /, **values: object) -> Result:
    """Assert that ``values`` (one keyword per exercise variable) pass the check; return the Result."""
    result = _evaluate(exercise, values)
    if result.outcome is not Outcome.CORRECT:
        raise _fail_from(result, _explain(result, "CORRECT"))
    return result


def assert_not_attempted(exercise: Exercise, /, **values: object) -> Result:
    """Assert that ``values`` count as not attempted yet (e.g. still ``____``); return the Result."""
    result = _evaluate(exercise, values)
    if result.outcome is not Outcome.NOT_ATTEMPTED:
        raise _fail_from(result, _explain(result, "NOT_ATTEMPTED"))
    return result


def assert_incorrect(
    exercise: Exercise,
    /,
    reason_contains: str | list[str] | None = None,
    hides: object = _NOT_GIVEN,
    **values: object,
) -> Result:
    """Assert that ``values`` are judged incorrect; return the Result.

    ``reason_contains``: text (or texts) the reason must contain, case-insensitive.
    ``hides``: the expected value, which the reason must not reveal (see
    :func:`assert_message_hides`).
    """
    result = _evaluate(exercise, values)
    if result.outcome is not Outcome.INCORRECT:
        raise _fail_from(result, _explain(result, "INCORRECT"))
    # The reason is Markdown: an odd number of backticks leaves code running into prose.
    assert result.message.count("`") % 2 == 0, f"unbalanced backticks in the reason: {result.message}"
    assert not re.search(r"\ba (int|int64|ndarray|object|array|empty|integer)\b", result.message), f"grammar: {result.message}"
    wanted = [reason_contains] if isinstance(reason_contains, str) else list(reason_contains or [])
    for text in wanted:
        assert text.lower() in result.message.lower(), (
            f"expected the reason to mention {text!r}; the learner reads: {result.message}"
        )
    if hides is not _NOT_GIVEN:
        assert_message_hides(result, hides)
    return result


def revealing_forms(value: object) -> list[str]:
    """Return the ways a message could spell ``value``: repr, str and, for numbers, 65,783,042 / 65_783_042 / 250.94."""
    forms = {repr(value), str(value)}
    if isinstance(value, int) and not isinstance(value, bool):
        forms |= {f"{value:,}", f"{value:_}"}
    elif isinstance(value, float):
        forms |= {f"{value:,}", f"{value:.1f}", f"{value:.2f}", f"{value:.3f}"}
    return sorted(form for form in forms if form)


def assert_message_hides(result: Result, expected: object) -> None:
    """Assert that ``result.message`` does not spell out ``expected`` in any of its usual forms.

    Numbers are matched as whole numbers (``42`` is not found in ``420``). Use a
    distinctive expected value (2 also appears in "hint 1 of 2"), and a wrong
    answer that does not round to it: messages echo the learner's own value.
    """
    for form in revealing_forms(expected):
        pattern = rf"(?<![\w.,]){re.escape(form)}(?![\w]|[.,]\d)"
        if re.search(pattern, result.message):
            raise AssertionError(
                f"the message reveals the expected value as {form!r}:\n{textwrap.indent(result.message, '    ')}"
            )


def assert_handles_bad_answers(exercise: Exercise, /, **good_values: object) -> None:
    """Assert that typical bad answers give INCORRECT, never a crash of the check.

    Starting from right ``good_values``, each variable in turn is replaced by
    ``None``, a string, a list and a function that raises; the other variables
    keep their good values.
    """

    def raises_value_error(*args: object, **kwargs: object) -> None:
        raise ValueError("learner's bug")

    assert_correct(exercise, **good_values)
    for name in good_values:
        for bad in (None, "not an answer", [1, 2, 3], raises_value_error):
            result = _evaluate(exercise, {**good_values, name: bad})
            if result.outcome is not Outcome.INCORRECT:
                raise _fail_from(result, _explain(result, f"INCORRECT with {name}={bad!r}"))


def assert_a_hang_is_stopped(exercise: Exercise, /, variable: str, limit_s: float, cause: str, **good_values: object):
    """Assert that a learner function in ``variable`` that never returns is stopped after ``limit_s`` and named.

    The exercise's own limit is cut to ``limit_s`` meanwhile; the reason must say how long it ran and ``cause``
    (the likely cause the exercise names).
    """

    def never_returns(*args, **kwargs):
        while True:
            pass

    exercise.time_limit_s = limit_s
    try:
        return assert_incorrect(exercise, reason_contains=[f"still running after {limit_s:g} s", cause],
                                **{**good_values, variable: never_returns})
    finally:
        del exercise.time_limit_s


# ----------------------------------------------------------------------------- the lesson's cells and the exercise module

_MARKERS = ("# BEGIN SOLUTION", "# END SOLUTION", "# BEGIN STARTER", "# END STARTER")


def lesson_path(number: str):
    """Return the percent-format source of lesson ``number`` ("07"): ``lessons/07_*.py``."""
    found = sorted((REPO_DIR / "lessons").glob(f"{number}_*.py"))
    if len(found) != 1:
        raise AssertionError(f"{len(found)} lesson sources match lessons/{number}_*.py; expected exactly one")
    return found[0]


def learner_function(source: str, name: str, **names: object):
    """Return what a learner's cell ``source`` binds to ``name``, run as a notebook cell with ``names`` (and ``____``) defined."""
    namespace = {"____": ____, **names}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the tests' own learner answers
    return namespace[name]


def lesson_cell(lesson_path, marker: str) -> str:
    """Return the source of the one code cell of a percent-format lesson that contains ``marker``."""
    cells, current = [], []
    for line in open(lesson_path, encoding="utf-8").read().splitlines():
        if line.startswith("# %%"):
            cells.append("\n".join(current))
            current = []
        else:
            current.append(line)
    cells.append("\n".join(current))
    found = [cell for cell in cells if marker in cell]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} cells of {lesson_path} contain {marker!r}; expected exactly one")
    return found[0]


def cell_copy(cell: str, variant: str) -> str:
    """Return the code a ``variant`` ("solved" or "learner") copy of the lesson shows for ``cell``.

    The solved copy keeps SOLUTION regions and drops STARTER ones; the learner
    copy the reverse, with the STARTER lines uncommented, as after a learner's edit.
    """
    keep, skip = ("SOLUTION", "STARTER") if variant == "solved" else ("STARTER", "SOLUTION")
    lines, region = [], None
    for line in cell.splitlines():
        stripped = line.strip()
        if stripped in _MARKERS:
            region = stripped.split()[-1] if stripped.startswith("# BEGIN") else None
            continue
        if region == skip:
            continue
        if region == "STARTER" and keep == "STARTER":
            indent = line[: len(line) - len(line.lstrip())]
            line = indent + stripped.removeprefix("# ").removeprefix("#")
        lines.append(line)
    return "\n".join(lines)


def normalised(code: str) -> str:
    """Return ``code`` parsed and unparsed: no comments, blank lines or formatting differences."""
    import ast

    return ast.unparse(ast.parse(textwrap.dedent(code)))


def assert_lesson_shows_the_solution(exercise: Exercise, lesson_path, check_call: str) -> None:
    """Assert that the solved copy of the cell calling ``check_call`` ends with ``exercise``'s solution code."""
    cell = cell_copy(lesson_cell(lesson_path, check_call), "solved").split(check_call)[0]
    shown, solution = normalised(cell), normalised(exercise.solution_text)
    assert shown.endswith(solution), (
        f"the solved cell of {check_call} and the exercise's solution_code differ:\n--- lesson\n{shown}\n--- solution\n{solution}"
    )


# ----------------------------------------------------------------------------- odd values, in bulk


class _Hostile:
    """A learner's object whose comparisons, truth and conversions all raise."""

    def __eq__(self, other):
        raise RuntimeError("hostile __eq__")

    __bool__ = __float__ = __int__ = __index__ = __len__ = __iter__ = __lt__ = __gt__ = __eq__
    __hash__ = object.__hash__

    def __repr__(self):
        raise RuntimeError("hostile __repr__")


def odd_values() -> list:
    """Return values no answer should be, of every kind: huge, empty, multi-element, hostile, NaN..."""
    import numpy as np
    import torch

    return [
        None, "", "not an answer", b"1", 10**400, -(10**400), float("nan"), float("inf"), 1j, True, [], [1, 2, 3],
        {}, {"a": 1}, (1,), set(), object(), _Hostile(), np.zeros(0), np.ones(3), np.ones((2, 2)), np.array([[7]]),
        np.float32("nan"), torch.zeros(0), torch.ones(3), torch.ones(2, 2), torch.tensor([[7.0]]),
        torch.empty(3, device="meta"), torch.ones(1, requires_grad=True),
    ]


def odd_functions() -> list:
    """Return learner functions that go wrong in every way: raise, return odd values, take no arguments, never end."""

    def raises(*args, **kwargs):
        raise ValueError("learner's bug")

    def takes_nothing():
        return 1

    def never_ends(*args, **kwargs):
        while True:
            pass

    two_lines = (lambda *args, **kwargs:
                 None)
    returning = [lambda *args, _value=value, **kwargs: _value for value in odd_values()]
    return [raises, takes_nothing, never_ends, two_lines, *returning]


def assert_odd_answers_are_judged(exercise: Exercise, /, vary_only: tuple = (), **good_values: object) -> None:
    """Assert that every odd value, and every odd function, in each variable gives INCORRECT or NOT_ATTEMPTED.

    ``vary_only``: the variables to try odd values in (all of them by default).
    Never "the check itself failed", never a hang: the exercise's time limit is
    cut to half a second meanwhile.
    """
    exercise.time_limit_s = 0.5
    try:
        for name in vary_only or good_values:
            for bad in odd_values() + odd_functions():
                result = _evaluate(exercise, {**good_values, name: bad})
                if result.outcome not in (Outcome.INCORRECT, Outcome.NOT_ATTEMPTED):
                    raise _fail_from(result, _explain(result, f"INCORRECT or NOT_ATTEMPTED with {name}={bad!r:.60}"))
    finally:
        del exercise.time_limit_s
