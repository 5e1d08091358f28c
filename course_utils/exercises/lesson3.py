"""Exercises of lesson 3: memory-efficient optimizers (exercise 3, "Will it fit?", is lesson 4's exercise 1 now).

- ``q1``: how many numbers Adafactor's second moment keeps for a parameter of a given shape
- ``q2``: how many bytes bitsandbytes' 8-bit AdamW keeps for a tensor of a given size

The checks recognise the usual mistakes by running them: each known mistake
is written out below as a small function, and a learner's answer that gives
the same wrong result gets that mistake's explanation.
"""

from __future__ import annotations

import math

import torch

from course_utils.exercises.core import CodeExercise, values_match
from course_utils.quantization import (
    BITSANDBYTES_BLOCK_SIZE,
    BITSANDBYTES_MIN_8BIT_SIZE,
    eight_bit_state_bytes,
    factored_state_elements,
)


def _explain_known_mistake(got, args, mistakes):
    """Return the explanation of the first mistake that also gives ``got`` for ``args``, or None.

    ``mistakes`` is a list of ``(mistaken function, explanation)``; the cases are
    ordered so that the first one a learner gets wrong tells the mistakes apart.
    """
    for mistake, explanation in mistakes:
        if values_match(got, mistake(*args), rel_tol=0.0):
            return explanation
    return None


# --------------------------------------------------------------------------- q1: Adafactor's state for one shape

# The shapes of distilbert-base-cased's parameters, and one stack of matrices, as the
# lesson hands them over: `p.shape`, a torch.Size (a tuple with `.numel()`).
ADAFACTOR_CASES = [
    (torch.Size((3072, 768)),),  # a feed-forward weight
    (torch.Size((28996, 768)),),  # the word embeddings
    (torch.Size((768,)),),  # a bias or a LayerNorm weight
    (torch.Size((2, 768)),),  # the classifier's weight: a short, wide matrix
    (torch.Size((4, 30, 70)),),  # a stack of 4 matrices of 30 x 70
]


def _full_second_moment(shape):
    return math.prod(shape)


def _factored_vectors_too(shape):
    # A vector treated as a 1 x n matrix: 1 + n.
    if len(shape) == 1:
        return 1 + shape[0]
    return factored_state_elements(shape)


def _rows_and_columns_of_the_last_two_dims_only(shape):
    if len(shape) < 2:
        return math.prod(shape)
    return shape[-2] + shape[-1]


def _with_first_moment(shape):
    return factored_state_elements(shape) + math.prod(shape)


def _vectors_kept_as_nothing(shape):
    if len(shape) < 2:
        return 0
    return factored_state_elements(shape)


KNOWN_ADAFACTOR_MISTAKES = [
    (_full_second_moment, "That is one number per element: the full second moment AdamW keeps. "
                          "For a matrix, Adafactor keeps only one number per row and one per column."),
    (_with_first_moment, "That adds a first moment (one number per element). Count only the factored second moment: "
                         "Adafactor without `beta1` keeps no first moment."),
    (_rows_and_columns_of_the_last_two_dims_only, "Right for a matrix, but a stack of matrices keeps one set of row and "
                                                   "column statistics *per matrix*: multiply by the leading dimensions."),
    (_factored_vectors_too, "A vector has nothing to factor: Adafactor keeps its full squared-gradient average, one number "
                            "per element."),
    (_vectors_kept_as_nothing, "Vectors (biases, LayerNorm weights) are not skipped: Adafactor keeps one number per element "
                               "for them."),
]


class AdafactorStateElements(CodeExercise):
    title = "Exercise 1"
    variables = ["adafactor_state_elements"]
    def reference(self, shape):
        return factored_state_elements(shape)

    rel_tol = 0.0  # counts are exact
    hints = [
        "An `n x m` matrix keeps its `n` row averages and its `m` column averages; a vector keeps everything.",
        "`len(shape)` tells a vector (1) from a matrix (2 or more). The last two sizes are the matrix: "
        "`rows, cols = shape[-2], shape[-1]`.",
        "A stack `(..., n, m)` is `math.prod(shape[:-2])` matrices, each keeping `n + m` numbers.",
    ]
    solution_code = """
        def adafactor_state_elements(shape):
            if len(shape) < 2:
                return math.prod(shape)  # a vector: nothing to factor
            *stack, n, m = shape
            return math.prod(stack) * (n + m)
    """
    correct_message = "For the 3,072 x 768 feed-forward weight that is 3,840 numbers instead of 2,359,296."

    def cases(self):
        return ADAFACTOR_CASES

    def describe_case(self, args):
        return f"for the shape {tuple(args[0])}"

    def diagnose(self, got, expected, args):
        return _explain_known_mistake(got, args, KNOWN_ADAFACTOR_MISTAKES)


