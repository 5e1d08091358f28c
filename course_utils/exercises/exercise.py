"""The exercise classes: ``Exercise`` (any check), ``ValueExercise`` (a value), ``CodeExercise`` (a function).

How an author declares an exercise is documented in ``course_utils.exercises.core``.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterable, Mapping

from course_utils.exercises.feedback import COLOURS, Incorrect, Note, NotAttempted, Outcome, Result, running_ipython, show
from course_utils.exercises.limits import _TimeUp, time_limit
from course_utils.exercises.placeholder import PlaceholderError, contains_placeholder
from course_utils.exercises.values import as_number, describe_value, type_names, unit_slip, values_match

__all__ = ["CodeExercise", "Exercise", "ValueExercise"]


class Exercise:
    """One exercise: the notebook variables it reads, its hints, its solution and its check (see ``core``)."""

    variables: list[str] = []
    hints: list[str] = []
    solution_code: str = ""
    title: str = ""  # shown before the feedback, e.g. "Exercise 2"
    correct_message: str = ""  # added after "Correct: Well done."
    time_limit_s: float = 20.0  # how long a learner's function may run in one call_learner
    time_limit_cause: str = ""  # the likely cause of running out of time, if the exercise knows one

    def __init__(self) -> None:
        name, variables = type(self).__name__, self.variables
        if isinstance(variables, str) or not variables or not all(
            isinstance(v, str) and v.isidentifier() for v in variables
        ):
            raise TypeError(f"{name}.variables must be a non-empty list of variable names, got {self.variables!r}")
        if isinstance(self.hints, str) or not all(isinstance(h, str) and h.strip() for h in self.hints):
            raise TypeError(f"{name}.hints must be a list of non-empty strings, got {self.hints!r}")
        if not isinstance(self.solution_code, str) or not self.solution_code.strip():
            raise TypeError(f"{name}.solution_code must be a non-empty string of Python code")
        if type(self).check_answer is Exercise.check_answer:
            raise TypeError(f"{name} must define check_answer(self, **values)")
        self.attempts = 0  # check() calls
        self.hints_shown = 0  # highest hint level shown so far
        self.solution_shown = False

    def __repr__(self) -> str:
        return f"<exercise {type(self).__name__}: call .check(), .hint() or .solution()>"

    @property
    def solution_text(self) -> str:
        """The solution code, dedented, as ``solution()`` shows it."""
        return textwrap.dedent(self.solution_code).strip("\n")

    # ----- the learner's three methods

    def check(self) -> None:
        """Check the learner's answer, read from the notebook, and show the feedback (returns None)."""
        caller = inspect.currentframe().f_back
        try:
            namespace = self._notebook_namespace(caller)
        finally:
            del caller  # frames hold references to every local: drop ours promptly
        self.attempts += 1
        result = self.evaluate(namespace)
        if result.outcome is Outcome.CHECK_ERROR and result.exception is not None:
            # The developer needs the traceback; the learner sees the polite message.
            traceback.print_exception(result.exception, file=sys.stderr)
        show(result)

    def hint(self, level: int | None = None) -> None:
        """Show the next hint (or hint ``level``, counted from 1); after the last, the last again."""
        count = len(self.hints)
        if level is not None and (isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= max(count, 1)):
            raise ValueError(f"level must be an int from 1 to {count}, got {level!r}")
        if count == 0:
            show(Note("Hint", "This exercise has no hints.", self.title, COLOURS["hint"]))
            return
        if level is None:
            level = min(self.hints_shown + 1, count)
        self.hints_shown = max(self.hints_shown, level)
        show(Note(f"Hint {level} of {count}", self.hints[level - 1], self.title, COLOURS["hint"]))

    def solution(self) -> None:
        """Show the reference solution as code."""
        self.solution_shown = True
        show(_SolutionNote("Solution", self.solution_text, self.title, COLOURS["solution"]))

    # ----- for lesson authors and tests

    def evaluate(self, namespace: Mapping[str, object] | None = None, /, **values: object) -> Result:
        """Return the :class:`Result` of checking the answer, without showing anything (never raises).

        Values are read from ``namespace`` (e.g. a notebook's globals) and from keywords, keywords winning.
        """
        try:
            return self._evaluate(namespace, values)
        except _TimeUp:
            return self._result(Outcome.INCORRECT, self._timeout_message())
        except Exception as error:  # a check must never stop the learner's notebook
            return self._check_failed(error)

    def _evaluate(self, namespace, values) -> Result:
        if namespace is not None and not isinstance(namespace, Mapping):
            raise TypeError(f"namespace must be a mapping of variable names to values, got {type(namespace).__name__}")
        available = {**(namespace or {}), **values}
        missing = [name for name in self.variables if name not in available]
        if missing:
            names = ", ".join(f"`{name}`" for name in missing)
            return self._result(
                Outcome.NOT_ATTEMPTED,
                f"{names} {'is' if len(missing) == 1 else 'are'} not defined yet. "
                "Run the cell where you assign it, then check again.",
            )
        answer = {name: available[name] for name in self.variables}
        blanks = [name for name, value in answer.items() if contains_placeholder(value)]
        if blanks:
            names = ", ".join(f"`{name}`" for name in blanks)
            return self._result(
                Outcome.NOT_ATTEMPTED,
                f"{names} still {'holds' if len(blanks) == 1 else 'hold'} the placeholder `____`. "
                "Replace `____` with your answer, run the cell, then check again.",
            )
        try:
            verdict = self.check_answer(**answer)
        except Incorrect as signal_:
            return self._result(Outcome.INCORRECT, signal_.reason, signal_.__cause__)
        except NotAttempted as signal_:
            return self._result(Outcome.NOT_ATTEMPTED, signal_.reason)
        if verdict is None:
            message = "Well done." + (f" {self.correct_message}" if self.correct_message else "")
            return self._result(Outcome.CORRECT, message)
        if isinstance(verdict, Incorrect):
            return self._result(Outcome.INCORRECT, verdict.reason)
        raise TypeError(f"{type(self).__name__}.check_answer must return None or Incorrect, got {verdict!r}")

    def check_answer(self, **values: object) -> Incorrect | None:
        """Return None if the answer is right; raise or return ``Incorrect(reason)`` if not."""
        raise NotImplementedError

    def call_learner(self, function: Callable, *args: object, **kwargs: object) -> object:
        """Return ``function(*args, **kwargs)``, run under :attr:`time_limit_s`.

        If the learner's function raises, raise ``Incorrect`` naming the
        exception and the learner's line; if it uses ``____`` where a value is
        needed, ``NotAttempted``; if it runs too long, ``Incorrect`` saying so.
        """
        try:
            with time_limit(self.time_limit_s):
                return function(*args, **kwargs)
        except _TimeUp:
            raise Incorrect(self._timeout_message()) from None
        except PlaceholderError as error:
            raise NotAttempted(f"{error} Then run the cell and check again.") from error
        except (Exception, SystemExit) as error:
            name = getattr(function, "__name__", "your function")
            name = "your function" if name == "<lambda>" else f"`{name}`"
            raise Incorrect(
                f"{name} raised {type(error).__name__}: {_first_line(error)}{_learner_line(error, function)}. "
                "Read the last line of that error: it usually says what went wrong."
            ) from error

    def _timeout_message(self) -> str:
        cause = self.time_limit_cause or "Is there a loop that never ends?"
        return f"Your code was still running after {self.time_limit_s:g} s, so the check stopped it. {cause}"

    # ----- helpers

    def _notebook_namespace(self, caller: types.FrameType) -> Mapping[str, object]:
        """Return the learner's variables: IPython's user namespace, else the calling code's globals."""
        shell = running_ipython()
        if shell is not None:
            return shell.user_ns
        if caller.f_locals is caller.f_globals:
            return caller.f_globals
        # check() called inside a function: its locals hide globals of the same name.
        return {**caller.f_globals, **caller.f_locals}

    def _result(self, outcome: Outcome, message: str, exception: BaseException | None = None) -> Result:
        return Result(outcome, message, self.title, exception)

    def _check_failed(self, error: Exception) -> Result:
        return self._result(
            Outcome.CHECK_ERROR,
            f"{type(error).__name__}: {_first_line(error)}. This is a bug in the exercise, not in your answer: "
            "please report it, and compare your answer with `solution()` meanwhile.",
            error,
        )


