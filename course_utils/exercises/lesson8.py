"""Exercises of lesson 8: speed.

- ``q1``: the padding waste of a loader, over all its batches
- ``q2``: the fastest set-up that fits a memory budget, from measured timings and planned peaks

Both are functions, run on inputs the check builds, each chosen so that a
classic mistake gives another result (the lesson then runs the learner's
function on its own measurements). Each known mistake is computed, and an
answer that gives the same wrong result gets that mistake's explanation. The
learner's function gets a copy of each input; one that changes its input is
told so, whatever it returns. q2's set-ups are drawn afresh at every check
(order, token counts, times and peaks), so no order or size carries the answer.
"""

from __future__ import annotations

import copy
import math
import random

import torch

from course_utils import padding
from course_utils.validation import check_non_negative_int
from course_utils.exercises.core import CodeExercise, Incorrect, describe_value
from course_utils.speed import Timing
from course_utils.units import MIB

# --------------------------------------------------------------------------- both: the learner's function leaves its inputs alone


def _same(a, b) -> bool:
    """Whether two inputs are equal all the way down (tensors by value, dicts by keys and values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


class _LeavesItsInputsAlone(CodeExercise):
    """A function exercise whose learner's function gets a copy of each input, and must not change it."""

    inputs_name = "its input"

    def answers(self, **values: object) -> list[tuple[tuple, object]]:
        """Return (the case's arguments, the learner's result on a copy of them) for every case.

        Raises ``Incorrect`` when the answer is no function, or when the function changed the copy it was given.
        """
        (name,) = self.variables
        function = values[name]
        if not callable(function):
            raise Incorrect(f"`{name}` should be a function (`def {name}(...):`), but it is {describe_value(function)}.")
        results = []
        for args in self.cases():
            given = copy.deepcopy(args)
            results.append((args, self.call_learner(function, *given)))
            if not _same(given, args):
                raise Incorrect(f"{self.describe_case(args)}, `{name}` changed {self.inputs_name} it was given "
                                "(a value, a key or an entry, in place). A function that measures or chooses must "
                                "leave its input as it found it: the lesson still needs it.")
        return results

    def check_answer(self, **values: object) -> None:
        for args, got in self.answers(**values):
            self.compare(self.variables[0], got, self.reference(*args), args)


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


class PaddingWaste(_LeavesItsInputsAlone):
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
    inputs_name = "the batches"

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
        if isinstance(got, str):
            return (f"{self.describe_case(args)}, `padding_waste` returned the text {got!r}: return the number itself "
                    "(a float), not a string made from it.")
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
        token_ids = {int(i) for b in batches for i in b["input_ids"].unique()}
        guessed = [token for token in sorted(token_ids - pad_ids) if close(value, _waste_from_pad_ids(batches, token))]
        if guessed or (value == 0 and expected > 0):
            counted = f"the positions whose token id is {guessed[0]}" if guessed else "no padding at all"
            return (f"{self.describe_case(args)}, your function counted {counted}: it guessed a pad id, and these "
                    "batches pad with another (each tokenizer has its own, and a loader can pad with anything). Do not "
                    "guess it: the attention mask says which positions are padding (0) and which are real (1).")
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
        "You took the first set-up that fits; the order of the set-ups says nothing about their speed (the check "
        "shuffles them): compare the tokens per second of every set-up that fits.":
            fits[0] if fits else None,
        "You chose the most tokens per step; a step that does more tokens can take longer per token: compare "
        "tokens per second (tokens per step / median time).":
            best(fits, lambda n: (setups[n][1], -setups[n][0].median)),
        "You chose by time per step; the set-ups process different numbers of tokens per step: compare tokens "
        "per second (tokens per step / median time).":
            best(fits, lambda n: -setups[n][0].median),
        "You chose by the fastest run; the question asks for the median, which one lucky run does not move.":
            best(fits, lambda n: setups[n][1] / setups[n][0].minimum),
        "You chose the set-up with the least memory; among those that fit, the fastest is wanted.":
            best(fits, lambda n: -setups[n][2]),
    }