# --------------------------------------------------------------------------- q2: 8-bit AdamW's state for one tensor

# Sizes chosen so that each mistake shows: a whole number of blocks, a partial last
# block, the 4,096 boundary from both sides, and a small tensor.
EIGHT_BIT_CASES = [(3072 * 768,), (4097,), (4096,), (4095,), (768,), (28996 * 768,)]


def _reference_adamw8bit_bytes(num_elements):
    return 2 * eight_bit_state_bytes(num_elements)


def _no_block_scales(n):
    return 4 * 2 * n if n < BITSANDBYTES_MIN_8BIT_SIZE else 2 * n


def _one_state(n):
    return eight_bit_state_bytes(n)


def _whole_blocks_only(n):
    return 8 * n if n < BITSANDBYTES_MIN_8BIT_SIZE else 2 * (n + 4 * (n // BITSANDBYTES_BLOCK_SIZE))


def _no_fp32_fallback(n):
    return 2 * (n + 4 * math.ceil(n / BITSANDBYTES_BLOCK_SIZE))


def _fallback_includes_the_boundary(n):
    return 8 * n if n <= BITSANDBYTES_MIN_8BIT_SIZE else _reference_adamw8bit_bytes(n)


def _fallback_in_one_state(n):
    return 4 * n if n < BITSANDBYTES_MIN_8BIT_SIZE else _reference_adamw8bit_bytes(n)


def _one_scale_per_element_block_in_bytes(n):
    # absmax counted as one byte instead of a 4-byte float.
    return 8 * n if n < BITSANDBYTES_MIN_8BIT_SIZE else 2 * (n + math.ceil(n / BITSANDBYTES_BLOCK_SIZE))


KNOWN_EIGHT_BIT_MISTAKES = [
    (_no_block_scales, "You left out the block scales: every block of 256 elements also keeps its absmax, one fp32 "
                       "number (4 bytes), in each of the two states."),
    (_one_scale_per_element_block_in_bytes, "Each block's absmax is an fp32 number: 4 bytes, not 1."),
    (_one_state, "That is one state. AdamW keeps two moving averages (`state1` and `state2`), each quantised."),
    (_whole_blocks_only, "When the size is not a multiple of 256, the last, partial block needs its own scale too: "
                         "round the number of blocks *up*."),
    (_no_fp32_fallback, "Small tensors are not quantised: below 4,096 elements bitsandbytes keeps both states in fp32 "
                        "(4 bytes per element each)."),
    (_fallback_includes_the_boundary, "A tensor of exactly 4,096 elements is quantised: the fp32 fallback is for "
                                      "*fewer* than 4,096 elements."),
    (_fallback_in_one_state, "Below 4,096 elements both states stay fp32: 2 states x 4 bytes per element."),
]


class AdamW8bitStateBytes(CodeExercise):
    title = "Exercise 2"
    variables = ["adamw8bit_state_bytes"]
    def reference(self, num_elements):
        return _reference_adamw8bit_bytes(num_elements)

    rel_tol = 0.0  # bytes are exact
    hints = [
        "Two states (`state1`, `state2`). For a tensor of at least 4,096 elements each holds 1 byte per element "
        "plus one 4-byte absmax per block of 256 elements.",
        "The number of blocks is `math.ceil(num_elements / 256)`: a partial last block has a scale of its own.",
        "Below 4,096 elements both states stay fp32: `2 * 4 * num_elements` bytes.",
    ]
    solution_code = """
        def adamw8bit_state_bytes(num_elements):
            if num_elements < 4096:
                return 2 * 4 * num_elements  # two fp32 states
            num_blocks = math.ceil(num_elements / 256)
            return 2 * (num_elements + 4 * num_blocks)  # two uint8 states, each with an fp32 absmax per block
    """
    correct_message = "About 2.03 bytes per parameter for large tensors, against AdamW's 8."

    def cases(self):
        return EIGHT_BIT_CASES

    def describe_case(self, args):
        return f"for a tensor of {args[0]:,} elements"

    def diagnose(self, got, expected, args):
        return _explain_known_mistake(got, args, KNOWN_EIGHT_BIT_MISTAKES)


q1 = AdafactorStateElements()
q2 = AdamW8bitStateBytes()
