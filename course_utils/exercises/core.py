"""The machinery behind every exercise: check, hint, solution.

A lesson module (``course_utils.exercises.lesson1`` ...) declares its exercises as
small classes; this module binds them to the notebook, runs the checks and shows
the feedback. A learner only ever calls three methods::

    ex.q1.check()      # not attempted yet / incorrect (with the reason) / correct
    ex.q1.hint()       # the next hint; ex.q1.hint(2) shows hint 2
    ex.q1.solution()   # the reference code

A check never raises on a learner's answer: a wrong type, ``None`` or a function
that raises all become "incorrect" with a reason. Only a bug in the exercise
itself gives the fourth outcome, "the check itself failed", which asks the
learner to report it.
"""

from __future__ import annotations

import copy
import enum
import html
import inspect
import math
import numbers
import re
import reprlib
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "____",
    "CodeExercise",
    "Exercise",
    "Incorrect",
    "NotAttempted",
    "Outcome",
    "Result",
    "ValueExercise",
    "contains_placeholder",
    "describe_value",
    "incorrect",
    "values_match",
]


# --------------------------------------------------------------------------- placeholder


class _Placeholder:
    """The type of ``____``: a blank a learner replaces with an answer.

    It absorbs whatever is done to it (arithmetic, calls, attributes, indexing)
    and returns itself, so an untouched exercise cell still runs and the
    variable it assigns is still recognisable as "not attempted".
    """

    _instance: _Placeholder | None = None

    def __new__(cls) -> _Placeholder:
        # One object only, so `value is ____` is the test for "not attempted".
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "____"

    def __format__(self, format_spec: str) -> str:
        # f"{____:.2f}" must not raise TypeError like object.__format__ does.
        return "____"

    def __reduce__(self) -> str:
        # Pickling and copying give back the one placeholder, not a twin.
        return "____"

    def __copy__(self) -> _Placeholder:
        return self

    def __deepcopy__(self, memo: dict) -> _Placeholder:
        return self

    def __getattr__(self, name: str) -> _Placeholder:
        # Private names raise, so libraries probing for protocols
        # (`_repr_html_`, `__array__`, ...) see a plain object.
        if name.startswith("_"):
            raise AttributeError(name)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        pass  # `____.lr = 0.1` must not give the shared placeholder state.

    def __delattr__(self, name: str) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Placeholder:
        return self

    def __getitem__(self, key: object) -> _Placeholder:
        return self

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __iter__(self):
        # Yield itself once: `sum(____)`, `[p for p in ____]` and `for` loops
        # run and give results that still contain the placeholder. (Without
        # __iter__, Python would iterate through __getitem__ forever.)
        yield self

    def __enter__(self) -> _Placeholder:
        return self

    def __exit__(self, *exc_info: object) -> bool:
        return False


def _absorb(self: _Placeholder, *args: object) -> _Placeholder:
    return self


for _name in (
    "add sub mul matmul truediv floordiv mod pow lshift rshift and xor or "
    "radd rsub rmul rmatmul rtruediv rfloordiv rmod rpow rlshift rrshift rand rxor ror "
    "neg pos abs invert round floor ceil trunc lt le gt ge"
).split():
    setattr(_Placeholder, f"__{_name}__", _absorb)
del _name

____ = _Placeholder()
"""The blank in an exercise cell. Replace it with your answer."""


def _code_mentions_placeholder(code: types.CodeType) -> bool:
    """Return True if ``code`` or any function nested in it reads the name ``____``."""
    if "____" in code.co_names:
        return True
    return any(isinstance(const, types.CodeType) and _code_mentions_placeholder(const) for const in code.co_consts)


