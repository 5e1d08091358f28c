"""Value matching: read a learner's value as a number, compare it with the expected one, describe it in a message.

Everything here is total: a value whose ``__eq__``, ``__bool__`` or ``__float__``
raises, a huge int or an empty array is "not a match" (or described as what it
is), never an exception.
"""

from __future__ import annotations

import math
import numbers
import reprlib
import sys
import types
from collections.abc import Mapping

__all__ = ["a_or_an", "as_number", "describe_value", "type_names", "unit_slip", "values_match"]

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxtuple = _short.maxset = _short.maxdict = 6

# Relative rounding a learner's number carries when it was computed in a low precision:
# about 8 units in the last place, so a few float32 operations still match.
_PRECISION_OF = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def a_or_an(word: str) -> str:
    """Return ``word`` with its article: "an int", "a float", "a uint8"."""
    lowered = word.lower()
    # "ndarray" is read letter by letter (en-dee), "uint8" with a "you".
    vowel_sound = lowered[:1] in "aeio" or lowered.startswith("nd") or (
        lowered[:1] == "u" and not lowered.startswith(("uni", "uint", "use"))
    )
    return f"{'an' if vowel_sound and lowered else 'a'} {word}"


def type_names(types_: type | tuple[type, ...]) -> str:
    """Return "an int or a float" for ``(int, float)``."""
    names = [t.__name__ for t in (types_ if isinstance(types_, tuple) else (types_,))]
    return " or ".join(a_or_an(name) for name in names)


def _dtype_name(value: object) -> str:
    dtype = getattr(value, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else ""


def as_number(value: object) -> tuple[int | float, float] | None:
    """Return ``(value as a Python int or float, its relative precision)``, or None if it is not one real number.

    Python and NumPy numbers, 0-d or one-element tensors and arrays count;
    bools, strings, empty or multi-element arrays and anything that fails to
    convert do not. The precision is 0 for exact values, about 1e-6 for float32.
    """
    try:
        if isinstance(value, (bool, str, bytes)) or type(value).__name__ == "bool_":
            return None
        precision = _PRECISION_OF.get(_dtype_name(value), 0.0)
        if isinstance(value, numbers.Integral):
            return int(value), 0.0
        if isinstance(value, numbers.Real):
            return float(value), precision
        item = getattr(value, "item", None)
        size = getattr(value, "numel", None) or getattr(value, "size", None)
        size = size() if callable(size) else size
        if callable(item) and isinstance(size, int) and size == 1:
            number = as_number(item())
            return None if number is None else (number[0], max(precision, number[1]))
    except Exception:  # a meta tensor, or an object whose conversions raise
        return None
    return None


def _numbers_match(got: object, expected: float, rel_tol: float, abs_tol: float) -> bool:
    number = as_number(got)
    if number is None:
        return False
    value, precision = number
    if isinstance(value, int) and isinstance(expected, int) and rel_tol == 0 and abs_tol == 0:
        return value == expected
    try:
        if math.isnan(expected) or math.isnan(value):
            return math.isnan(expected) and math.isnan(value)
        return math.isclose(value, expected, rel_tol=max(rel_tol, precision), abs_tol=abs_tol)
    except OverflowError:  # an int too large for a float is no float's match
        return False


def values_match(got: object, expected: object, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """Return True if ``got`` equals ``expected``: numbers within tolerance, tensors elementwise.

    A number computed in float32 (or lower) is allowed its own rounding on top
    of ``rel_tol``. Lists and tuples match element by element (a list may stand
    for a tuple), dicts key by key. Anything else is compared with ``==``; a
    comparison that raises counts as a mismatch.
    """
    try:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(expected, torch.Tensor):
            if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                return False
            if "meta" in (got.device.type, expected.device.type):
                return False
            return bool(torch.allclose(got.to(expected.dtype), expected, rtol=rel_tol, atol=abs_tol, equal_nan=True))
        if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
            return _numbers_match(got, expected, rel_tol, abs_tol)
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
        equal = got == expected
        # NumPy answers `==` with its own bool; an array of answers is no match.
        return bool(equal) if type(equal).__name__ in ("bool", "bool_") else False
    except Exception:  # e.g. an __eq__ that raises, or an array whose truth is ambiguous
        return False


def describe_value(value: object) -> str:
    """Return a short description of a learner's value for a message: ``65,783,042``, ``a list `[1, 2]` ``."""
    try:
        return _describe(value)
    except Exception:  # a repr that raises
        return a_or_an(f"`{type(value).__name__}` object")


def _describe(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return f"`{value!r}`"
    if isinstance(value, numbers.Integral):
        number = int(value)
        if abs(number) >= 10**18:
            digits = int(abs(number).bit_length() * math.log10(2)) + 1
            return f"an integer of about {digits:,} digits"
        return f"{number:,}"
    if isinstance(value, float):
        # Thousands separators make big figures readable: 263,132,168.0
        return format(value, ",") if math.isfinite(value) and abs(value) < 1e16 else repr(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if value.numel() == 0:
            return f"an empty tensor (shape {shape})"
        if value.numel() <= 6 and value.device.type != "meta":
            return f"`tensor({value.tolist()!r})`"
        return f"a tensor of shape {shape} ({value.dtype})"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.size == 0:
            return f"an empty NumPy array (shape {value.shape})"
        if value.size <= 6:
            return f"a NumPy array `{value.tolist()!r}`"
        return f"a NumPy array of shape {value.shape} ({value.dtype})"
    if isinstance(value, numbers.Real):  # a NumPy float
        return f"{float(value):,}"
    if isinstance(value, types.FunctionType):
        return f"the function `{value.__name__}`"
    return f"{a_or_an(type(value).__name__)} `{_short.repr(value)}`"


# Binary and decimal units of memory, by their size in bytes.
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "kB": 10**3, "MB": 10**6, "GB": 10**9}


def unit_slip(value: float, expected: float, unit: str | None = None) -> str | None:
    """Return a sentence naming a unit mix-up if ``value`` is ``expected`` in another unit, else None.

    With ``unit`` (the unit asked for, one of bytes, KiB, MiB, GiB, TiB, kB, MB,
    GB), the sentence names the unit the learner's value is in; without it,
    only the factor.
    """
    try:
        if expected == 0 or value == 0 or not math.isfinite(value):
            return None
        ratio = value / expected
    except (OverflowError, ZeroDivisionError, TypeError):
        return None
    if unit in _UNITS:
        for other, size in _UNITS.items():
            if other != unit and math.isclose(ratio, _UNITS[unit] / size, rel_tol=2e-4):
                return f"that is the amount in {other}, but {unit} were asked. Check the unit."
        return None
    for factor, text in ((2**10, "1,024"), (2**20, "2**20"), (2**30, "2**30"), (1000, "1,000"), (10**6, "10**6"),
                         (10**9, "10**9"), (2**20 / 10**6, "2**20 / 10**6"), (2**30 / 10**9, "2**30 / 10**9")):
        for size, candidate in (("large", factor), ("small", 1 / factor)):
            if math.isclose(ratio, candidate, rel_tol=2e-4):
                return f"that is {text} times too {size}, a unit mix-up? Check the unit."
    return None
