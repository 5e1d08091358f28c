"""Exercises of lesson 8: speed.

- ``q1``: the padding waste of a loader, over all its batches
- ``q2``: the fastest set-up that fits a memory budget, from measured timings and planned peaks

Both are functions, run on inputs the check builds, each chosen so that a
classic mistake gives another result (the lesson then runs the learner's
function on its own measurements). Each known mistake is computed, and an
answer that gives the same wrong result gets that mistake's explanation.
"""

from __future__ import annotations

import math

import torch

from course_utils import padding
from course_utils.exercises.core import CodeExercise, describe_value
from course_utils.speed import Timing
from course_utils.units import MIB

# --------------------------------------------------------------------------- q1: padding waste


def _loader(lengths: list[int], batch_size: int, pad_id: int, first_token: int) -> list[dict[str, torch.Tensor]]:
    """Batches of sequences of ``lengths``, dynamically padded with ``pad_id``; every sequence starts with ``first_token``."""
    sequences = [[first_token] + [5 + (i + j) % 40 for j in range(length - 1)] for i, length in enumerate(lengths)]
    return padding.pad_dynamically(sequences, batch_size=batch_size, pad_id=pad_id)


def _waste(batches) -> float:
    return padding.padding_stats(batches).waste


def _mean_of_batch_wastes(batches) -> float:
    return sum(padding.padding_stats([batch]).waste for batch in batches) / len(batches)


def _waste_from_pad_ids(batches, pad_id: int = 0) -> float:
    padded = sum(int((batch["input_ids"] == pad_id).sum()) for batch in batches)
    return padded / sum(batch["input_ids"].numel() for batch in batches)


class PaddingWaste(CodeExercise):
    title = "Exercise 1"
    variables = ["padding_waste"]
    rel_tol = 1e-9
    abs_tol = 1e-12
    hints = [
        "The attention mask says which positions are real tokens (1) and which are padding (0); "
        "every position of the batch is processed.",
        "Add up over all the batches first: the real tokens (`batch['attention_mask'].sum()`) and the "
        "positions (`batch['attention_mask'].numel()`); then take the share that is padding.",
    ]
    solution_code = """
        def padding_waste(batches):
            real = processed = 0
            for batch in batches:
                real += int(batch["attention_mask"].sum())
                processed += batch["attention_mask"].numel()
            return 1 - real / processed
    """
    correct_message = "That is the share of the work a loader spends on padding: section 2's first table."

    def cases(self):
        # Batches of different sizes and paddings (so a mean of per-batch shares differs from the share of all
        # tokens), a pad id that is not 0, and real tokens with id 0 (so counting pad ids differs from the mask).
        return [
            (_loader([12, 3, 7, 30, 5, 9, 14], batch_size=3, pad_id=0, first_token=1),),
            (_loader([4, 40, 6, 8, 8, 2, 33, 21, 17], batch_size=4, pad_id=3, first_token=0),),
            (_loader([10, 10, 10, 10], batch_size=2, pad_id=0, first_token=1),),
        ]

    def reference(self, batches):
        return _waste(batches)

    def describe_case(self, args):
        batches = args[0]
        return f"With {len(batches)} batches of shapes {', '.join(str(tuple(b['input_ids'].shape)) for b in batches)}"

    def diagnose(self, got, expected, args):
        value = float(got.detach()) if isinstance(got, torch.Tensor) else float(got)
        if math.isnan(value):
            return f"{self.describe_case(args)}, `padding_waste` returned NaN: did something divide 0 by 0?"
        batches = args[0]
        close = lambda a, b: abs(a - b) <= 1e-6  # noqa: E731  (float32 sums round at about 1e-7)
        if close(value, 1 - expected):
            return (f"{self.describe_case(args)}, your function returns the share of *real* tokens; "
                    "the waste is the share of padding.")
        if close(value, 100 * expected):
            return f"{self.describe_case(args)}, your result is a percentage: return a fraction between 0 and 1."
        if close(value, _mean_of_batch_wastes(batches)):
            return (f"{self.describe_case(args)}, your result is the mean of each batch's share of padding; batches "
                    "of different sizes weigh differently: add up the tokens over all batches first.")
        pad_ids = {int(b["input_ids"][m == 0][0]) for b in batches for m in [b["attention_mask"]] if (m == 0).any()}
        if any(close(value, _waste_from_pad_ids(batches, pad_id)) for pad_id in pad_ids | {0}):
            return (f"{self.describe_case(args)}, your count of padding tokens is off: you looked for the pad id in "
                    "`input_ids`, but a real token can have that id too. The attention mask says which positions are padding.")
        return None


# --------------------------------------------------------------------------- q2: the fastest set-up that fits


