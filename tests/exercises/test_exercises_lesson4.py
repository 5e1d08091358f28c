"""Lesson 4's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

Exercise 1 (will it fit?) moved here from lesson 3; exercise 2 is judged by a
real measurement of the step the learner predicts. The wrong answers are
written the way a learner would write them, not copied from the exercise module.
"""

import pytest
from exercise_helpers import assert_correct, assert_handles_bad_answers, assert_incorrect, assert_not_attempted

from course_utils.exercises import ____, lesson4
from course_utils.units import GIB, MIB

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow

# ---------------------------------------------------------------- q1: the peak with 8-bit AdamW


@pytest.fixture(scope="module")
def q1():
    """The estimates the exercise is built on, as the notebook prints them."""
    return lesson4.q1_numbers()


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson4.q1, peak_8bit_gib=____)


def test_q1_the_set_up_puts_adamw_over_the_budget_and_8bit_adamw_under_it(q1):
    step = q1["adamw_step"]
    assert step.phase_of_peak != "optimizer step"
    with_8bit = step.peak - q1["adamw_state"] + q1["adamw8bit_state"]
    assert step.peak > lesson4.Q1_BUDGET_GIB * GIB > with_8bit
    # A wrong answer near the right one must not change the verdict.
    assert lesson4.Q1_BUDGET_GIB * GIB > with_8bit * (1 + lesson4.q1.rel_tol)


def test_q1_keeping_adamws_peak_is_explained(q1):
    assert_incorrect(lesson4.q1, reason_contains="AdamW's peak", peak_8bit_gib=q1["adamw_step"].peak / GIB)


def test_q1_removing_the_state_without_adding_one_is_explained(q1):
    step = q1["adamw_step"]
    assert_incorrect(lesson4.q1, reason_contains="added no state back",
                     peak_8bit_gib=(step.peak - q1["adamw_state"]) / GIB)


def test_q1_adding_up_all_four_parts_is_explained(q1):
    step = q1["adamw_step"]
    total = step.weights + step.gradients + q1["adamw8bit_state"] + step.activations
    assert_incorrect(lesson4.q1, reason_contains="never all alive at once", peak_8bit_gib=total / GIB)
    # With the 8-bit state counted as 2 bytes per parameter, as a learner may.
    total = step.weights + step.gradients + 2 * q1["parameters"] + step.activations
    assert_incorrect(lesson4.q1, reason_contains="never all alive at once", peak_8bit_gib=total / GIB)


def test_q1_subtracting_the_8bit_state_is_not_told_it_adds_up_four_parts(q1):
    # The answer that exposed issue 23: it was told "That adds up all four parts".
    step = q1["adamw_step"]
    for wrong in (step.peak - q1["adamw8bit_state"], step.peak - 2 * q1["parameters"]):
        assert_incorrect(lesson4.q1, reason_contains="never held it", peak_8bit_gib=wrong / GIB)
        assert "four parts" not in lesson4.q1.diagnose("peak_8bit_gib", wrong / GIB, None)


@pytest.mark.parametrize("odd", [float("nan"), float("inf"), -float("inf")])
def test_q1_nan_and_infinity_are_rejected_and_named(odd):
    assert_incorrect(lesson4.q1, reason_contains="peak_8bit_gib", peak_8bit_gib=odd)


def test_q1_the_rule_of_thumb_is_explained(q1):
    assert_incorrect(lesson4.q1, reason_contains="rule of thumb", peak_8bit_gib=16 * q1["parameters"] / GIB)


def test_q1_bytes_instead_of_gib_is_named(q1):
    step = q1["adamw_step"]
    in_bytes = step.peak - q1["adamw_state"] + q1["adamw8bit_state"]
    assert_incorrect(lesson4.q1, reason_contains="GiB", peak_8bit_gib=in_bytes)


def test_q1_reference_and_two_bytes_per_parameter_are_correct(q1):
    step = q1["adamw_step"]
    assert_correct(lesson4.q1, peak_8bit_gib=(step.peak - q1["adamw_state"] + q1["adamw8bit_state"]) / GIB)
    assert_correct(lesson4.q1, peak_8bit_gib=(step.peak - q1["adamw_state"] + 2 * q1["parameters"]) / GIB)
    assert_handles_bad_answers(lesson4.q1, peak_8bit_gib=(step.peak - q1["adamw_state"] + q1["adamw8bit_state"]) / GIB)


# ---------------------------------------------------------------- q2: predict a peak


@pytest.fixture(scope="module")
def given():
    return lesson4.q2_step(lesson4.Q2_GIVEN_BATCH)


def _scaled(given, part_on_top):
    """What a learner predicts by keeping weights and state and scaling ``part_on_top`` with the batch."""
    held = given.weights + given.optimizer_state
    return (held + lesson4.Q2_BATCH / lesson4.Q2_GIVEN_BATCH * part_on_top) / MIB


