"""Lesson 3's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

The wrong answers are written the way a learner would write them, not copied
from the exercise module, so the checks are shown to recognise a mistake by
what it does.
"""

import math

import numpy as np
import pytest
import torch
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_odd_answers_are_judged,
    assert_not_attempted,
)

from course_utils import REPO_DIR
from course_utils.exercises import ____, lesson3

LESSON = REPO_DIR / "lessons" / "03_memory_efficient_optimizers.py"

# ---------------------------------------------------------------- q1: Adafactor's state for one shape


def adafactor_blank(shape):
    return ____


def adafactor_right(shape):
    if len(shape) == 1:
        return shape[0]
    rows, cols = shape[-2], shape[-1]
    matrices = 1
    for size in shape[:-2]:
        matrices *= size
    return matrices * (rows + cols)


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson3.q1, adafactor_state_elements=____)
    assert_not_attempted(lesson3.q1, adafactor_state_elements=adafactor_blank)


def test_q1_counting_every_element_is_the_full_second_moment():
    assert_incorrect(lesson3.q1, reason_contains="full second moment", hides=3_840,
                     adafactor_state_elements=lambda shape: math.prod(shape))


def test_q1_factoring_a_vector_is_explained():
    def factor_everything(shape):
        if len(shape) == 1:
            return 1 + shape[0]
        return adafactor_right(shape)

    assert_incorrect(lesson3.q1, reason_contains="nothing to factor", adafactor_state_elements=factor_everything)


def test_q1_forgetting_the_stack_of_matrices_is_explained():
    def last_two_only(shape):
        return shape[0] if len(shape) == 1 else shape[-1] + shape[-2]

    assert_incorrect(lesson3.q1, reason_contains="per matrix", adafactor_state_elements=last_two_only)


def test_q1_adding_a_first_moment_is_explained():
    assert_incorrect(lesson3.q1, reason_contains="first moment",
                     adafactor_state_elements=lambda shape: adafactor_right(shape) + math.prod(shape))


def test_q1_reference_and_a_differently_written_answer_are_correct():
    assert_correct(lesson3.q1, adafactor_state_elements=adafactor_right)
    assert_handles_bad_answers(lesson3.q1, adafactor_state_elements=adafactor_right)


def adafactor_with_size_methods(shape):
    # torch.Size has numel(): the lesson hands over `p.shape`, and so does the check.
    if len(shape) == 1:
        return shape.numel()
    return shape[:-2].numel() * (shape[-2] + shape[-1])


def adafactor_with_numpy(shape):
    shape = np.array(shape)
    if shape.size < 2:
        return np.int64(shape.prod())
    return np.prod(shape[:-2]) * shape[-2:].sum()


def adafactor_one_line(shape):
    return math.prod(shape) if len(shape) < 2 else math.prod(shape[:-2]) * sum(shape[-2:])


@pytest.mark.parametrize("answer", [adafactor_with_size_methods, adafactor_with_numpy, adafactor_one_line,
                                    lambda shape: torch.tensor(adafactor_one_line(shape))])
def test_q1_correct_answers_written_differently_pass(answer):
    assert_correct(lesson3.q1, adafactor_state_elements=answer)


@pytest.mark.parametrize("odd", [lambda shape: 10**400, lambda shape: torch.ones(3), lambda shape: np.zeros(0),
                                 lambda shape: list(shape), lambda shape: float("nan"), lambda shape: ____ if shape else 0])
def test_q1_odd_results_are_incorrect_or_not_attempted(odd):
    result = lesson3.q1.evaluate(adafactor_state_elements=odd)
    assert result.outcome.name in ("INCORRECT", "NOT_ATTEMPTED"), result.message


def test_q1_a_lambda_over_two_lines_is_judged_like_any_function():
    answer = (lambda shape:
              math.prod(shape) if len(shape) < 2 else math.prod(shape[:-2]) * (shape[-2] + shape[-1]))
    assert_correct(lesson3.q1, adafactor_state_elements=answer)


# ---------------------------------------------------------------- q2: 8-bit AdamW's state for one tensor


