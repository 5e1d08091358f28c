"""Lesson 9's exercises judge known answers against launched runs: blank, wrong (with the diagnosis), right."""

import math

import pytest
import torch
from exercise_helpers import (
    assert_a_hang_is_stopped,
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_not_attempted,
    assert_odd_answers_are_judged,
    lesson_path,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from course_utils import tensor_parallel
from course_utils.exercises import ____, lesson9

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

LESSON = lesson_path("09")


# ---------------------------------------------------------------- q1: split the MLP column- then row-wise


def split_mlp(mlp, rank, world_size):
    n = mlp.up.out_features // world_size
    mine = slice(rank * n, (rank + 1) * n)
    return mlp.up.weight[mine], mlp.up.bias[mine], mlp.down.weight[:, mine]


def test_q1_reference_is_correct():
    assert_correct(lesson9.q1, split_mlp=split_mlp)


def test_q1_chunks_are_another_correct_form():
    def chunks(mlp, rank, world_size):
        return (mlp.up.weight.chunk(world_size, 0)[rank], mlp.up.bias.chunk(world_size)[rank],
                mlp.down.weight.chunk(world_size, 1)[rank])

    assert_correct(lesson9.q1, split_mlp=chunks)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda mlp, r, n: (mlp.up.weight.chunk(n, 1)[r], mlp.up.bias.chunk(n)[r], mlp.down.weight.chunk(n, 1)[r]),
         "**rows** of `up.weight`"),
        (lambda mlp, r, n: (mlp.up.weight.chunk(n, 0)[r], mlp.up.bias.chunk(n)[r], mlp.down.weight.chunk(n, 0)[r]),
         "**columns** of `down.weight`"),
        (lambda mlp, r, n: (mlp.up.weight.chunk(n, 0)[r], mlp.up.bias, mlp.down.weight.chunk(n, 1)[r]), "`up_bias`"),
        (lambda mlp, r, n: (mlp.up.weight, mlp.up.bias, mlp.down.weight), "whole of `up.weight`"),
        (lambda mlp, r, n: (mlp.up.weight.chunk(n, 0)[r], mlp.up.bias.chunk(n)[r], mlp.down.weight), "whole of `down"),
        (lambda mlp, r, n: split_mlp(mlp, 0, n), "same share"),
        (lambda mlp, r, n: (*split_mlp(mlp, r, n)[:2], split_mlp(mlp, 1 - r, n)[2]), "*same* hidden units"),
        (lambda mlp, r, n: tuple(t * math.nan for t in split_mlp(mlp, r, n)), "not finite"),
        (lambda mlp, r, n: tuple(t * math.inf for t in split_mlp(mlp, r, n)), "not finite"),
        (lambda mlp, r, n: split_mlp(mlp, r, n)[:2], "three tensors"),
        (lambda mlp, r, n: None, "three tensors"),
    ],
)
def test_q1_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson9.q1, reason_contains=diagnosis, split_mlp=wrong)


def test_q1_blank_and_bad_answers_are_judged():
    assert_not_attempted(lesson9.q1, split_mlp=lambda mlp, rank, world_size: ____)
    assert_handles_bad_answers(lesson9.q1, split_mlp=split_mlp)


def test_q1_a_split_that_never_returns_is_stopped_and_named():
    # The check's limit cut from two minutes to 20 s: the workers are stopped at it, and the learner told why.
    assert_a_hang_is_stopped(lesson9.q1, "split_mlp", 20.0, "return on every process")


def test_q1_a_function_that_raises_in_the_workers_is_named():
    def broken(mlp, rank, world_size):
        raise IndexError("my bug")

    assert_incorrect(lesson9.q1, reason_contains="failed in a worker", split_mlp=broken)


# ---------------------------------------------------------------- q2: a pipeline stage's activation peak


def activation_peak(schedule, stage, num_stages, num_microbatches, microbatch_bytes):
    if schedule == "GPipe":
        return num_microbatches * microbatch_bytes
    return min(num_stages - stage, num_microbatches) * microbatch_bytes


def test_q2_reference_is_correct_for_every_stage_of_the_launched_run():
    assert_correct(lesson9.q2, activation_peak=activation_peak)


def test_q2_walking_the_schedule_is_another_correct_form():
    from course_utils import pipeline

    def walk(schedule, stage, num_stages, num_microbatches, microbatch_bytes):
        alive = most = 0
        for kind, _ in pipeline.SCHEDULES[schedule](stage, num_stages, num_microbatches):
            alive += 1 if kind == "F" else -1
            most = max(most, alive)
        return float(most * microbatch_bytes)

    assert_correct(lesson9.q2, activation_peak=walk)


