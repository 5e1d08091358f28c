"""Checks for values that come from a learner or a user (exercise answers, data loading, estimators).

Each check raises a ``ValueError`` or ``TypeError`` whose message names the
argument and says what was expected, and returns nothing. Validation sits
where outside values come in, once per path. Functions that a lesson displays
stay as plain as the lesson shows them: their callers check, or, where the
displayed function is itself what a user calls (``adamw.adamw_step``), one line
does. ``tests/validation/test_bad_input.py`` holds every public function to this.

``bool`` is an ``int`` in Python, but ``batch_size=True`` is a mistake, not a 1:
every integer check here refuses it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from pathlib import Path


def is_integer(value: object) -> bool:
    """True for Python and NumPy integers (not ``bool``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real_number(value: object) -> bool:
    """True for Python and NumPy integers and floats (not ``bool``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(value: object, name: str) -> None:
    """``value`` is a whole number at least 1."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_non_negative_int(value: object, name: str) -> None:
    """``value`` is a whole number at least 0."""
    if not is_integer(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def check_int_in_range(value: object, name: str, low: int, high: int) -> None:
    """``value`` is a whole number from ``low`` to ``high``, both included."""
    if not is_integer(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an int from {low} to {high}, got {value!r}")


def check_bool(value: object, name: str) -> None:
    """``value`` is ``True`` or ``False`` (not a string such as ``"yes"``, not 0 or 1)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_positive_number(value: object, name: str) -> None:
    """``value`` is a finite real number above 0."""
    if not is_real_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def check_non_negative_number(value: object, name: str) -> None:
    """``value`` is a finite real number at least 0."""
    if not is_real_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


def check_fraction(value: object, name: str, *, inclusive_high: bool = False) -> None:
    """``value`` is a real number in [0, 1) (or [0, 1] with ``inclusive_high``)."""
    ok = is_real_number(value) and 0 <= value and (value <= 1 if inclusive_high else value < 1)
    if not ok:
        interval = "[0, 1]" if inclusive_high else "[0, 1)"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


def check_finite_numbers(values: object, name: str, *, non_negative: bool = False) -> None:
    """``values`` is a non-empty list or tuple of finite real numbers (each at least 0 with ``non_negative``)."""
    ok = isinstance(values, (list, tuple)) and len(values) > 0 and all(
        is_real_number(value) and math.isfinite(value) and (value >= 0 or not non_negative) for value in values
    )
    if not ok:
        kind = "non-negative numbers" if non_negative else "numbers"
        raise ValueError(f"{name} must be a non-empty list of finite {kind}, got {_short(values)}")


def check_finite_tensor(value: object, name: str) -> None:
    """``value`` is a ``torch.Tensor`` with no NaN or infinity in it (a tensor on the meta device has no values to check)."""
    import torch  # here, not at the top: the other checks serve modules that never import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type != "meta" and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must hold finite values; it holds NaN or infinity")


def check_choice(value: object, name: str, choices: Collection[object]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_instance(value: object, name: str, expected: type | tuple[type, ...], description: str) -> None:
    """``value`` is an instance of ``expected``; ``description`` says what that is in words ("a torch.nn.Module")."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {description}, got {type(value).__name__}")


def check_python_function(value: object, name: str) -> None:
    """``value`` is a function written in Python (``def``), whose source can be read."""
    import inspect

    if not inspect.isfunction(value):
        raise TypeError(f"{name} must be a Python function (written with def), got {_short(value)}")


def check_accelerator(value: object, name: str = "accelerator") -> None:
    """``value`` looks like an ``accelerate.Accelerator``: it tells its group size and mode.

    Read by attribute, not by type, so that a test can pass a stand-in.
    """
    if not all(hasattr(value, attribute) for attribute in ("num_processes", "distributed_type")):
        raise TypeError(f"{name} must be an accelerate.Accelerator, got {type(value).__name__}")


def check_existing_directory(path: object, name: str, must_contain: str | None = None) -> Path:
    """``path`` (str or Path) is a directory on disk, holding ``must_contain`` if given; return it as a Path.

    Catches a mistyped local path before a library mistakes it for a hub name
    (transformers answers a missing folder with "Repo id must use alphanumeric chars").
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"{name} must be a path (str or pathlib.Path), got {type(path).__name__}")
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"{name}: no directory {str(path)!r} (the course loads from local folders only, e.g. data/)")
    if must_contain is not None and not (directory / must_contain).exists():
        raise FileNotFoundError(f"{name}: {str(path)!r} has no {must_contain}")
    return directory


def check_in_launch(name: str) -> None:
    """This process is one of a launch's (``launcher.launch``, ``accelerate launch``), which sets ``RANK`` and ``WORLD_SIZE``.

    ``name`` is the function that needs it; outside a launch torch's rendezvous would fail with its own message.
    """
    import os

    missing = [variable for variable in ("RANK", "WORLD_SIZE") if variable not in os.environ]
    if missing:
        raise RuntimeError(f"{name} runs in a launched process (course_utils.launcher.launch runs it in each), "
                           f"not here: {' and '.join(missing)} not set")


def check_in_process_group(name: str) -> None:
    """This launched process has joined its launch's process group (inside ``sharding.gloo_group()``).

    ``name`` is the function that needs it; outside a group torch would fail at the first collective with its own message.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(f"{name} runs in a launched process, inside sharding.gloo_group()")


def check_token_ids(sequences: object, name: str) -> None:
    """``sequences`` is a non-empty list of non-empty lists of token ids (ints at least 0)."""
    if not isinstance(sequences, (list, tuple)) or not sequences:
        raise ValueError(f"{name} must be a non-empty list of token-id lists, got {_short(sequences)}")
    for index, sequence in enumerate(sequences):
        if not isinstance(sequence, (list, tuple)) or not sequence or not all(
            is_integer(token) and token >= 0 for token in sequence
        ):
            raise ValueError(f"{name}[{index}] must be a non-empty list of token ids (ints from 0), got {_short(sequence)}")


def _short(value: object) -> str:
    """``repr(value)``, cut to 80 characters: a message names a bad list without printing all of it."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
