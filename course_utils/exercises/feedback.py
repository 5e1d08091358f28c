"""What a check concludes, and how the notebook shows it: Markdown that Jupyter renders, plain text elsewhere."""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field

__all__ = ["Incorrect", "Note", "NotAttempted", "Outcome", "Result", "incorrect", "show"]


class Outcome(enum.Enum):
    """What a check concluded. The value is the label a learner reads."""

    NOT_ATTEMPTED = "Not attempted yet"
    INCORRECT = "Incorrect"
    CORRECT = "Correct"
    CHECK_ERROR = "The check itself failed"  # a bug in the exercise, not the learner's fault


# The label's colour for each kind of feedback.
COLOURS = {
    Outcome.NOT_ATTEMPTED: "#b35c00",
    Outcome.INCORRECT: "#c62828",
    Outcome.CORRECT: "#2e7d32",
    Outcome.CHECK_ERROR: "#6a1b9a",
    "hint": "#1565c0",
    "solution": "#455a64",
}


@dataclass(frozen=True)
class Note:
    """One piece of feedback: a coloured label, then Markdown text (a reason, a hint, a fenced solution)."""

    label: str
    text: str
    title: str = ""
    colour: str = "#455a64"

    def __str__(self) -> str:
        prefix = f"[{self.title}] " if self.title else ""
        return f"{prefix}{self.label}:" + (f" {self.text}" if self.text else "")

    def _repr_markdown_(self) -> str:
        prefix = f"{self.title}: " if self.title else ""
        # Markdown inside an inline <span> is still Markdown: the label is bold and coloured.
        return f'<span style="color:{self.colour}">**{prefix}{self.label}:**</span> {self.text}'

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))


@dataclass(frozen=True)
class Result:
    """The outcome of one check and the message (Markdown) a learner reads.

    ``exception`` is the error behind a ``CHECK_ERROR`` (or the learner's error
    behind an ``INCORRECT``), kept for tests; it is never shown whole.
    """

    outcome: Outcome
    message: str
    title: str = ""
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def note(self) -> Note:
        return Note(self.outcome.value, self.message, self.title, COLOURS[self.outcome])

    def __str__(self) -> str:
        return str(self.note())

    def _repr_markdown_(self) -> str:
        return self.note()._repr_markdown_()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))


class Incorrect(Exception):
    """Raise (or return) this from check logic: the answer is wrong, for ``reason`` (Markdown).

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


def running_ipython():
    """Return the running IPython shell, or None outside IPython (plain Python, pytest)."""
    # Only look if IPython is already imported: importing it would not start a shell anyway.
    ipython_module = sys.modules.get("IPython")
    return ipython_module.get_ipython() if ipython_module is not None else None


def show(feedback: Note | Result) -> None:
    """Show feedback: rendered Markdown in Jupyter, plain text in a terminal or outside IPython."""
    if not isinstance(feedback, (Note, Result)):
        raise TypeError(f"feedback must be a Note or a Result, got {type(feedback).__name__}")
    if running_ipython() is None:
        print(feedback)
        return
    from IPython.display import display

    display(feedback)