def gpipe_then(one_f_one_b):
    return lambda schedule, s, p, m, b: m * b if schedule == "GPipe" else one_f_one_b(s, p, m, b)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda schedule, s, p, m, b: min(p - s, m) * b, "every forward pass before"),
        (lambda schedule, s, p, m, b: p * b, "every forward pass before"),
        (gpipe_then(lambda s, p, m, b: m * b), "that is GPipe's peak"),
        (gpipe_then(lambda s, p, m, b: min(p, m) * b), "depends on `stage`"),
        (gpipe_then(lambda s, p, m, b: (p - s) * b), "more micro-batches than the batch has"),
        (gpipe_then(lambda s, p, m, b: max(p - s - 1, 1) * b), "one more forward"),
        (lambda schedule, s, p, m, b: m if schedule == "GPipe" else min(p - s, m), "multiply it by"),
        (lambda schedule, s, p, m, b: math.nan, "no number"),
        (lambda schedule, s, p, m, b: torch.tensor(math.inf), "no number"),
        (lambda schedule, s, p, m, b: "8 MiB", "one number"),
    ],
)
def test_q2_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson9.q2, reason_contains=diagnosis, activation_peak=wrong)


def test_q2_blank_bad_and_odd_answers_are_judged():
    assert_not_attempted(lesson9.q2, activation_peak=lambda schedule, s, p, m, b: ____)
    assert_handles_bad_answers(lesson9.q2, activation_peak=activation_peak)
    assert_odd_answers_are_judged(lesson9.q2, activation_peak=activation_peak)


# ---------------------------------------------------------------- q3: FSDP x TP on a 2 x 2 mesh


def layout(model, mesh):
    for block in model:
        parallelize_module(block, mesh["tp"], tensor_parallel.block_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def test_q3_reference_is_correct():
    assert_correct(lesson9.q3, fsdp_by_tp=layout)


def swapped(model, mesh):
    for block in model:
        parallelize_module(block, mesh["dp"], tensor_parallel.block_plan())
        fully_shard(block, mesh=mesh["tp"])
    return model


def tensor_parallel_only(model, mesh):
    for block in model:
        parallelize_module(block, mesh["tp"], tensor_parallel.block_plan())
    return model


def fsdp_only(model, mesh):
    for block in model:
        fully_shard(block, mesh=mesh["dp"])
    return model


def first_block_split_only(model, mesh):
    parallelize_module(model[0], mesh["tp"], tensor_parallel.block_plan())
    for block in model:
        fully_shard(block, mesh=mesh["dp"])
    return model


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [(swapped, "swapped"), (tensor_parallel_only, "No all-gather"), (fsdp_only, "No all-reduce"),
     (first_block_split_only, "every block needs both calls")],
)
def test_q3_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson9.q3, reason_contains=diagnosis, fsdp_by_tp=wrong)


def test_q3_the_blocks_as_children_and_the_dimensions_by_name_are_another_correct_form():
    def by_name(model, mesh):
        tp, dp = (mesh[name] for name in ("tp", "dp"))
        for block in model.children():
            parallelize_module(block, tp, tensor_parallel.block_plan())
            fully_shard(block, mesh=dp)
        return fully_shard(model, mesh=dp)

    assert_correct(lesson9.q3, fsdp_by_tp=by_name)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_q3_weights_made_nan_or_infinite_fail(value):
    def poisoned(model, mesh):
        with torch.no_grad():
            model[0].mlp.up.weight.fill_(value)
        return layout(model, mesh)

    assert_incorrect(lesson9.q3, reason_contains="differs from one process", fsdp_by_tp=poisoned)


def test_q3_a_layout_that_never_returns_is_stopped_and_named():
    assert_a_hang_is_stopped(lesson9.q3, "fsdp_by_tp", 20.0, "same calls")


def test_q3_blank_and_bad_answers_are_judged():
    assert_not_attempted(lesson9.q3, fsdp_by_tp=____)
    assert_handles_bad_answers(lesson9.q3, fsdp_by_tp=layout)


# ---------------------------------------------------------------- the lesson shows each solution


@pytest.mark.parametrize("exercise, call", [(lesson9.q1, "ex.q1.check()"), (lesson9.q2, "ex.q2.check()"),
                                            (lesson9.q3, "ex.q3.check()")])
def test_the_lesson_shows_each_solution(exercise, call):
    assert_lesson_shows_the_solution(exercise, LESSON, call)
