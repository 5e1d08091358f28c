"""Lesson 4's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

The checks of q2 and q3 launch the answer on two processes, as in the notebook.
"""

import math
import sys

import pytest
from accelerate import Accelerator
from exercise_helpers import assert_correct, assert_handles_bad_answers, assert_incorrect, assert_not_attempted
from torch.utils.data import DataLoader

from course_utils.exercises import ____, lesson6


@pytest.fixture
def launchable(monkeypatch):
    """No bitsandbytes in sys.modules (other tests import it; this CPU-only process has no GPU it could spoil)."""
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


# ---------------------------------------------------------------- q1: batches per process


def test_q1_blank_is_not_attempted():
    def batches_per_process(num_batches, num_processes):
        return ____

    assert_not_attempted(lesson6.q1, batches_per_process=batches_per_process)


def test_q1_rounding_up_is_correct():
    def batches_per_process(num_batches, num_processes):
        return math.ceil(num_batches / num_processes)

    assert_correct(lesson6.q1, batches_per_process=batches_per_process)


def test_q1_an_integer_ceiling_division_is_also_correct():
    def batches_per_process(num_batches, num_processes):
        return -(-num_batches // num_processes)

    assert_correct(lesson6.q1, batches_per_process=batches_per_process)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda m, n: m // n, "rounds down"),
        (lambda m, n: m, "trains alone"),
        (lambda m, n: m * n, "do not multiply"),
        (lambda m, n: m / n, "whole number"),
    ],
)
def test_q1_typical_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson6.q1, reason_contains=diagnosis, batches_per_process=wrong)


def test_q1_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson6.q1, batches_per_process=lambda m, n: math.ceil(m / n))


# ---------------------------------------------------------------- q2: join the group


def count_with(make_accelerator):
    def count_my_batches():
        accelerator = make_accelerator()
        dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))
        return lesson6.describe_accelerator(accelerator, dataloader)

    return count_my_batches


def test_q2_blank_is_not_attempted():
    def count_my_batches():
        accelerator = Accelerator(____)
        dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))
        return lesson6.describe_accelerator(accelerator, dataloader)

    assert_not_attempted(lesson6.q2, count_my_batches=count_my_batches)


def test_q2_an_accelerator_allowed_on_the_cpu_is_correct(launchable):
    assert_correct(lesson6.q2, count_my_batches=count_with(lambda: Accelerator(cpu=True)))


@pytest.mark.parametrize("make_accelerator", [Accelerator, lambda: Accelerator(cpu=False)], ids=["default", "cpu=False"])
def test_q2_the_silent_failure_is_diagnosed(launchable, make_accelerator):
    assert_incorrect(
        lesson6.q2, reason_contains=["num_processes=1", "trains alone"], count_my_batches=count_with(make_accelerator)
    )


def test_q2_a_changed_return_value_is_explained(launchable):
    def count_my_batches():
        Accelerator(cpu=True)
        return 5

    assert_incorrect(lesson6.q2, reason_contains="describe_accelerator", count_my_batches=count_my_batches)


def test_q2_an_accelerator_left_in_this_process_does_not_change_the_verdict(launchable):
    # A learner who tried their function in the notebook left an Accelerator there; each
    # worker of parallel.launch starts from a clean Accelerate state, so the answer is judged as usual.
    from course_utils import launcher

    Accelerator(cpu=True)
    try:
        assert_correct(lesson6.q2, count_my_batches=count_with(lambda: Accelerator(cpu=True)))
    finally:
        launcher.reset_accelerate_state()


def test_q2_bad_answers_are_reported_not_raised(launchable):
    assert_handles_bad_answers(lesson6.q2, count_my_batches=count_with(lambda: Accelerator(cpu=True)))


# ---------------------------------------------------------------- q3: gather for accuracy


def accuracy_with(gather):
    def accuracy_over_all_processes(accelerator, dataloader):
        correct, total = 0, 0
        for batch in dataloader:
            predictions, labels = gather(accelerator, (batch["predictions"], batch["labels"]))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        return correct / total

    return accuracy_over_all_processes


def test_q3_blank_is_not_attempted():
    def accuracy_over_all_processes(accelerator, dataloader):
        correct, total = 0, 0
        for batch in dataloader:
            predictions, labels = ____
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        return correct / total

    assert_not_attempted(lesson6.q3, accuracy_over_all_processes=accuracy_over_all_processes)


def test_q3_gather_for_metrics_is_correct(launchable):
    result = assert_correct(
        lesson6.q3, accuracy_over_all_processes=accuracy_with(lambda accelerator, pair: accelerator.gather_for_metrics(pair))
    )
    assert "counted once" in result.message


def test_q3_counting_only_this_process_is_diagnosed(launchable):
    assert_incorrect(
        lesson6.q3, reason_contains="its own shard only", hides=0.6,
        accuracy_over_all_processes=accuracy_with(lambda accelerator, pair: pair),
    )


def test_q3_gather_that_keeps_the_repeated_examples_is_diagnosed(launchable):
    assert_incorrect(
        lesson6.q3, reason_contains="repeated", hides=0.6,
        accuracy_over_all_processes=accuracy_with(lambda accelerator, pair: accelerator.gather(pair)),
    )


def test_q3_a_percentage_is_diagnosed(launchable):
    def accuracy_in_percent(accelerator, dataloader):
        return 100 * accuracy_with(lambda accelerator, pair: accelerator.gather_for_metrics(pair))(accelerator, dataloader)

    assert_incorrect(lesson6.q3, reason_contains="fraction", accuracy_over_all_processes=accuracy_in_percent)


def test_q3_bad_answers_are_reported_not_raised(launchable):
    assert_handles_bad_answers(
        lesson6.q3, accuracy_over_all_processes=accuracy_with(lambda accelerator, pair: accelerator.gather_for_metrics(pair))
    )