def test_q2_blank_is_not_attempted():
    assert_not_attempted(lesson4.q2, predicted_peak_mib=____)


def test_q2_the_measurement_and_the_planner_agree_on_the_step_it_asks_about():
    measured, planned = lesson4.q2_step(lesson4.Q2_BATCH), lesson4.q2_planned()
    assert planned.peak == pytest.approx(measured.peak, rel=0.02)
    assert planned.phase_of_peak == measured.phase_of_peak


def test_q2_the_given_peak_is_in_the_optimizer_step_and_the_asked_one_is_not(given):
    # What makes the exercise: the phase of the peak moves as the batch grows.
    assert given.phase_of_peak == "optimizer step"
    assert lesson4.q2_step(lesson4.Q2_BATCH).phase_of_peak != "optimizer step"


def test_q2_scaling_the_forward_or_backward_part_or_the_activations_is_correct(given):
    held = given.weights + given.optimizer_state
    result = assert_correct(lesson4.q2, predicted_peak_mib=_scaled(given, given.peak_by_phase["backward"] - held))
    assert "Measured:" in result.message and "planner" in result.message
    assert_correct(lesson4.q2, predicted_peak_mib=_scaled(given, given.peak_by_phase["forward"] - held))
    assert_correct(lesson4.q2, predicted_peak_mib=_scaled(given, given.activations))
    assert_handles_bad_answers(lesson4.q2, predicted_peak_mib=_scaled(given, given.activations))


def test_q2_scaling_the_optimizer_steps_peak_is_explained(given):
    held = given.weights + given.optimizer_state
    assert_incorrect(lesson4.q2, reason_contains="does not depend on the batch",
                     predicted_peak_mib=_scaled(given, given.peak_by_phase["optimizer step"] - held))


def test_q2_keeping_the_given_peak_is_explained_without_revealing_the_answer(given):
    result = assert_incorrect(lesson4.q2, reason_contains="smaller batch", predicted_peak_mib=given.peak / MIB)
    assert "Measured" not in result.message


def test_q2_scaling_the_whole_peak_is_explained(given):
    factor = lesson4.Q2_BATCH / lesson4.Q2_GIVEN_BATCH
    assert_incorrect(lesson4.q2, reason_contains="do not grow with the batch", predicted_peak_mib=factor * given.peak / MIB)


def test_q2_adding_up_the_four_parts_is_explained(given):
    factor = lesson4.Q2_BATCH / lesson4.Q2_GIVEN_BATCH
    total = given.weights + given.gradients + given.optimizer_state + factor * given.activations
    assert_incorrect(lesson4.q2, reason_contains="never all alive at once", predicted_peak_mib=total / MIB)


def test_q2_leaving_out_the_optimizer_state_and_the_rule_of_thumb_are_explained(given):
    held = given.weights + given.optimizer_state
    factor = lesson4.Q2_BATCH / lesson4.Q2_GIVEN_BATCH
    assert_incorrect(lesson4.q2, reason_contains="optimizer state",
                     predicted_peak_mib=(given.weights + factor * (given.peak - held)) / MIB)
    assert_incorrect(lesson4.q2, reason_contains="16-bytes-per-parameter", predicted_peak_mib=4 * given.weights / MIB)


@pytest.mark.parametrize("factor, unit", [(1 / 1024, "GiB"), (1024, "KiB"), (MIB, "bytes")])
@pytest.mark.parametrize("rounding", [1.0, 1.02, 0.98])
def test_q2_a_unit_slip_within_the_exercises_tolerance_is_named(given, factor, unit, rounding):
    # A right prediction (within the 3 % the check allows) in the wrong unit: value * 1024 was never named.
    right = _scaled(given, given.peak_by_phase["backward"] - given.weights - given.optimizer_state)
    assert_incorrect(lesson4.q2, reason_contains=unit, predicted_peak_mib=right * rounding * factor)


@pytest.mark.parametrize("odd", [float("nan"), float("inf"), -float("inf")])
def test_q2_nan_and_infinity_are_rejected(odd):
    assert_incorrect(lesson4.q2, reason_contains="predicted_peak_mib", predicted_peak_mib=odd)


def test_q2_an_answer_in_bytes_is_named(given):
    assert_incorrect(lesson4.q2, reason_contains="bytes", predicted_peak_mib=_scaled(given, given.activations) * MIB)


# ---------------------------------------------------------------- every exercise


def test_each_solution_shown_to_the_learner_is_judged_correct(q1, given):
    # The solutions read the notebook's variables: give them the ones the lesson defines.
    notebook_variables = {
        "fit_adamw_step": q1["adamw_step"], "fit_adamw_state": q1["adamw_state"],
        "fit_adamw8bit_state": q1["adamw8bit_state"], "given_step": given,
    }
    for exercise in (lesson4.q1, lesson4.q2):
        namespace = dict(notebook_variables)
        exec(exercise.solution_text, namespace)
        assert_correct(exercise, **{name: namespace[name] for name in exercise.variables})
