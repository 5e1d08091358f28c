"""Lesson 9's context- and expert-parallel exercises: the reference passes the launched runs, each mistake is named."""

import math

import pytest
import torch
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_not_attempted,
    assert_odd_answers_are_judged,
    lesson_path,
)

from course_utils.exercises import ____
from course_utils.exercises import lesson9_cp_ep as ex

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own.
pytestmark = pytest.mark.forks

LESSON = lesson_path("09")


# ---------------------------------------------------------------- q1: merging two softmaxes


def merge_softmaxes(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
    return out, lse


def test_q1_blank_is_not_attempted():
    assert_not_attempted(ex.q1, merge_softmaxes=lambda out_a, lse_a, out_b, lse_b: ____)


def test_q1_reference_merges_right_in_the_ring_of_three_processes():
    assert_correct(ex.q1, merge_softmaxes=merge_softmaxes)


def test_q1_the_max_subtracting_form_is_correct_too():
    def merge(out_a, lse_a, out_b, lse_b):
        top = torch.maximum(lse_a, lse_b)
        weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
        total = weight_a + weight_b
        out = (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / total[..., None]
        return [out, top + torch.log(total)]

    assert_correct(ex.q1, merge_softmaxes=merge)


def merge_by_exp(out_a, lse_a, out_b, lse_b):
    """Right in exact arithmetic; exp(lse) overflows float32 for large scores."""
    weight_a, weight_b = torch.exp(lse_a), torch.exp(lse_b)
    total = weight_a + weight_b
    return (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / total[..., None], torch.log(total)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda out_a, lse_a, out_b, lse_b: ((out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)), "reweight"),
        (lambda out_a, lse_a, out_b, lse_b: (out_a + out_b, torch.logaddexp(lse_a, lse_b)), "reweight"),
        (lambda out_a, lse_a, out_b, lse_b: (torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b,
                                             torch.logaddexp(lse_a, lse_b)), "never divides"),
        (lambda out_a, lse_a, out_b, lse_b: merge_softmaxes(out_b, lse_a, out_a, lse_b), "swaps the weights"),
        (lambda out_a, lse_a, out_b, lse_b: (merge_softmaxes(out_a, lse_a, out_b, lse_b)[0],
                                             torch.maximum(lse_a, lse_b)), "the larger of the two"),
        (lambda out_a, lse_a, out_b, lse_b: (merge_softmaxes(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b),
         "log of a product"),
        (lambda out_a, lse_a, out_b, lse_b: (merge_softmaxes(out_a, lse_a, out_b, lse_b)[0], lse_a),
         "unchanged"),
        (merge_by_exp, "overflows"),
        (lambda out_a, lse_a, out_b, lse_b: (torch.full_like(out_a, math.nan), torch.logaddexp(lse_a, lse_b)), "NaN"),
        (lambda out_a, lse_a, out_b, lse_b: merge_softmaxes(out_a, lse_a, out_b, lse_b)[0], "two tensors"),
        (lambda out_a, lse_a, out_b, lse_b: (merge_softmaxes(out_a, lse_a, out_b, lse_b)[0].sum(-1), lse_a),
         "shape"),
        (lambda out_a, lse_a, out_b, lse_b: out_a, "two tensors"),
    ],
)
def test_q1_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(ex.q1, reason_contains=diagnosis, merge_softmaxes=wrong)


def test_q1_a_string_instead_of_a_function_is_named():
    assert_incorrect(ex.q1, reason_contains="is a string", merge_softmaxes="torch.logaddexp(lse_a, lse_b)")


def test_q1_bad_and_odd_answers_are_judged_never_crash():
    assert_handles_bad_answers(ex.q1, merge_softmaxes=merge_softmaxes)
    assert_odd_answers_are_judged(ex.q1, merge_softmaxes=merge_softmaxes)


# ---------------------------------------------------------------- q2: the causal mask across ring steps


def ring_mask(query_positions, key_positions):
    return key_positions[None, :] <= query_positions[:, None]


def test_q2_blank_is_not_attempted():
    assert_not_attempted(ex.q2, ring_mask=lambda query_positions, key_positions: ____)


def test_q2_reference_masks_the_causal_ring_of_two_processes_right():
    assert_correct(ex.q2, ring_mask=ring_mask)


def test_q2_a_mask_written_with_a_loop_is_correct_too():
    def mask(query_positions, key_positions):
        rows = [[int(k) <= int(q) for k in key_positions] for q in query_positions]
        return torch.tensor(rows)

    assert_correct(ex.q2, ring_mask=mask)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda q, k: torch.ones(len(q), len(k), dtype=torch.bool).tril(), "as if every step held the diagonal"),
        (lambda q, k: k[None, :] < q[:, None], "hides each token from itself"),
        (lambda q, k: k[None, :] >= q[:, None], "reversed"),
        (lambda q, k: k[None, :] > q[:, None], "reversed"),
        (lambda q, k: torch.ones(len(q), len(k), dtype=torch.bool), "see the future"),
        (lambda q, k: (k[None, :] <= q[:, None]).int(), "bool tensor"),
        (lambda q, k: q[None, :] <= k[:, None], "reversed"),
        (lambda q, k: (k[None, :] <= q[:, None])[:, :2], "shape"),
        (lambda q, k: (k[None, :] <= q[:, None]).tolist(), "should return a bool tensor"),
        (lambda q, k: torch.zeros(len(q), len(k), dtype=torch.bool), "hides keys at or before"),
    ],
)
def test_q2_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(ex.q2, reason_contains=diagnosis, ring_mask=wrong)


