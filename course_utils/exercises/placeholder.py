"""The blank ``____`` a learner replaces with an answer, and how a check recognises it."""

from __future__ import annotations

import types
from collections.abc import Mapping

__all__ = ["____", "PlaceholderError", "contains_placeholder"]


class PlaceholderError(TypeError):
    """Raised when code needs a real value where ``____`` still stands (its truth, an int, a float)."""


_REPLACE_FIRST = "Replace `____` with your answer first: the blank has no {what}."


def _refuse(what: str):
    def refuse(self, *args: object) -> None:
        raise PlaceholderError(_REPLACE_FIRST.format(what=what))

    return refuse


class _Placeholder:
    """The type of ``____``: a blank a learner replaces with an answer.

    It absorbs arithmetic, calls, attributes and indexing and returns itself,
    so an untouched exercise cell still runs and the variable it assigns is
    still recognisable as "not attempted". What it cannot stand for is a
    decision: ``if ____ > 0:`` or ``int(____)`` raises :class:`PlaceholderError`
    ("replace ____ first") instead of silently taking one branch.
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
        # Yield itself once: `sum(____)` and `[p for p in ____]` run and give
        # results that still contain the placeholder.
        yield self

    def __enter__(self) -> _Placeholder:
        return self

    def __exit__(self, *exc_info: object) -> bool:
        return False

    __bool__ = _refuse("truth value (an `if` or `while` cannot decide on it)")
    __int__ = __index__ = _refuse("whole-number value")
    __float__ = _refuse("numeric value")
    __complex__ = _refuse("numeric value")


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
    try:
        if isinstance(value, Mapping):
            return any(
                contains_placeholder(key, _depth + 1) or contains_placeholder(item, _depth + 1)
                for key, item in value.items()
            )
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(contains_placeholder(item, _depth + 1) for item in value)
    except Exception:  # a learner's container that cannot be read holds no blank we can see
        return False
    return False
