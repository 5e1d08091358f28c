"""Lesson 3's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

The wrong answers are written the way a learner would write them, not copied
from the exercise module, so the checks are shown to recognise a mistake by
what it does.
"""

import math

from exercise_helpers import assert_correct, assert_handles_bad_answers, assert_incorrect, assert_not_attempted

from course_utils.exercises import ____, lesson3

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


# ---------------------------------------------------------------- every exercise


def test_each_solution_shown_to_the_learner_is_judged_correct():
    for exercise in (lesson3.q1, lesson3.q2):
        namespace = {}
        exec(exercise.solution_code, namespace)
        assert_correct(exercise, **{name: namespace[name] for name in exercise.variables})