def contains_placeholder(value: object, _depth: int = 0) -> bool:
    """Return True if ``value`` still holds ``____``: the exercise is not attempted yet.

    That is: the placeholder itself; a function (or a class's method) whose code
    reads ``____``; or a list, tuple, set or dict that contains one of those.
    """
    if value is ____:
        return True
    if _depth > 20:  # deep or self-referencing containers: stop looking
        return False
    if isinstance(value, (types.MethodType, staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return _code_mentions_placeholder(value.__code__)
    if isinstance(value, type):
        return any(contains_placeholder(member, _depth + 1) for member in vars(value).values())
    if isinstance(value, Mapping):
        return any(
            contains_placeholder(key, _depth + 1) or contains_placeholder(item, _depth + 1)
            for key, item in value.items()
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(contains_placeholder(item, _depth + 1) for item in value)
    return False


# --------------------------------------------------------------------------- outcomes


class Outcome(enum.Enum):
    """What a check concluded. The value is the label a learner reads."""

    NOT_ATTEMPTED = "Not attempted yet"
    INCORRECT = "Incorrect"
    CORRECT = "Correct"
    CHECK_ERROR = "The check itself failed"  # a bug in the exercise, not the learner's fault


# Text colour and left-border colour of each kind of feedback.
_COLOURS = {
    Outcome.NOT_ATTEMPTED: "#b35c00",
    Outcome.INCORRECT: "#c62828",
    Outcome.CORRECT: "#2e7d32",
    Outcome.CHECK_ERROR: "#6a1b9a",
    "hint": "#1565c0",
    "solution": "#455a64",
}


@dataclass(frozen=True)
class Result:
    """The outcome of one check and the message a learner reads.

    ``exception`` is the error behind a ``CHECK_ERROR`` (or the learner's error
    behind an ``INCORRECT``), kept for tests; it is never shown whole.
    """

    outcome: Outcome
    message: str
    title: str = ""
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return _plain_text(self.outcome.value, self.message, self.title)

    def _repr_html_(self) -> str:
        return _html_box(_COLOURS[self.outcome], self.outcome.value, _inline_html(self.message), self.title)


class Incorrect(Exception):
    """Raise (or return) this from check logic: the answer is wrong, for ``reason``.

    The reason is shown to the learner, so it must not contain the expected value.
    """

    def __init__(self, reason: str):
        if not isinstance(reason, str) or not reason.strip():
            raise TypeError(f"reason must be a non-empty str, got {reason!r}")
        super().__init__(reason)
        self.reason = reason


class NotAttempted(Exception):
    """Raise this from check logic when the answer is not there yet (e.g. a cell not run)."""

    def __init__(self, reason: str):
        if not isinstance(reason, str) or not reason.strip():
            raise TypeError(f"reason must be a non-empty str, got {reason!r}")
        super().__init__(reason)
        self.reason = reason


def incorrect(reason: str) -> Incorrect:
    """Return an ``Incorrect`` signal, for check logic that prefers ``return incorrect("...")``."""
    return Incorrect(reason)


# --------------------------------------------------------------------------- display


def _plain_text(label: str, message: str, title: str = "") -> str:
    prefix = f"[{title}] " if title else ""
    return f"{prefix}{label}:" + (f" {message}" if message else "")


def _inline_html(message: str) -> str:
    """Return ``message`` as HTML: escaped, `code`, **bold** and *emphasis* rendered, newlines as breaks."""
    parts = re.split(r"(`[^`]+`)", html.escape(message))
    for index, part in enumerate(parts):
        if index % 2:  # a code span: no emphasis inside (`2 * x * y` stays as written)
            parts[index] = f"<code>{part[1:-1]}</code>"
        else:
            part = re.sub(r"\*\*(\S(?:.*?\S)?)\*\*", r"<strong>\1</strong>", part)
            parts[index] = re.sub(r"\*(\S(?:[^*]*?\S)?)\*", r"<em>\1</em>", part)
    return "".join(parts).replace("\n", "<br>")


def _html_box(colour: str, label: str, body_html: str, title: str = "") -> str:
    prefix = f"{html.escape(title)}: " if title else ""
    return (
        f'<div style="border-left: 4px solid {colour}; padding: 0.2em 0.8em; margin: 0.3em 0;">'
        f'<strong style="color: {colour};">{prefix}{html.escape(label)}:</strong> {body_html}</div>'
    )


def _running_ipython():
    """Return the running IPython shell, or None outside IPython (plain Python, pytest)."""
    # Only look if IPython is already imported: importing it would not start a shell anyway.
    ipython_module = sys.modules.get("IPython")
    return ipython_module.get_ipython() if ipython_module is not None else None


def _show(text: str, html_text: str) -> None:
    """Show feedback: HTML in Jupyter, plain text in a terminal or outside IPython."""
    if _running_ipython() is None:
        print(text)
        return
    from IPython.display import display

    # A raw MIME bundle: Jupyter renders the HTML, a terminal IPython prints the text.
    display({"text/html": html_text, "text/plain": text}, raw=True)


# --------------------------------------------------------------------------- describing values

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxtuple = _short.maxset = _short.maxdict = 6


def describe_value(value: object) -> str:
    """Return a short description of a learner's value for a message: ``65,783,042``, ``a list [...]``."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, float):
        # Thousands separators make big figures readable: 263,132,168.0
        return format(value, ",") if math.isfinite(value) and abs(value) < 1e16 else repr(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if value.numel() <= 6 and value.device.type != "meta":
            return f"tensor({value.tolist()!r})"
        return f"a tensor of shape {shape} ({value.dtype})"
    if isinstance(value, types.FunctionType):
        return f"the function `{value.__name__}`"
    return f"a {type(value).__name__} {_short.repr(value)}"


def _as_real_number(value: object) -> float | int | None:
    """Return ``value`` as a Python int or float, or None if it is not one number.

    One-element tensors and NumPy scalars count as numbers; bools do not.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    if callable(item) and (size() if callable(size) else size) == 1 and not isinstance(value, (str, bytes)):
        try:
            number = item()
        except Exception:  # a meta tensor has no value to read
            return None
        return _as_real_number(number)
    return None


def values_match(got: object, expected: object, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """Return True if ``got`` equals ``expected``: numbers within tolerance, tensors elementwise.

    Lists and tuples match element by element (a list may stand for a tuple),
    dicts key by key. Anything else is compared with ``==``; a comparison that
    raises counts as a mismatch.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return False
        if "meta" in (got.device.type, expected.device.type):
            return False
        return bool(torch.allclose(got.to(expected.dtype), expected, rtol=rel_tol, atol=abs_tol, equal_nan=True))
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        number = _as_real_number(got)
        if number is None:
            return False
        if math.isnan(expected) or math.isnan(number):
            return math.isnan(expected) and math.isnan(number)
        return math.isclose(number, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and set(got) == set(expected)
            and all(values_match(got[key], expected[key], rel_tol, abs_tol) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(values_match(g, e, rel_tol, abs_tol) for g, e in zip(got, expected))
        )
    try:
        return bool(got == expected)
    except Exception:  # e.g. `array == value` whose truth is ambiguous
        return False


# Unit slips worth naming in a message: (factor, how to say it, what it suggests).
_UNIT_SLIPS = (
    (2**10, "1,024", "a KiB/bytes (or MiB/KiB) mix-up?"),
    (2**20, "1,048,576 (2**20)", "bytes where MiB were asked, or the reverse?"),
    (2**30, "1,073,741,824 (2**30)", "bytes where GiB were asked, or the reverse?"),
    (2**20 / 10**6, "1.049 (2**20 / 10**6)", "MB (10**6 bytes) where MiB (2**20 bytes) were asked, or the reverse?"),
    (2**30 / 10**9, "1.074 (2**30 / 10**9)", "GB (10**9 bytes) where GiB (2**30 bytes) were asked, or the reverse?"),
    (1000, "1,000", "a unit prefix (k, M, G) mix-up?"),
    (10**6, "1,000,000", "a count in millions, or the reverse?"),
    (10**9, "1,000,000,000", "a count in billions, or the reverse?"),
)


def _unit_slip(value: float, expected: float) -> str | None:
    """Return a sentence naming a unit mix-up if ``value / expected`` is a typical unit factor, else None."""
    if expected == 0 or value == 0 or not math.isfinite(value):
        return None
    ratio = value / expected
    for factor, factor_text, suggestion in _UNIT_SLIPS:
        for size, candidate in (("large", factor), ("small", 1 / factor)):
            if math.isclose(ratio, candidate, rel_tol=2e-4):
                return f"that is {factor_text} times too {size}: {suggestion} Check the unit."
    return None


# --------------------------------------------------------------------------- exercises

_MISSING = object()


class Exercise:
    """One exercise: the notebook variables it reads, its hints, its solution and its check.

    Declare a subclass and create one instance per exercise in a lesson module::

        class TrainableShare(Exercise):
            variables = ["trainable", "total"]
            hints = ["`p.requires_grad` says whether a parameter is trained.", "..."]
            solution = "trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)"

            def check_answer(self, trainable, total):
                if trainable > total:
                    raise Incorrect("`trainable` cannot be larger than `total`.")

        q3 = TrainableShare()

    ``check_answer(**values)`` receives one keyword per variable (never the
    placeholder: that is caught before) and returns None when the answer is
    right; it raises or returns ``Incorrect(reason)`` when it is wrong. Call
    learner functions through :meth:`call_learner` so their errors become
    "incorrect". Any other exception is a bug in the exercise.
    """

    variables: list[str] = []
    hints: list[str] = []
    # `solution = "code"` in a subclass is moved to `solution_code` (see below).
    solution_code: str = ""
    title: str = ""  # shown before the feedback, e.g. "Exercise 2"; optional
    correct_message: str = ""  # added after "Correct:", e.g. a one-line takeaway

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Authors declare `solution = "code"`, but learners call `solution()`:
        # move the code to `solution_code` so the method stays callable.
        declared = cls.__dict__.get("solution")
        if isinstance(declared, str):
            cls.solution_code = textwrap.dedent(declared).strip("\n")
            del cls.solution

    def __init__(self) -> None:
        name, variables = type(self).__name__, self.variables
        if isinstance(variables, str) or not variables or not all(
            isinstance(v, str) and v.isidentifier() for v in variables
        ):
            raise TypeError(f"{name}.variables must be a non-empty list of variable names, got {self.variables!r}")
        if isinstance(self.hints, str) or not all(isinstance(h, str) and h.strip() for h in self.hints):
            raise TypeError(f"{name}.hints must be a list of non-empty strings, got {self.hints!r}")
        if not self.solution_code.strip():
            raise TypeError(f"{name}.solution must be a non-empty string of Python code")
        if type(self).check_answer is Exercise.check_answer:
            raise TypeError(f"{name} must define check_answer(self, **values)")
        self.attempts = 0  # check() calls
        self.hints_shown = 0  # highest hint level shown so far
        self.solution_shown = False

    def __repr__(self) -> str:
        return f"<exercise {type(self).__name__}: call .check(), .hint() or .solution()>"

    # ----- the learner's three methods

    def check(self) -> None:
        """Check the learner's answer, read from the notebook, and show the feedback.

        Returns None so a notebook does not show the feedback twice; use
        :meth:`evaluate` to get the :class:`Result`.
        """
        caller = inspect.currentframe().f_back
        try:
            namespace = self._notebook_namespace(caller)
        finally:
            del caller  # frames hold references to every local: drop ours promptly
        self.attempts += 1
        try:
            result = self.evaluate(namespace)
        except Exception as error:  # a check must never stop the learner's notebook
            result = self._check_failed(error)
        if result.outcome is Outcome.CHECK_ERROR and result.exception is not None:
            # The developer needs the traceback; the learner sees the polite message.
            traceback.print_exception(result.exception, file=sys.stderr)
        _show(str(result), result._repr_html_())

    def hint(self, level: int | None = None) -> None:
        """Show the next hint (or hint ``level``, counted from 1); after the last, the last again."""
        count = len(self.hints)
        if level is not None and (isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= max(count, 1)):
            raise ValueError(f"level must be an int from 1 to {count}, got {level!r}")
        if count == 0:
            _show("This exercise has no hints.", _html_box(_COLOURS["hint"], "Hint", "This exercise has no hints."))
            return
        if level is None:
            level = min(self.hints_shown + 1, count)
        self.hints_shown = max(self.hints_shown, level)
        label = f"Hint {level} of {count}"
        text = self.hints[level - 1]
        _show(_plain_text(label, text, self.title), _html_box(_COLOURS["hint"], label, _inline_html(text), self.title))

    def solution(self) -> None:
        """Show the reference solution as highlighted code."""
        self.solution_shown = True
        code = self.solution_code
        text = _plain_text("Solution", "", self.title) + "\n" + textwrap.indent(code, "    ")
        _show(text, _html_box(_COLOURS["solution"], "Solution", _highlighted(code), self.title))

    # ----- for lesson authors and tests

    def evaluate(self, namespace: Mapping[str, object] | None = None, /, **values: object) -> Result:
        """Return the :class:`Result` of checking the answer, without showing anything.

        Values are read from ``namespace`` (a mapping, e.g. a notebook's
        globals) and from keywords, keywords winning.
        """
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
        except Incorrect as signal:
            return self._result(Outcome.INCORRECT, signal.reason, signal.__cause__)
        except NotAttempted as signal:
            return self._result(Outcome.NOT_ATTEMPTED, signal.reason)
        except Exception as error:
            return self._check_failed(error)
        if verdict is None:
            message = "Well done." + (f" {self.correct_message}" if self.correct_message else "")
            return self._result(Outcome.CORRECT, message)
        if isinstance(verdict, Incorrect):
            return self._result(Outcome.INCORRECT, verdict.reason)
        return self._check_failed(
            TypeError(f"{type(self).__name__}.check_answer must return None or Incorrect, got {verdict!r}")
        )

    def check_answer(self, **values: object) -> Incorrect | None:
        """Return None if the answer is right; raise or return ``Incorrect(reason)`` if not."""
        raise NotImplementedError

    def call_learner(self, function: Callable, *args: object, **kwargs: object) -> object:
        """Return ``function(*args, **kwargs)``; if the learner's function raises, raise ``Incorrect``.

        The reason names the exception, its message and the line of the
        learner's code it came from, and tells the learner to read it.
        """
        try:
            return function(*args, **kwargs)
        except Exception as error:
            name = getattr(function, "__name__", "your function")
            where = _learner_line(error, function)
            raise Incorrect(
                f"`{name}` raised {type(error).__name__}: {error}{where}. "
                "Read the last line of that error: it usually says what went wrong."
            ) from error

    # ----- helpers

    def _notebook_namespace(self, caller: types.FrameType) -> Mapping[str, object]:
        """Return the learner's variables: IPython's user namespace, else the calling code's globals."""
        shell = _running_ipython()
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
            f"{type(error).__name__}: {error}. This is a bug in the exercise, not in your answer: "
            "please report it, and compare your answer with `solution()` meanwhile.",
            error,
        )


def _learner_line(error: Exception, function: Callable) -> str:
    """Return ", at `<line>`" for the last line of ``function``'s file in the error's traceback, or ""."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == code.co_filename and f.line]
    return f", at `{frames[-1].line.strip()}`" if frames else ""


def _highlighted(code: str) -> str:
    """Return ``code`` as syntax-highlighted HTML (plain <pre> if Pygments is missing)."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return f"<pre>{html.escape(code)}</pre>"
    return highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))


class ValueExercise(Exercise):
    """An exercise whose answer is a value: a parameter count, a size in MiB, a string.

    Set ``expected`` (for one variable) or a dict ``{variable: expected}`` (for
    several), or override ``expected_values(**values)`` to compute it from the
    notebook's other variables. Numbers match within ``rel_tol``/``abs_tol``;
    ``expected_type`` (optional) requires a type. Override ``diagnose`` to name
    typical mistakes::

        class CountParameters(ValueExercise):
            variables = ["num_params"]
            expected = 65_783_042
            hints = [...]
            solution = "num_params = sum(p.numel() for p in model.parameters())"

            def diagnose(self, name, value, expected):
                if value == expected - 1_536:
                    return "You left out the classifier head."
    """

    expected: object = _MISSING
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    expected_type: type | tuple[type, ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        overrides_expected = type(self).expected_values is not ValueExercise.expected_values
        if self.expected is _MISSING and not overrides_expected:
            raise TypeError(f"{type(self).__name__} must set `expected` or define expected_values(**values)")
        if self.expected is not _MISSING and len(self.variables) > 1 and not overrides_expected:
            if not isinstance(self.expected, Mapping) or set(self.expected) - set(self.variables):
                raise TypeError(
                    f"{type(self).__name__}.expected must be a dict keyed by some of {self.variables} "
                    f"when there are several variables, got {self.expected!r}"
                )

    def expected_values(self, **values: object) -> dict[str, object]:
        """Return ``{variable: expected value}`` for the variables whose value is checked."""
        if len(self.variables) == 1:
            return {self.variables[0]: self.expected}
        return dict(self.expected)

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
            wanted = _type_names(self.expected_type)
            raise Incorrect(f"`{name}` should be {wanted}, but it is {describe_value(value)}.")
        if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
            self._check_number(name, value, expected)
        elif not isinstance(value, type(expected)) and not (
            isinstance(value, (list, tuple)) and isinstance(expected, (list, tuple))
        ):
            raise Incorrect(f"`{name}` should be {_type_names(type(expected))}, but it is {describe_value(value)}.")
        elif not values_match(value, expected, self.rel_tol, self.abs_tol):
            reason = self.diagnose(name, value, expected)
            raise Incorrect(reason or f"`{name}` is {describe_value(value)}, which is not right.")

    def _check_number(self, name: str, value: object, expected: float) -> None:
        number = _as_real_number(value)
        if number is None:
            raise Incorrect(f"`{name}` should be a number, but it is {describe_value(value)}.")
        if values_match(number, expected, self.rel_tol, self.abs_tol):
            return
        reason = self.diagnose(name, value, expected)
        if reason is None and math.isnan(number):
            reason = f"`{name}` is NaN (not a number): something in the computation divided 0 by 0 or overflowed."
        if reason is None:
            slip = _unit_slip(number, expected)
            if slip is not None:
                reason = f"`{name}` is {describe_value(number)}: {slip}"
        if reason is None:
            direction = "too high" if number > expected else "too low"
            reason = f"`{name}` is {describe_value(number)}, which is {direction}."
        raise Incorrect(reason)


def _type_names(types_: type | tuple[type, ...]) -> str:
    names = [t.__name__ for t in (types_ if isinstance(types_, tuple) else (types_,))]
    return " or ".join(f"a {name}" for name in names)


class CodeExercise(Exercise):
    """An exercise where the learner writes a function, checked against a reference.

    ``variables`` names the learner's function (exactly one). ``reference`` is
    the right function (a plain function is fine: it is not bound as a method).
    ``cases()`` returns the inputs to try, each a tuple of positional arguments;
    the reference gets a deep copy, so a function that changes its input (say,
    takes an optimizer step) cannot spoil the comparison. Override ``diagnose``
    to explain typical mistakes::

        class CountTrainable(CodeExercise):
            variables = ["count_trainable"]
            reference = count_trainable_reference
            hints = [...]
            solution = '''
                def count_trainable(model):
                    return sum(p.numel() for p in model.parameters() if p.requires_grad)
            '''

            def cases(self):
                return [(tiny_model(frozen=False),), (tiny_model(frozen=True),)]

            def diagnose(self, got, expected, args):
                if got == count_parameters(args[0]):
                    return "Your count includes frozen parameters (requires_grad=False)."
    """

    reference: Callable | None = None
    rel_tol: float = 1e-6
    abs_tol: float = 0.0

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A function stored on a class becomes a method (self would be passed as
        # its first argument); the reference is a plain function.
        declared = cls.__dict__.get("reference")
        takes_self = isinstance(declared, types.FunctionType) and declared.__code__.co_varnames[:1] == ("self",)
        if isinstance(declared, types.FunctionType) and not takes_self:
            cls.reference = staticmethod(declared)

    def __init__(self) -> None:
        super().__init__()
        name = type(self).__name__
        if len(self.variables) != 1:
            raise TypeError(f"{name}.variables must name exactly one function, got {self.variables!r}")
        if not callable(self.reference):
            raise TypeError(f"{name}.reference must be the reference function, got {self.reference!r}")
        if type(self).cases is CodeExercise.cases:
            raise TypeError(f"{name} must define cases(self), returning tuples of arguments")

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
            if not isinstance(args, tuple):
                raise TypeError(f"{type(self).__name__}.cases() must yield tuples; write ({args!r},) for one argument")
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
        reason = self.diagnose(got, expected, args)
        if reason is None:
            reason = f"{self.describe_case(args)}, `{name}` returned {describe_value(got)}, which is not right."
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
                if got.shape != expected.shape:
                    reason += " Its shape is wrong."
            elif type(got) is not type(expected) and _as_real_number(got) is None:
                reason += f" The result should be {_type_names(type(expected))}."
        raise Incorrect(reason)