def _draw_setups(rng: random.Random) -> dict[str, tuple[Timing, int, int]]:
    """Six set-ups in a random order with random tokens per step, times (one lucky fast run each) and peaks."""
    letters = rng.sample("ABCDEFGHJKLMNPQRSTUVWXYZ", 6)
    setups = {}
    for letter in letters:
        median_ms = rng.uniform(10, 200)
        runs = [median_ms * rng.uniform(0.97, 1.05) for _ in range(4)] + [median_ms * rng.uniform(0.3, 0.8)]
        rng.shuffle(runs)
        setups[f"set-up {letter}"] = (_timing(*runs), rng.choice([8, 16, 32, 64]) * 128, rng.randrange(100, 1000) * MIB)
    return setups


def _budgets(setups, rng: random.Random) -> list[int]:
    """Budgets for one candidate set: all fit, one exactly at a peak, two between peaks, none fits."""
    peaks = sorted({peak for _, _, peak in setups.values()})
    between = [(low + high) // 2 for low, high in zip(peaks, peaks[1:])]
    return [peaks[-1] + MIB, rng.choice(peaks[1:]), *rng.sample(between, 2), peaks[0] - MIB]


def _fingerprints(cases) -> dict[str, tuple]:
    """Each mistake's answers over all ``cases``, and the reference's (under the key ``None``)."""
    answers = [_wrong_answers(setups, budget) for setups, budget in cases]
    prints = {reason: tuple(wrong[reason] for wrong in answers) for reason in answers[0]}
    prints[None] = tuple(fastest_that_fits_reference(setups, budget) for setups, budget in cases)
    return prints


def draw_cases(seed: int) -> list[tuple[dict, int]]:
    """Two candidate sets of six set-ups, five budgets each, drawn with ``seed`` until every mistake is told apart.

    Told apart: over all the cases, each mistake's answers differ from the right ones and from every other mistake's.
    """
    check_non_negative_int(seed, "seed")
    rng = random.Random(seed)
    while True:
        cases = [(setups, budget) for setups in (_draw_setups(rng), _draw_setups(rng)) for budget in _budgets(setups, rng)]
        if len(set(_fingerprints(cases).values())) == len(_wrong_answers(*cases[0])) + 1:
            return cases


class FastestThatFits(_LeavesItsInputsAlone):
    title = "Exercise 2"
    variables = ["fastest_that_fits"]
    inputs_name = "the set-ups"
    #: The seed of the set-ups the next check draws; None: a new one at every check (tests fix it).
    seed: int | None = None
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
        return draw_cases(random.randrange(2**32) if self.seed is None else self.seed)

    def check_answer(self, **values: object) -> None:
        """Run every case, then name the mistake whose answers are the learner's on all of them (if one is)."""
        results = self.answers(**values)
        cases, answers = [args for args, _ in results], tuple(got for _, got in results)
        fingerprints = _fingerprints(cases)
        names_only = all(isinstance(answer, str) or answer is None for answer in answers)  # never == on odd objects
        for args, got, expected in zip(cases, answers, fingerprints[None]):
            if names_only and got != expected:
                reason = next((reason for reason, answers_of in fingerprints.items()
                               if reason is not None and answers_of == answers), None)
                if reason is not None:
                    raise Incorrect(f"{self.describe_case(args)}, `{self.variables[0]}` returned {got!r}. {reason}")
            self.compare(self.variables[0], got, expected, args)

    def reference(self, setups, budget_bytes):
        return fastest_that_fits_reference(setups, budget_bytes)

    def describe_case(self, args):
        setups, budget = args
        return f"With a budget of {budget / MIB:,.0f} MiB and the set-ups {', '.join(repr(n) for n in setups)}"

    def compare(self, name, got, expected, args):
        if expected is None and got is not None:
            raise Incorrect(f"{self.describe_case(args)}, no set-up fits, so `{name}` should return None; "
                            f"it returned {describe_value(got)}.")
        return super().compare(name, got, expected, args)

    def diagnose(self, got, expected, args):
        if isinstance(got, str) and got not in args[0]:
            return f"{self.describe_case(args)}, `fastest_that_fits` returned {got!r}, which is not one of the set-ups' names."
        return None


q1 = PaddingWaste()
q2 = FastestThatFits()
