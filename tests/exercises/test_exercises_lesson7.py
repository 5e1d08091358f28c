"""Lesson 7's exercises judge known answers against launched runs: blank, wrong (with the diagnosis), right."""

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

from course_utils.exercises import ____, lesson7

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

LESSON = lesson_path("07")


# ---------------------------------------------------------------- q1: optimizer bytes under ZeRO-1 on 3 processes


def reference_bytes(shapes):
    return sum(2 * 4 * math.prod(shape) + 4 for shape in shapes)


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson7.q1, optimizer_bytes=lambda shapes: ____)


def test_q1_reference_is_correct_for_every_process_of_the_launched_run():
    assert_correct(lesson7.q1, optimizer_bytes=reference_bytes)


def test_q1_another_correct_form_passes():
    def optimizer_bytes(shapes):
        total = 0
        for shape in shapes:
            elements = 1
            for size in shape:
                elements *= size
            total += 4 * elements * 2 + 4
        return float(total)

    assert_correct(lesson7.q1, optimizer_bytes=optimizer_bytes)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [
        (lambda shapes: sum(8 * math.prod(s) for s in shapes), "step"),
        (lambda shapes: sum(4 * math.prod(s) + 4 for s in shapes), "two"),
        (lambda shapes: sum(2 * math.prod(s) + 1 for s in shapes), "counts elements"),
        (lambda shapes: sum(16 * math.prod(s) + 4 for s in shapes), "optimizer state only"),
        (lambda shapes: math.nan, "no number"),
        (lambda shapes: math.inf, "no number"),
        (lambda shapes: torch.tensor(math.nan), "no number"),
        (lambda shapes: 1_000_000, "not the bytes"),
        (lambda shapes: None, "returned None"),
        (lambda shapes: f"{reference_bytes(shapes):,}", "returned a string"),
    ],
)
def test_q1_classic_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson7.q1, reason_contains=diagnosis, optimizer_bytes=wrong)


def test_q1_a_string_instead_of_a_function_is_named():
    assert_incorrect(lesson7.q1, reason_contains="is a string", optimizer_bytes="2 * 4 * math.prod(shape) + 4")


def test_q1_bad_and_odd_answers_are_judged_never_crash():
    assert_handles_bad_answers(lesson7.q1, optimizer_bytes=reference_bytes)
    assert_odd_answers_are_judged(lesson7.q1, optimizer_bytes=reference_bytes)


def test_zero1_assignment_gives_each_of_three_processes_whole_tensors_that_cover_the_model():
    assignment = lesson7.zero1_assignment(3)
    assert len(assignment) == 3 and all(assignment)
    owned = sum(math.prod(shape) for shapes in assignment for shape in shapes)
    model = lesson7.sharding.course_model()
    assert owned == sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- q2: fully_shard per block, then the root


def shard_per_block(model, mesh):
    for block in model.distilbert.transformer.layer:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def test_q2_reference_is_correct():
    assert_correct(lesson7.q2, shard=shard_per_block)


def test_q2_blocks_found_another_way_are_correct():
    def shard(model, mesh):
        for module in list(model.modules()):
            if type(module).__name__ == "TransformerBlock":
                fully_shard(module, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    assert_correct(lesson7.q2, shard=shard)


def test_q2_root_only_is_named():
    def shard(model, mesh):
        fully_shard(model, mesh=mesh)
        return model

    assert_incorrect(lesson7.q2, reason_contains="Only one unit", shard=shard)


def test_q2_blocks_without_the_root_are_named():
    def shard(model, mesh):
        for block in model.distilbert.transformer.layer:
            fully_shard(block, mesh=mesh)
        return model

    assert_incorrect(lesson7.q2, reason_contains="outside them", shard=shard)


def test_q2_only_the_first_block_and_the_root_is_named():
    """Half of the parameters per process and two units, yet block 1 is gathered with the root: refused."""

    def shard(model, mesh):
        fully_shard(model.distilbert.transformer.layer[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    assert_incorrect(lesson7.q2, reason_contains="Block 1 of the 2", shard=shard)


def test_q2_only_the_embeddings_and_the_root_is_named():
    def shard(model, mesh):
        fully_shard(model.distilbert.embeddings, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    assert_incorrect(lesson7.q2, reason_contains="Blocks 0, 1 of the 2", shard=shard)


def test_every_block_needs_a_unit_inside_it_whatever_the_depth():
    model = lesson7.sharding.course_model()
    depth = len(lesson7.sharding.sharded_blocks(model))
    every_block = [f"distilbert.transformer.layer.{index}" for index in range(depth)]
    assert lesson7.blocks_without_a_unit(("", *every_block), model) == []
    assert lesson7.blocks_without_a_unit(("", every_block[0]), model) == list(range(1, depth))
    assert lesson7.blocks_without_a_unit(("",), model) == list(range(depth))
    # finer units inside every block gather each block apart from the rest: accepted
    finer = [f"{name}.{part}" for name in every_block for part in ("attention", "ffn", "sa_layer_norm",
                                                                     "output_layer_norm")]
    assert lesson7.blocks_without_a_unit(("", *finer), model) == []
    # one block's attention alone leaves the rest of that block with the root
    assert lesson7.blocks_without_a_unit(("", *every_block[1:], f"{every_block[0]}.attention"), model) == [0]


def test_q2_forgetting_return_model_is_named():
    def shard(model, mesh):
        for block in model.distilbert.transformer.layer:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    assert_incorrect(lesson7.q2, reason_contains="`return model`", shard=shard)


def test_q2_a_string_instead_of_a_function_is_named():
    assert_incorrect(lesson7.q2, reason_contains="is a string", shard="fully_shard(model, mesh=mesh)")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_q2_parameters_made_nan_or_infinite_fail(value):
    def shard(model, mesh):
        with torch.no_grad():
            model.classifier.weight.fill_(value)
        return shard_per_block(model, mesh)

    assert_incorrect(lesson7.q2, reason_contains="not finite", shard=shard)


def test_q2_a_shard_that_never_returns_is_stopped_and_named():
    # The check's limit cut from two minutes to 20 s: the workers are stopped at it, and the learner told why.
    assert_a_hang_is_stopped(lesson7.q2, "shard", 20.0, "same modules")


def test_q2_nothing_sharded_is_named():
    assert_incorrect(lesson7.q2, reason_contains="No module was sharded", shard=lambda model, mesh: model)


def test_q2_blank_and_bad_answers_are_judged():
    assert_not_attempted(lesson7.q2, shard=____)
    assert_handles_bad_answers(lesson7.q2, shard=shard_per_block)


@pytest.mark.parametrize("number", [1, 2])
def test_lesson_shows_each_solution(number):
    assert_lesson_shows_the_solution(getattr(lesson7, f"q{number}"), LESSON, f"ex.q{number}.check()")
