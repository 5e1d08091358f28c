"""Lesson 4's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

The checks of q2 and q3 launch the answer on two processes, as in the notebook.
"""

import math

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_odd_answers_are_judged,
    assert_not_attempted,
)
from torch.utils.data import DataLoader

from course_utils import REPO_DIR
from course_utils.exercises import ____, lesson6

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks


# ---------------------------------------------------------------- q1: batches per process


@pytest.mark.parametrize("broken", [lambda n, p: float("nan"), lambda n, p: n * 1e308 * 10.0, lambda n, p: math.inf])
def test_q1_nan_and_infinity_are_named_never_accepted(broken):
    assert_incorrect(lesson6.q1, reason_contains="a division by zero or an overflow?", batches_per_process=broken)


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


@pytest.mark.parametrize(
    "answer",
    [lambda m, n: (m + n - 1) // n, lambda m, n: int(np.ceil(m / n)), lambda m, n: np.ceil(m / n),
     lambda m, n: m // n + (m % n > 0), lambda m, n: torch.tensor(m / n).ceil()],
    ids=["integer arithmetic", "numpy int", "numpy float", "remainder", "tensor"],
)
def test_q1_more_correct_answers_written_differently_pass(answer):
    assert_correct(lesson6.q1, batches_per_process=answer)


@pytest.mark.parametrize("odd", [lambda m, n: 10**400, lambda m, n: np.ones(2), lambda m, n: torch.zeros(0),
                                 lambda m, n: [m, n], lambda m, n: float("inf")])
def test_q1_odd_results_are_incorrect(odd):
    assert_incorrect(lesson6.q1, batches_per_process=odd)


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
    from course_utils import accelerate_state

    Accelerator(cpu=True)
    try:
        assert_correct(lesson6.q2, count_my_batches=count_with(lambda: Accelerator(cpu=True)))
    finally:
        accelerate_state.reset_accelerate_state()


def _with_the_notebooks_accelerator(source):
    """Define a learner's function in a namespace like the notebook's, where `accelerator` was made in the notebook."""
    namespace = {"Accelerator": Accelerator, "DataLoader": DataLoader, "ex": lesson6, "accelerator": Accelerator(cpu=True)}
    exec(source, namespace)  # noqa: S102 - the test's own learner answer
    return namespace["count_my_batches"]


@pytest.mark.parametrize("source", [
    # the notebook's Accelerator, reused in the worker
    "def count_my_batches():\n"
    "    dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))\n"
    "    return ex.describe_accelerator(accelerator, dataloader)\n",
    # a new one made in the worker, but the notebook's used to prepare
    "def count_my_batches():\n"
    "    mine = Accelerator(cpu=True)\n"
    "    dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))\n"
    "    return ex.describe_accelerator(mine, dataloader)\n",
], ids=["reused", "prepared with it"])
def test_q2_the_notebooks_accelerator_used_in_the_worker_is_told_each_worker_makes_its_own(launchable, source):
    from course_utils import accelerate_state

    try:
        result = assert_incorrect(lesson6.q2, reason_contains=["made in the notebook", "must make its own"],
                                  count_my_batches=_with_the_notebooks_accelerator(source))
    finally:
        accelerate_state.reset_accelerate_state()
    assert "_reset_state" not in result.message


def test_q2_accelerates_reset_state_error_in_a_worker_is_recognised(launchable):
    # The notebook's Accelerator reached without a name the check can read: Accelerate's own error in the worker.
    from course_utils import accelerate_state

    held = [Accelerator(cpu=True)]

    def count_my_batches():
        dataloader = held[0].prepare(DataLoader(list(range(40)), batch_size=4))
        return lesson6.describe_accelerator(held[0], dataloader)

    try:
        result = assert_incorrect(lesson6.q2, reason_contains=["did not make there", "must make its own"],
                                  count_my_batches=count_my_batches)
    finally:
        accelerate_state.reset_accelerate_state()
    assert "AttributeError" not in result.message


def test_q2_a_hard_coded_report_does_not_pass(launchable):
    def count_my_batches():
        return {"num_processes": 2, "mode": "MULTI_CPU", "num_batches": 5}

    assert_incorrect(lesson6.q2, reason_contains="without creating an `Accelerator`", count_my_batches=count_my_batches)


def test_q2_a_report_that_does_not_describe_the_accelerator_does_not_pass(launchable):
    def count_my_batches():
        accelerator = Accelerator()
        accelerator.prepare(DataLoader(list(range(40)), batch_size=4))
        return {"num_processes": 2, "mode": "MULTI_CPU", "num_batches": 5}

    assert_incorrect(lesson6.q2, reason_contains="does not describe", count_my_batches=count_my_batches)


def test_q2_split_batches_given_to_accelerator_is_named_as_ignored(launchable):
    assert_incorrect(lesson6.q2, reason_contains=["trains alone", "ignored in accelerate 1.15", "DataLoaderConfiguration"],
                     count_my_batches=count_with(lambda: Accelerator(split_batches=True)))
    assert_incorrect(lesson6.q2, reason_contains=["ignored in accelerate 1.15", "DataLoaderConfiguration(split_batches=True)"],
                     count_my_batches=count_with(lambda: Accelerator(cpu=True, split_batches=True)))


def test_q2_the_real_split_batches_setting_with_cpu_is_correct(launchable):
    config = DataLoaderConfiguration(split_batches=True)
    assert_correct(lesson6.q2, count_my_batches=count_with(lambda: Accelerator(cpu=True, dataloader_config=config)))


def test_q2_a_function_that_raises_shows_the_learners_own_line(launchable):
    def count_my_batches():
        accelerator = Accelerator(cpu=True)
        return accelerator.no_such_attribute

    result = assert_incorrect(lesson6.q2, reason_contains=["AttributeError", "accelerator.no_such_attribute"],
                              count_my_batches=count_my_batches)
    assert "elastic" not in result.message and "site-packages" not in result.message


def test_q2_an_endless_worker_is_stopped(launchable):
    class Quick(type(lesson6.q2)):
        time_limit_s = 5.0

    def count_my_batches():
        while True:
            pass

    assert_incorrect(Quick(), reason_contains="still running after 5 s", count_my_batches=count_my_batches)


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


def test_q3_the_everyday_tensor_accuracy_in_float32_is_correct(launchable):
    def accuracy_over_all_processes(accelerator, dataloader):
        all_predictions, all_labels = [], []
        for batch in dataloader:
            predictions, labels = accelerator.gather_for_metrics((batch["predictions"], batch["labels"]))
            all_predictions.append(predictions)
            all_labels.append(labels)
        return (torch.cat(all_predictions) == torch.cat(all_labels)).float().mean().item()

    assert_correct(lesson6.q3, accuracy_over_all_processes=accuracy_over_all_processes)


def test_q3_numpy_float32_and_tensor_results_are_correct(launchable):
    gather = accuracy_with(lambda accelerator, pair: accelerator.gather_for_metrics(pair))
    assert_correct(lesson6.q3, accuracy_over_all_processes=lambda a, d: np.float32(gather(a, d)))
    assert_correct(lesson6.q3, accuracy_over_all_processes=lambda a, d: torch.tensor([gather(a, d)], dtype=torch.float32))


def test_q3_a_function_that_raises_shows_its_own_exception_and_line(launchable):
    def accuracy_over_all_processes(accelerator, dataloader):
        return 1 / 0

    result = assert_incorrect(lesson6.q3, reason_contains=["ZeroDivisionError", "return 1 / 0"],
                              accuracy_over_all_processes=accuracy_over_all_processes)
    assert "_score_on_this_process" not in result.message and "error above" not in result.message


@pytest.mark.parametrize("odd", [lambda a, d: 10**400, lambda a, d: torch.ones(3), lambda a, d: np.zeros(0),
                                 lambda a, d: "0.6", lambda a, d: None])
def test_q3_odd_results_are_incorrect(launchable, odd):
    assert_incorrect(lesson6.q3, accuracy_over_all_processes=odd)


@pytest.mark.parametrize("broken", [lambda a, d: float("nan"), lambda a, d: torch.tensor(0.0) / 0, lambda a, d: math.inf])
def test_q3_nan_and_infinity_are_named_never_accepted(launchable, broken):
    assert_incorrect(lesson6.q3, reason_contains="a division by zero", accuracy_over_all_processes=broken)


def test_q3_bad_answers_are_reported_not_raised(launchable):
    assert_handles_bad_answers(
        lesson6.q3, accuracy_over_all_processes=accuracy_with(lambda accelerator, pair: accelerator.gather_for_metrics(pair))
    )


@pytest.mark.parametrize("number", [1, 2, 3])
def test_the_solved_copy_shows_the_solution_the_check_prints(number):
    lesson = REPO_DIR / "lessons" / "06_data_parallel.py"
    assert_lesson_shows_the_solution(getattr(lesson6, f"q{number}"), lesson, f"ex.q{number}.check()")


def test_odd_answers_to_exercise_1_are_judged_never_a_check_failure():
    assert_odd_answers_are_judged(lesson6.q1, batches_per_process=lambda m, n: math.ceil(m / n))