class _SolutionNote(Note):
    def __str__(self) -> str:
        return Note.__str__(Note(self.label, "", self.title)) + "\n" + textwrap.indent(self.text, "    ")

    def _repr_markdown_(self) -> str:
        return Note(self.label, "", self.title, self.colour)._repr_markdown_() + f"\n\n```python\n{self.text}\n```"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _learner_line(error: BaseException, function: Callable) -> str:
    """Return ", at `<line>`" for the last line of ``function``'s file in the error's traceback, or ""."""
    try:
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is None:
            return ""
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == code.co_filename and f.line]
        return f", at `{frames[-1].line.strip()}`" if frames else ""
    except Exception:  # a traceback we cannot read: the exception's own message still says enough
        return ""


def _finite(number: object) -> bool:
    """Return False for a float NaN or infinity (a learner's 0/0 or overflow), True for any other number."""
    return not (isinstance(number, float) and not math.isfinite(number))


def _safely(diagnose: Callable, *args: object) -> str | None:
    """Return ``diagnose(*args)``, or None when an odd learner value makes the diagnosis itself fail."""
    try:
        reason = diagnose(*args)
    except Exception:
        return None
    return reason if isinstance(reason, str) and reason.strip() else None


class ValueExercise(Exercise):
    """An exercise whose answer is a value: a parameter count, a size in MiB, a string (see ``core``)."""

    expected: object = None  # the expected value of the one variable, or {variable: expected}
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    unit: str | None = None  # e.g. "MiB": a unit slip is named ("that is the amount in GiB")
    expected_type: type | tuple[type, ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        if self.expected is None and type(self).expected_values is ValueExercise.expected_values:
            raise TypeError(f"{type(self).__name__} must set `expected` or define expected_values(self, **values)")

    def expected_values(self, **values: object) -> dict[str, object]:
        """Return ``{variable: expected value}`` for the variables whose value is checked."""
        if isinstance(self.expected, Mapping) and len(self.variables) > 1:
            return dict(self.expected)
        return {self.variables[0]: self.expected}

    def diagnose(self, name: str, value: object, expected: object) -> str | None:
        """Return a reason naming a typical mistake for this wrong ``value``, or None for the generic one."""
        return None

    def check_answer(self, **values: object) -> None:
        """Return None if every checked variable has its expected value; raise ``Incorrect`` at the first that does not."""
        for name, expected in self.expected_values(**values).items():
            self._check_one(name, values[name], expected)

    def _check_one(self, name: str, value: object, expected: object) -> None:
        if value is None and expected is not None:
            raise Incorrect(f"`{name}` is None. Assign the result to `{name}` (print() and functions without `return` give None).")
        if self.expected_type is not None and not isinstance(value, self.expected_type):
            raise Incorrect(f"`{name}` should be {type_names(self.expected_type)}, but it is {describe_value(value)}.")
        if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
            self._check_number(name, value, expected)
        elif not isinstance(value, type(expected)) and not (
            isinstance(value, (list, tuple)) and isinstance(expected, (list, tuple))
        ):
            raise Incorrect(f"`{name}` should be {type_names(type(expected))}, but it is {describe_value(value)}.")
        elif not values_match(value, expected, self.rel_tol, self.abs_tol):
            reason = _safely(self.diagnose, name, value, expected)
            raise Incorrect(reason or f"`{name}` is {describe_value(value)}, which is not right.")

    def _check_number(self, name: str, value: object, expected: float) -> None:
        number = as_number(value)
        if number is None:
            raise Incorrect(f"`{name}` should be one number, but it is {describe_value(value)}.")
        if values_match(value, expected, self.rel_tol, self.abs_tol):
            return
        number = number[0]
        reason = _safely(self.diagnose, name, number, expected)
        if reason is None and isinstance(number, float) and math.isnan(number):
            reason = f"`{name}` is NaN (not a number): something in the computation divided 0 by 0 or overflowed."
        if reason is None and isinstance(number, float) and math.isinf(number):
            reason = f"`{name}` is infinite: a division by zero or an overflow?"
        if reason is None:
            slip = unit_slip(number, expected, self.unit)
            if slip is not None:
                reason = f"`{name}` is {describe_value(number)}: {slip}"
        if reason is None:
            direction = "too high" if number > expected else "too low"
            reason = f"`{name}` is {describe_value(number)}, which is {direction}."
        raise Incorrect(reason)


class CodeExercise(Exercise):
    """An exercise where the learner writes a function, checked against ``reference`` on ``cases()`` (see ``core``)."""

    rel_tol: float = 1e-6
    abs_tol: float = 0.0

    def __init__(self) -> None:
        super().__init__()
        name = type(self).__name__
        if len(self.variables) != 1:
            raise TypeError(f"{name}.variables must name exactly one function, got {self.variables!r}")
        if type(self).reference is CodeExercise.reference:
            raise TypeError(f"{name} must define reference(self, *args), the right function")
        if type(self).cases is CodeExercise.cases:
            raise TypeError(f"{name} must define cases(self), returning tuples of arguments")

    def reference(self, *args: object) -> object:
        """Return the right result for ``args``."""
        raise NotImplementedError

    def cases(self) -> Iterable[tuple]:
        """Return the inputs to try, each a tuple of positional arguments: ``[(model,), ...]``."""
        raise NotImplementedError

    def diagnose(self, got: object, expected: object, args: tuple) -> str | None:
        """Return a reason naming a typical mistake that gives ``got`` for ``args``, or None."""
        return None

    def describe_case(self, args: tuple) -> str:
        """Return how a message names an input, to start a sentence: "With the inputs 3, 4"."""
        return f"With the input{'s' if len(args) > 1 else ''} " + ", ".join(describe_value(a) for a in args)

    def check_answer(self, **values: object) -> None:
        """Return None if the learner's function agrees with the reference on every case; raise ``Incorrect`` if not."""
        (name,) = self.variables
        function = values[name]
        if not callable(function):
            raise Incorrect(f"`{name}` should be a function (`def {name}(...):`), but it is {describe_value(function)}.")
        for args in self.cases():
            expected = self.reference(*copy.deepcopy(args))
            got = self.call_learner(function, *args)
            self.compare(name, got, expected, args)

    def compare(self, name: str, got: object, expected: object, args: tuple) -> None:
        """Raise ``Incorrect`` (or ``NotAttempted``) if ``got`` is not the reference's ``expected``."""
        if contains_placeholder(got):
            raise NotAttempted(f"`{name}` returns the placeholder `____`: replace it with your code.")
        if got is None and expected is not None:
            raise Incorrect(f"{self.describe_case(args)}, `{name}` returned None. Did you forget `return`?")
        if values_match(got, expected, self.rel_tol, self.abs_tol):
            return
        reason = _safely(self.diagnose, got, expected, args)
        if reason is None:
            reason = f"{self.describe_case(args)}, `{name}` returned {describe_value(got)}, which is not right."
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
                if got.shape != expected.shape:
                    reason += " Its shape is wrong."
            elif isinstance(expected, numbers.Real) and as_number(got) is None:
                reason += " The result should be one number."
            elif isinstance(expected, numbers.Real) and not _finite(as_number(got)[0]):
                reason += " It is not a finite number: a division by zero or an overflow?"
            elif not isinstance(expected, numbers.Real) and type(got) is not type(expected):
                reason += f" The result should be {type_names(type(expected))}."
        raise Incorrect(reason)