def eight_bit_right(num_elements):
    if num_elements < 4096:
        return 8 * num_elements
    blocks = -(-num_elements // 256)
    return 2 * num_elements + 8 * blocks


def test_q2_blank_is_not_attempted():
    assert_not_attempted(lesson3.q2, adamw8bit_state_bytes=____)
    assert_not_attempted(lesson3.q2, adamw8bit_state_bytes=lambda n: ____)


def test_q2_one_byte_per_element_and_state_forgets_the_block_scales():
    assert_incorrect(lesson3.q2, reason_contains="block scales", hides=4_755_456,
                     adamw8bit_state_bytes=lambda n: 2 * n)


def test_q2_one_quantised_state_is_half_of_it():
    def one_state(n):
        return 4 * n if n < 4096 else n + 4 * math.ceil(n / 256)

    assert_incorrect(lesson3.q2, reason_contains="two moving averages", adamw8bit_state_bytes=one_state)


def test_q2_rounding_the_blocks_down_is_explained():
    def whole_blocks(n):
        return 8 * n if n < 4096 else 2 * (n + 4 * (n // 256))

    assert_incorrect(lesson3.q2, reason_contains="round the number of blocks *up*", adamw8bit_state_bytes=whole_blocks)


def test_q2_quantising_small_tensors_too_is_explained():
    assert_incorrect(lesson3.q2, reason_contains="below 4,096 elements",
                     adamw8bit_state_bytes=lambda n: 2 * (n + 4 * math.ceil(n / 256)))


def test_q2_putting_4096_itself_in_the_fallback_is_explained():
    def inclusive(n):
        return 8 * n if n <= 4096 else eight_bit_right(n)

    assert_incorrect(lesson3.q2, reason_contains="exactly 4,096", adamw8bit_state_bytes=inclusive)


def test_q2_reference_and_a_differently_written_answer_are_correct():
    assert_correct(lesson3.q2, adamw8bit_state_bytes=eight_bit_right)
    assert_handles_bad_answers(lesson3.q2, adamw8bit_state_bytes=eight_bit_right)


@pytest.mark.parametrize(
    "answer",
    [lambda n: 8 * n if n < 4096 else 2 * n + 8 * math.ceil(n / 256),
     lambda n: np.int64(2 * (n + 4 * ((n + 255) // 256))) if n >= 4096 else np.int64(8 * n),
     lambda n: float(2 * 4 * n) if n < 2**12 else 2.0 * (n + 4 * math.ceil(n / 256))],
    ids=["ceil", "numpy", "floats"],
)
def test_q2_correct_answers_written_differently_pass(answer):
    assert_correct(lesson3.q2, adamw8bit_state_bytes=answer)


@pytest.mark.parametrize("odd", [lambda n: 10**400, lambda n: np.ones(2), lambda n: torch.zeros(2, 2), lambda n: "8n"])
def test_q2_odd_results_are_incorrect(odd):
    assert_incorrect(lesson3.q2, adamw8bit_state_bytes=odd)


@pytest.mark.parametrize("exercise, name, broken", [
    ("q1", "adafactor_state_elements", lambda shape: float("nan")),
    ("q1", "adafactor_state_elements", lambda shape: math.inf),
    ("q2", "adamw8bit_state_bytes", lambda n: float("nan")),
    ("q2", "adamw8bit_state_bytes", lambda n: 2 * (n + 4 * n / 256) * 1e308 * 10),
    ("q2", "adamw8bit_state_bytes", lambda n: torch.tensor(float("nan"))),
])
def test_nan_and_infinity_are_named_never_accepted(exercise, name, broken):
    assert_incorrect(getattr(lesson3, exercise), reason_contains="a division by zero or an overflow?", **{name: broken})


def test_q2_a_function_that_never_returns_is_stopped():
    class Quick(type(lesson3.q2)):
        time_limit_s = 0.5

    def endless(n):
        while n > 0:
            n += 1

    assert_incorrect(Quick(), reason_contains="still running", adamw8bit_state_bytes=endless)


@pytest.mark.parametrize("number", [1, 2])
def test_the_solved_copy_shows_the_solution_the_check_prints(number):
    assert_lesson_shows_the_solution(getattr(lesson3, f"q{number}"), LESSON, f"ex.q{number}.check()")


# ---------------------------------------------------------------- every exercise


def test_each_solution_shown_to_the_learner_is_judged_correct():
    for exercise in (lesson3.q1, lesson3.q2):
        namespace = {"math": math}  # the lesson imported math earlier
        exec(exercise.solution_text, namespace)
        assert_correct(exercise, **{name: namespace[name] for name in exercise.variables})


def test_odd_answers_to_exercises_1_and_2_are_judged_never_a_check_failure():
    assert_odd_answers_are_judged(lesson3.q1, adafactor_state_elements=adafactor_right)
    assert_odd_answers_are_judged(lesson3.q2, adamw8bit_state_bytes=eight_bit_right)
