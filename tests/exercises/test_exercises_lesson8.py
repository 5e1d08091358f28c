"""Lesson 8's exercises judge what the learner's function returns: right answers written several ways pass, each known mistake is named."""

import textwrap
from pathlib import Path

import pytest
import torch
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_not_attempted,
    assert_odd_answers_are_judged,
)

from course_utils.exercises import ____, lesson8

LESSON = Path(__file__).resolve().parents[2] / "lessons" / "08_speed.py"


def learner_function(source, name):
    """Return what ``source`` binds to ``name``, as a notebook cell would."""
    namespace = {"torch": torch, "____": ____}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the test's own learner answers
    return namespace[name]


@pytest.mark.parametrize("number", [1, 2])
def test_the_lesson_shows_each_reference_solution(number):
    assert_lesson_shows_the_solution(getattr(lesson8, f"q{number}"), LESSON, f"ex.q{number}.check()")


# ---------------------------------------------------------------- q1: padding waste


def test_q1_the_starter_is_not_attempted():
    assert_not_attempted(lesson8.q1, padding_waste=____)
    assert_not_attempted(lesson8.q1, padding_waste=lambda batches: ____)


def test_q1_the_reference_is_correct():
    assert_correct(lesson8.q1, padding_waste=learner_function(lesson8.q1.solution_code, "padding_waste"))


def test_q1_other_correct_forms_pass():
    counting_zeros = """
    def padding_waste(batches):
        masks = [b["attention_mask"] for b in batches]
        return sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    """
    as_tensor = """
    def padding_waste(batches):
        masks = torch.cat([b["attention_mask"].flatten() for b in batches]).float()
        return 1 - masks.mean()
    """
    assert_correct(lesson8.q1, padding_waste=learner_function(counting_zeros, "padding_waste"))
    assert_correct(lesson8.q1, padding_waste=learner_function(as_tensor, "padding_waste"))


@pytest.mark.parametrize("source, reason", [
    ("""
    def padding_waste(batches):
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        return real / sum(b["attention_mask"].numel() for b in batches)
    """, "real"),
    ("""
    def padding_waste(batches):
        masks = [b["attention_mask"] for b in batches]
        return 100 * sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    """, "percentage"),
    ("""
    def padding_waste(batches):
        shares = [1 - b["attention_mask"].float().mean().item() for b in batches]
        return sum(shares) / len(shares)
    """, "mean of each batch"),
    ("""
    def padding_waste(batches):
        ids = [b["input_ids"] for b in batches]
        return sum(int((i == 0).sum()) for i in ids) / sum(i.numel() for i in ids)
    """, "pad id"),
    ("""
    def padding_waste(batches):
        return float("nan")
    """, "NaN"),
])
def test_q1_classic_mistakes_are_named(source, reason):
    assert_incorrect(lesson8.q1, reason_contains=reason, padding_waste=learner_function(source, "padding_waste"))


def test_q1_odd_answers_are_judged():
    assert_handles_bad_answers(lesson8.q1, padding_waste=learner_function(lesson8.q1.solution_code, "padding_waste"))
    assert_odd_answers_are_judged(lesson8.q1, padding_waste=learner_function(lesson8.q1.solution_code, "padding_waste"))


# ---------------------------------------------------------------- q2: the fastest set-up that fits


def test_q2_the_starter_is_not_attempted():
    assert_not_attempted(lesson8.q2, fastest_that_fits=____)


def test_q2_the_reference_is_correct():
    assert_correct(lesson8.q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))


def test_q2_a_loop_with_a_running_best_is_correct():
    loop = """
    def fastest_that_fits(setups, budget_bytes):
        best, best_rate = None, 0
        for name, (timing, tokens, peak) in setups.items():
            rate = tokens / timing.median
            if peak <= budget_bytes and rate > best_rate:
                best, best_rate = name, rate
        return best
    """
    assert_correct(lesson8.q2, fastest_that_fits=learner_function(loop, "fastest_that_fits"))


def _q2(condition="peak <= budget_bytes", rate="tokens / timing.median", none="None"):
    return learner_function(f"""
    def fastest_that_fits(setups, budget_bytes):
        fitting = {{name: {rate} for name, (timing, tokens, peak) in setups.items() if {condition}}}
        return max(fitting, key=fitting.get) if fitting else {none}
    """, "fastest_that_fits")


@pytest.mark.parametrize("answer, reason", [
    (_q2(condition="True"), "does not fit"),
    (_q2(condition="peak < budget_bytes"), "<="),
    (_q2(rate="-timing.median"), "time per step"),
    (_q2(rate="tokens / timing.minimum"), "median"),
    (_q2(rate="-peak"), "least memory"),
    (_q2(none="''"), "should return None"),
])
def test_q2_classic_mistakes_are_named(answer, reason):
    assert_incorrect(lesson8.q2, reason_contains=reason, fastest_that_fits=answer)


def test_q2_odd_answers_are_judged():
    assert_handles_bad_answers(lesson8.q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))
    assert_odd_answers_are_judged(lesson8.q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))