def test_q2_bad_and_odd_answers_are_judged_never_crash():
    assert_handles_bad_answers(ex.q2, ring_mask=ring_mask)
    assert_odd_answers_are_judged(ex.q2, ring_mask=ring_mask)


# ---------------------------------------------------------------- q3: dispatching tokens to experts


def dispatch_tokens(expert_ids, experts_per_process, world_size):
    destinations = expert_ids // experts_per_process
    order = torch.argsort(destinations)
    counts = torch.bincount(destinations, minlength=world_size).tolist()
    return order, counts


def test_q3_blank_is_not_attempted():
    assert_not_attempted(ex.q3, dispatch_tokens=lambda expert_ids, experts_per_process, world_size: ____)


def test_q3_reference_routes_every_token_of_the_launched_layer_right():
    assert_correct(ex.q3, dispatch_tokens=dispatch_tokens)


def test_q3_sorting_by_expert_and_counting_in_python_is_correct_too():
    """Sorting by expert groups the tokens by process as well, since each process holds a contiguous range."""

    def dispatch(expert_ids, experts_per_process, world_size):
        ids = expert_ids.tolist()
        order = sorted(range(len(ids)), key=lambda token: ids[token])
        counts = [sum(1 for e in ids if e // experts_per_process == r) for r in range(world_size)]
        return order, torch.tensor(counts)

    assert_correct(ex.q3, dispatch_tokens=dispatch)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda ids, per, world: (torch.argsort(ids % world, stable=True), torch.bincount(ids % world, minlength=world)),
         "round-robin"),
        (lambda ids, per, world: (torch.arange(len(ids)), torch.bincount(ids // per, minlength=world).tolist()),
         "not in destination order"),
        (lambda ids, per, world: (torch.argsort(ids // per), torch.bincount(ids // per).tolist()), "zeros included"),
        (lambda ids, per, world: (torch.argsort(ids // per), torch.bincount(ids, minlength=per * world).tolist()),
         "one per expert"),
        (lambda ids, per, world: (torch.argsort(ids // per), [len(ids)] + [0] * (world - 1)), "does not hold"),
        (lambda ids, per, world: (torch.zeros(len(ids), dtype=torch.long), [len(ids)] + [0] * (world - 1)),
         "each of the"),
        (lambda ids, per, world: (torch.argsort(ids // per), [1] * world), "add to"),
        (lambda ids, per, world: torch.argsort(ids // per), "two things"),
        (lambda ids, per, world: (torch.argsort(ids // per).float(), [1.5] * world), "lists or integer tensors"),
    ],
)
def test_q3_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(ex.q3, reason_contains=diagnosis, dispatch_tokens=wrong)


def test_q3_a_string_instead_of_a_function_is_named():
    assert_incorrect(ex.q3, reason_contains="is a string", dispatch_tokens="expert_ids // experts_per_process")


def test_q3_bad_and_odd_answers_are_judged_never_crash():
    assert_handles_bad_answers(ex.q3, dispatch_tokens=dispatch_tokens)
    assert_odd_answers_are_judged(ex.q3, dispatch_tokens=dispatch_tokens)


# ---------------------------------------------------------------- the lesson shows each solution


@pytest.mark.parametrize("exercise, call", [(ex.q1, "ex.q4.check()"), (ex.q2, "ex.q5.check()"),
                                            (ex.q3, "ex.q6.check()")])
def test_the_lesson_shows_each_solution(exercise, call):
    assert_lesson_shows_the_solution(exercise, LESSON, call)
