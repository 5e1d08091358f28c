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
from course_utils.exercises.core import CodeExercise, Exercise, Incorrect

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
    return {
        "num_processes": accelerator.num_processes,
        "mode": accelerator.distributed_type.value,
        "num_batches": len(dataloader),
    }


class JoinTheGroup(Exercise):
    title = "Exercise 2"
    variables = ["count_my_batches"]
    hints = [
        "Look at the reports the check prints: how many processes does each worker's Accelerator think there are?",
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
            raise Incorrect(f"`count_my_batches` should be a function, but it is a {type(count_my_batches).__name__}.")
        results = _launch_for_check(count_my_batches)
        for worker, result in enumerate(results):
            if not isinstance(result, dict) or not {"num_processes", "mode", "num_batches"} <= set(result):
                raise Incorrect(
                    f"Worker {worker} returned {result!r}: keep the last line, "
                    "`return ex.describe_accelerator(accelerator, dataloader)`."
                )
        sizes = [result["num_processes"] for result in results]
        batches = [result["num_batches"] for result in results]
        if all(size == 1 for size in sizes):
            raise Incorrect(
                f"Both workers ran, but each one's Accelerator says num_processes=1 (mode {results[0]['mode']}) and "
                f"takes all {batches[0]} batches: each trains alone, and no gradient would ever be shared. This is "
                "the silent failure of the lesson: what must an Accelerator be told on a machine without a GPU?"
            )
        if any(size != NUM_PROCESSES for size in sizes):
            raise Incorrect(f"The workers report group sizes {sizes}; both should see a group of {NUM_PROCESSES}.")
        if batches != [math.ceil(DATASET_SIZE / BATCH_SIZE / NUM_PROCESSES)] * NUM_PROCESSES:
            raise Incorrect(
                f"The workers form a group but take {batches} batches: keep the dataloader of the starter code "
                "(40 numbers in batches of 4) and pass it through `accelerator.prepare`."
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
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
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


class GatherAccuracy(Exercise):
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
                "`accuracy_over_all_processes` should be a function, but it is a "
                f"{type(accuracy_over_all_processes).__name__}."
            )
        results = _launch_for_check(_score_on_this_process, (accuracy_over_all_processes,))
        values = [value for value, _ in results]
        own_shards = [shard_accuracy for _, shard_accuracy in results]
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
            raise Incorrect(f"The function should return a number (the accuracy as a fraction), but it returned {values!r}.")
        expected = sum(p == label for p, label in zip(PREDICTIONS, LABELS)) / len(LABELS)
        if all(math.isclose(value, expected, abs_tol=1e-9) for value in values):
            return None
        if all(math.isclose(value, own, abs_tol=1e-9) for value, own in zip(values, own_shards)):
            raise Incorrect(
                f"The two processes returned different values ({values[0]:.3f} and {values[1]:.3f}): each counted its "
                "own shard only. Collect the predictions and labels of every process before counting."
            )
        if all(math.isclose(value, _accuracy_with_repeats(), abs_tol=1e-9) for value in values):
            raise Incorrect(
                "Close: you counted every process's predictions, but also the examples Accelerate repeated to fill "
                "the last batch, so some examples count twice. One gather method drops those repeats."
            )
        if all(value == 100 * expected for value in values) or any(value > 1 for value in values):
            raise Incorrect("Return the accuracy as a fraction between 0 and 1, not a percentage or a count.")
        raise Incorrect(f"The processes returned {values!r}, which is not the accuracy of the 10 examples.")


# --------------------------------------------------------------------------- shared


def _launch_for_check(function, args=()):
    """Return ``parallel.launch(function, args, 2 processes)``; turn a failed launch into ``Incorrect``."""
    try:
        return parallel.launch(function, args, num_processes=NUM_PROCESSES, quiet=True, timeout=60)
    except parallel.LaunchError as error:
        raise Incorrect(f"The check could not launch the 2 workers: {error}") from error
    except parallel.WorkerError as error:  # str(error): the learner's exception and line
        raise Incorrect(f"Your code raised an error in a worker: {error}") from None
    except parallel.WorkerTimeout as error:
        raise Incorrect(f"The check stopped the workers: {error}.") from None


q1 = BatchesPerProcess()
q2 = JoinTheGroup()
q3 = GatherAccuracy()