def _timing(*milliseconds: float) -> Timing:
    return Timing(tuple(ms / 1e3 for ms in milliseconds))


def _tokens_per_second(entry) -> float:
    timing, tokens, _ = entry
    return tokens / timing.median


def fastest_that_fits_reference(setups, budget_bytes):
    """Return the name of the set-up with the highest median tokens/s whose peak fits ``budget_bytes``, or None."""
    fitting = {name: _tokens_per_second(entry) for name, entry in setups.items() if entry[2] <= budget_bytes}
    return max(fitting, key=fitting.get) if fitting else None


def _wrong_answers(setups, budget_bytes) -> dict[str, object]:
    """The result of each classic mistake, by the explanation it deserves."""
    names = list(setups)
    fits = [name for name in names if setups[name][2] <= budget_bytes]
    strictly = [name for name in names if setups[name][2] < budget_bytes]
    best = lambda pool, key: max(pool, key=key) if pool else None  # noqa: E731
    return {
        "The fastest set-up does not fit in the budget: keep only those whose peak is at most `budget_bytes`.":
            best(names, lambda n: _tokens_per_second(setups[n])),
        "A peak exactly equal to the budget fits: compare with `<=`.":
            best(strictly, lambda n: _tokens_per_second(setups[n])),
        "You chose by time per step; the set-ups process different numbers of tokens per step: compare tokens "
        "per second (tokens per step / median time).":
            best(fits, lambda n: -setups[n][0].median),
        "You chose by the fastest run; the question asks for the median, which one lucky run does not move.":
            best(fits, lambda n: setups[n][1] / setups[n][0].minimum),
        "You chose the set-up with the least memory; among those that fit, the fastest is wanted.":
            best(fits, lambda n: -setups[n][2]),
    }


class FastestThatFits(CodeExercise):
    title = "Exercise 2"
    variables = ["fastest_that_fits"]
    hints = [
        "First keep the set-ups whose peak (the third item) is at most `budget_bytes`.",
        "Among them, tokens per second is `tokens_per_step / timing.median`; return the name with the most, "
        "or `None` when no set-up fits.",
    ]
    solution_code = """
        def fastest_that_fits(setups, budget_bytes):
            fitting = {name: tokens / timing.median for name, (timing, tokens, peak) in setups.items() if peak <= budget_bytes}
            return max(fitting, key=fitting.get) if fitting else None
    """
    correct_message = "Measured speed, planned memory, one decision: the one a training run starts with."

    def cases(self):
        setups = {
            "batch 64": (_timing(80, 82, 95, 81, 84), 64 * 128, 900 * MIB),
            "batch 32": (_timing(45, 44, 46, 20, 47), 32 * 128, 500 * MIB),
            "batch 32, checkpointing": (_timing(60, 61, 59, 62, 60), 32 * 128, 300 * MIB),
            "4 x 8 accumulated": (_timing(70, 72, 71, 69, 73), 32 * 128, 260 * MIB),
            "batch 8": (_timing(15, 16, 15, 17, 16), 8 * 128, 200 * MIB),
            "batch 4, checkpointing": (_timing(30, 31, 29, 30, 32), 4 * 128, 150 * MIB),
        }
        return [
            (setups, 1000 * MIB),   # everything fits: the fastest per token
            (setups, 600 * MIB),    # the fastest does not fit
            (setups, 500 * MIB),    # the best fits exactly at the budget
            (setups, 310 * MIB),    # time per step and tokens per second disagree
            (setups, 100 * MIB),    # nothing fits
        ]

    def reference(self, setups, budget_bytes):
        return fastest_that_fits_reference(setups, budget_bytes)

    def describe_case(self, args):
        setups, budget = args
        return f"With a budget of {budget / MIB:,.0f} MiB and the set-ups {', '.join(repr(n) for n in setups)}"

    def compare(self, name, got, expected, args):
        if expected is None and got is not None:
            from course_utils.exercises.core import Incorrect

            raise Incorrect(f"{self.describe_case(args)}, no set-up fits, so `{name}` should return None; "
                            f"it returned {describe_value(got)}.")
        return super().compare(name, got, expected, args)

    def diagnose(self, got, expected, args):
        for reason, wrong in _wrong_answers(*args).items():
            if wrong is not None and got == wrong and wrong != expected:
                return f"{self.describe_case(args)}, `fastest_that_fits` returned {got!r}. {reason}"
        if isinstance(got, str) and got not in args[0]:
            return f"{self.describe_case(args)}, `fastest_that_fits` returned {got!r}, which is not one of the set-ups' names."
        return None


q1 = PaddingWaste()
q2 = FastestThatFits()
