"""Exercises of lesson 4: data parallelism with Accelerate, on several processes.

- ``q1``: how many batches each of N processes takes from a dataloader of M batches
- ``q2``: fix a launched function whose workers silently train alone
- ``q3``: an accuracy over every process's predictions, with ``gather_for_metrics``

The checks of ``q2`` and ``q3`` launch the learner's function on two processes
(about two seconds each), so they need what any launch needs: no
``Accelerator`` and no bitsandbytes in the notebook's own process.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader

from course_utils import parallel
from course_utils.validation import check_accelerator
from course_utils.exercises.core import CodeExercise, Exercise, Incorrect, as_number, describe_value

NUM_PROCESSES = 2


# --------------------------------------------------------------------------- q1


class BatchesPerProcess(CodeExercise):
    title = "Exercise 1"
    variables = ["batches_per_process"]
    def reference(self, num_batches, num_processes):
        return parallel.batches_per_process(num_batches, num_processes)

    hints = [
        "Each process takes every N-th batch: process 0 takes batches 0, N, 2N, ..., process 1 takes 1, N+1, ...",
        "When M is not a multiple of N, Accelerate completes the last round with examples from the start of the data, "
        "so that every process takes the same number of steps.",
        "That is M / N rounded *up*: `math.ceil(num_batches / num_processes)`.",
    ]
    solution_code = """
        def batches_per_process(num_batches, num_processes):
            return math.ceil(num_batches / num_processes)
    """
    correct_message = (
        "Every process takes the same number of steps, so none waits at the gradient average for a partner that "
        "has finished."
    )

    def cases(self):
        return [(10, 2), (11, 2), (7, 4), (3, 4), (100, 8)]

    def describe_case(self, args):
        return f"for {args[0]} batches on {args[1]} processes"

    def diagnose(self, got, expected, args):
        num_batches, num_processes = args
        if isinstance(got, float) and not math.isfinite(got):
            return (
                f"`batches_per_process` returned {got} {self.describe_case(args)}: not a number of batches. "
                "A division by zero or an overflow?"
            )
        if isinstance(got, float) and not float(got).is_integer():
            return (
                f"`batches_per_process` returned {got} {self.describe_case(args)}: a process takes a whole number "
                "of batches. What happens to the batches left over?"
            )
        if got == num_batches // num_processes:
            return (
                f"That rounds down {self.describe_case(args)}: the left-over batches would be dropped. Accelerate "
                "keeps them and completes the last round instead, so that every process takes the same number of steps."
            )
        if got == num_batches:
            return (
                "That is every batch of the dataloader: a process takes them all only when it trains alone. In a "
                "group, each process takes its own share."
            )
        if got == num_batches * num_processes:
            return "Each process takes a *share* of the batches, not N times as many: divide, do not multiply."
        return None


# --------------------------------------------------------------------------- q2

DATASET_SIZE, BATCH_SIZE = 40, 4  # 10 batches: 5 per process on 2 processes


def describe_accelerator(accelerator, dataloader) -> dict:
    """Return what a worker of exercise 2 reports: its group size, mode and number of batches."""
    check_accelerator(accelerator)
    return {
        "num_processes": accelerator.num_processes,
        "mode": accelerator.distributed_type.value,
        "num_batches": len(dataloader),
    }


def _count_in_worker(count_my_batches):
    """What each worker of exercise 2 runs: the learner's function, and what really happened in this process.

    Returns ``(the learner's report, evidence)``; the evidence says which keywords
    each ``Accelerator`` was created with and what its process group and
    prepared dataloaders really are, so a report typed by hand shows.
    """
    from unittest import mock

    from accelerate import Accelerator

    keywords, accelerators = [], []
    original_init = Accelerator.__init__

    def recording_init(accelerator, *args, **kwargs):
        keywords.append(sorted(kwargs))
        accelerators.append(accelerator)  # kept alive: the learner's function drops its own when it returns
        original_init(accelerator, *args, **kwargs)

    with mock.patch.object(Accelerator, "__init__", recording_init):
        report = count_my_batches()
    evidence = {
        "keywords": keywords,
        "group_sizes": [accelerator.num_processes for accelerator in accelerators],
        "split_batches": [accelerator.split_batches for accelerator in accelerators],
        "prepared_lengths": [len(loader) for accelerator in accelerators for loader in accelerator._dataloaders],
    }
    return report, evidence


_IGNORED_SPLIT_BATCHES = (
    "`Accelerator(split_batches=True)` is ignored in accelerate 1.15 (the keyword is never read); the setting is "
    "`Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))`."
)


_OWN_ACCELERATOR = (
    "Each worker is a process of its own, with its own Accelerate state: it must make its own `Accelerator`, "
    "inside the function (`accelerator = Accelerator(cpu=True)`), not use one made in the notebook."
)


def _notebook_accelerators(function):
    """Return the names of the Accelerators, made outside ``function``, that its code reads (globals, closure)."""
    from accelerate import Accelerator

    import inspect

    try:
        found = inspect.getclosurevars(function)
    except (TypeError, ValueError):  # not a Python function: nothing to read
        return []
    return [name for name, value in {**found.globals, **found.nonlocals}.items() if isinstance(value, Accelerator)]


class LaunchedExercise(Exercise):
    """An exercise whose check launches the learner's function on 2 processes, under a time limit."""

    time_limit_s = 60.0

    def launch_for_check(self, function, args=()):
        """Return ``parallel.launch(function, args)`` on 2 processes, under the time limit; failures become ``Incorrect``."""
        try:
            return parallel.launch(function, args, num_processes=NUM_PROCESSES, quiet=True, timeout=self.time_limit_s)
        except parallel.LaunchError as error:
            raise Incorrect(f"The check could not launch the 2 workers: {error}") from error
        except parallel.WorkerTimeout:
            raise Incorrect(
                f"Your code was still running after {self.time_limit_s:g} s in the workers, so the check stopped them. "
                + (self.time_limit_cause or "Is there a loop that never ends, or a process waiting for a partner?")
            ) from None
        except parallel.WorkerError as error:
            if "_reset_state()" in str(error):  # Accelerate's words for an Accelerator used after its state was reset
                raise Incorrect(
                    "Your function used, in a worker, an `Accelerator` it did not make there (Accelerate says its "
                    f"state was reset: each worker starts from a clean one). {_OWN_ACCELERATOR}"
                ) from None
            raise Incorrect(f"Your function failed in a worker: {error}. Fix it, run the cell again, then check again.") from None


class JoinTheGroup(LaunchedExercise):
    title = "Exercise 2"
    variables = ["count_my_batches"]
    hints = [
        "Read the check's message: how many processes does each worker's Accelerator think there are?",
        "On a machine without a GPU, an Accelerator joins the other processes only when it is allowed to run on the "
        "CPU; by default it looks for a GPU, finds none, and trains alone.",
        "`Accelerator(cpu=True)`.",
    ]
    solution_code = """
        def count_my_batches():
            accelerator = Accelerator(cpu=True)
            dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))
            return ex.describe_accelerator(accelerator, dataloader)
    """
    correct_message = "Both workers form one group of 2 and each takes its own 5 of the 10 batches."

    def check_answer(self, count_my_batches):
        if not callable(count_my_batches):
            raise Incorrect(f"`count_my_batches` should be a function, but it is {describe_value(count_my_batches)}.")
        borrowed = _notebook_accelerators(count_my_batches)
        if borrowed:
            raise Incorrect(f"Your function uses `{borrowed[0]}`, an `Accelerator` made in the notebook. {_OWN_ACCELERATOR}")
        results = self.launch_for_check(_count_in_worker, (count_my_batches,))
        reports = [report for report, _ in results]
        evidence = results[0][1]
        ignored_keyword = any("split_batches" in keywords for keywords in evidence["keywords"])
        note = f" Note: {_IGNORED_SPLIT_BATCHES}" if ignored_keyword else ""
        for worker, report in enumerate(reports):
            if not isinstance(report, dict) or not {"num_processes", "mode", "num_batches"} <= set(report):
                raise Incorrect(
                    f"Worker {worker} returned {describe_value(report)}: keep the last line, "
                    "`return ex.describe_accelerator(accelerator, dataloader)`."
                )
        if not evidence["group_sizes"] or not evidence["prepared_lengths"]:
            raise Incorrect(
                "Your function returned a report without creating an `Accelerator` and preparing the dataloader in "
                "the worker: keep the starter's lines, and `return ex.describe_accelerator(accelerator, dataloader)`."
            )
        for (report, seen) in results:
            if report["num_processes"] not in seen["group_sizes"] or report["num_batches"] not in seen["prepared_lengths"]:
                raise Incorrect(
                    "Your function returned a report that does not describe the Accelerator and dataloader it made: "
                    "return `ex.describe_accelerator(accelerator, dataloader)` rather than numbers of your own."
                )
        sizes = [report["num_processes"] for report in reports]
        batches = [report["num_batches"] for report in reports]
        if all(size == 1 for size in sizes):
            raise Incorrect(
                f"Both workers ran, but each one's Accelerator says num_processes=1 (mode {reports[0]['mode']}) and "
                f"takes all {batches[0]} batches: each trains alone, and no gradient would ever be shared. This is "
                "the silent failure of the lesson: what must an Accelerator be told on a machine without a GPU?" + note
            )
        if any(size != NUM_PROCESSES for size in sizes):
            raise Incorrect(f"The workers report group sizes {sizes}; both should see a group of {NUM_PROCESSES}.")
        num_batches = DATASET_SIZE // BATCH_SIZE
        if any(True in seen["split_batches"] for _, seen in results):
            if batches == [num_batches] * NUM_PROCESSES:
                return None  # split_batches: each process takes half of every batch, as the lesson shows
        if batches != [math.ceil(num_batches / NUM_PROCESSES)] * NUM_PROCESSES:
            raise Incorrect(
                f"The workers form a group but take {batches} batches: keep the dataloader of the starter code "
                "(40 numbers in batches of 4) and pass it through `accelerator.prepare`."
            )
        if ignored_keyword:
            raise Incorrect(
                "The workers form a group, thanks to `cpu=True`, but " + _IGNORED_SPLIT_BATCHES + " Remove it, or "
                "use the real setting."
            )


# --------------------------------------------------------------------------- q3

# Predictions and labels of 10 validation examples, scored in batches of 4 on 2 processes:
# process 0 takes examples 0-3, then 8-9 filled up with 0-1 again; process 1 takes 4-7,
# then 2-5 again (Accelerate completes the last round from the start of the data).
# Chosen so that each wrong way of counting gives its own value: 6 of the 10 are right,
# 6 of 8 on process 0's shard, 4 of 8 on process 1's, 10 of 16 with the repeats.
PREDICTIONS = [1, 1, 1, 1, 0, 0, 1, 1, 0, 1]
LABELS = [1, 1, 1, 0, 1, 0, 0, 1, 0, 0]
SCORE_BATCH_SIZE = 4


def scoring_dataloader() -> DataLoader:
    """Return the dataloader of exercise 3: batches of ``{"predictions", "labels"}`` (int64 tensors)."""
    examples = [
        {"predictions": torch.tensor(p), "labels": torch.tensor(label)} for p, label in zip(PREDICTIONS, LABELS)
    ]
    return DataLoader(examples, batch_size=SCORE_BATCH_SIZE)


def _score_on_this_process(accuracy_over_all_processes):
    """What each worker of exercise 3 runs: the learner's function on its shard; returns (its value, its shard's accuracy)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    dataloader = accelerator.prepare(scoring_dataloader())
    value = accuracy_over_all_processes(accelerator, dataloader)
    number = as_number(value)  # a tensor may not pickle back (it may hold its graph): send the number
    value = number[0] if number is not None else value
    correct = total = 0
    for batch in dataloader:
        correct += (batch["predictions"] == batch["labels"]).sum().item()
        total += batch["labels"].numel()
    return value, correct / total


def _accuracy_with_repeats() -> float:
    """Return the accuracy ``gather`` gives: over every example each process scored, repeats included."""
    shards = parallel.shards_of_each_process(len(LABELS), SCORE_BATCH_SIZE, NUM_PROCESSES)
    scored = [index for shard in shards for batch in shard for index in batch]
    return sum(PREDICTIONS[i] == LABELS[i] for i in scored) / len(scored)


def _as_float(number):
    """Return ``number`` as a float; an int too large for one becomes infinity (an accuracy it cannot be)."""
    try:
        return float(number)
    except OverflowError:
        return math.inf


class GatherAccuracy(LaunchedExercise):
    title = "Exercise 3"
    variables = ["accuracy_over_all_processes"]
    hints = [
        "Each process only sees its own shard: before counting, collect the predictions and labels of every process.",
        "`accelerator.gather(...)` collects tensors from every process, but keeps the examples Accelerate repeated "
        "to fill the last batch.",
        "`predictions, labels = accelerator.gather_for_metrics((batch[\"predictions\"], batch[\"labels\"]))`",
    ]
    solution_code = """
        def accuracy_over_all_processes(accelerator, dataloader):
            correct, total = 0, 0
            for batch in dataloader:
                predictions, labels = accelerator.gather_for_metrics((batch["predictions"], batch["labels"]))
                correct += (predictions == labels).sum().item()
                total += labels.numel()
            return correct / total
    """
    correct_message = "Both processes report the accuracy of the whole split, each example counted once."

    def check_answer(self, accuracy_over_all_processes):
        if not callable(accuracy_over_all_processes):
            raise Incorrect(
                f"`accuracy_over_all_processes` should be a function, but it is {describe_value(accuracy_over_all_processes)}."
            )
        results = self.launch_for_check(_score_on_this_process, (accuracy_over_all_processes,))
        values = [value for value, _ in results]
        own_shards = [shard_accuracy for _, shard_accuracy in results]
        numbers = [as_number(value) for value in values]
        if any(number is None for number in numbers):
            shown = ", ".join(describe_value(value) for value in values)
            raise Incorrect(f"The function should return one number (the accuracy as a fraction), but it returned {shown}.")
        values = [_as_float(number[0]) for number in numbers]
        if not all(math.isfinite(value) for value in values):
            shown = " and ".join(f"{value}" for value in values)
            raise Incorrect(
                f"The processes returned {shown}: not an accuracy. A division by zero (a count that stayed 0?) "
                "or an overflow?"
            )
        expected = sum(p == label for p, label in zip(PREDICTIONS, LABELS)) / len(LABELS)

        def close(value, target):
            return math.isclose(value, target, rel_tol=1e-6, abs_tol=1e-6)  # float32 arithmetic is fine

        if all(close(value, expected) for value in values):
            return None
        if all(close(value, own) for value, own in zip(values, own_shards)):
            raise Incorrect(
                f"The two processes returned different values ({values[0]:.3f} and {values[1]:.3f}): each counted its "
                "own shard only. Collect the predictions and labels of every process before counting."
            )
        if all(close(value, _accuracy_with_repeats()) for value in values):
            raise Incorrect(
                "Close: you counted every process's predictions, but also the examples Accelerate repeated to fill "
                "the last batch, so some examples count twice. One gather method drops those repeats."
            )
        if all(close(value, 100 * expected) for value in values) or any(value > 1 for value in values):
            raise Incorrect("Return the accuracy as a fraction between 0 and 1, not a percentage or a count.")
        shown = " and ".join(f"{value:.4g}" for value in values)
        raise Incorrect(f"The processes returned {shown}, which is not the accuracy of the 10 examples.")


q1 = BatchesPerProcess()
q2 = JoinTheGroup()
q3 = GatherAccuracy()
