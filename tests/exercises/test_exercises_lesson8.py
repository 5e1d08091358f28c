"""Lesson 8's exercises judge what the learner's function returns: right answers written several ways pass, each known mistake is named."""

import exercise_helpers
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

from course_utils.exercises import ____, lesson8

LESSON = lesson_path("08")


def learner_function(source, name):
    """Return what ``source`` binds to ``name``, as a notebook cell would (the lesson has imported torch)."""
    return exercise_helpers.learner_function(source, name, torch=torch)


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


@pytest.mark.parametrize("source, reason", [
    ("""
    def padding_waste(batches):
        ids = [b["input_ids"] for b in batches]
        return sum(int((i == 1).sum()) for i in ids) / sum(i.numel() for i in ids)
    """, "it guessed a pad id"),
    ("""
    def padding_waste(batches):
        ids = [b["input_ids"] for b in batches]
        return sum(int((i == -100).sum()) for i in ids) / sum(i.numel() for i in ids)
    """, "it guessed a pad id"),
    ("""
    def padding_waste(batches):
        masks = [b["attention_mask"] for b in batches]
        return f"{sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)}"
    """, "returned the text"),
    ("""
    def padding_waste(batches):
        for b in batches:
            b["attention_mask"][:, 0] = 0
        masks = [b["attention_mask"] for b in batches]
        return sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    """, "changed the batches it was given"),
    ("""
    def padding_waste(batches):
        masks = [b.pop("attention_mask") for b in batches]
        return sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    """, "changed the batches it was given"),
    ("""
    def padding_waste(batches):
        masks = [b["attention_mask"] for b in batches]
        waste = sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    """, "Did you forget `return`?"),
])
def test_q1_a_guessed_pad_id_a_string_a_changed_input_and_a_missing_return_each_get_their_own_words(source, reason):
    assert_incorrect(lesson8.q1, reason_contains=reason, padding_waste=learner_function(source, "padding_waste"))


def test_q1_a_string_instead_of_a_function_is_told_so():
    assert_incorrect(lesson8.q1, reason_contains="should be a function", padding_waste="0.25")


def test_q1_odd_answers_are_judged():
    assert_handles_bad_answers(lesson8.q1, padding_waste=learner_function(lesson8.q1.solution_code, "padding_waste"))
    assert_odd_answers_are_judged(lesson8.q1, padding_waste=learner_function(lesson8.q1.solution_code, "padding_waste"))


# ---------------------------------------------------------------- q2: the fastest set-up that fits


SEEDS = range(12)


@pytest.fixture(params=SEEDS)
def seeded_q2(request, monkeypatch):
    """q2 with the set-ups of one seed (the check draws new ones at every check otherwise)."""
    monkeypatch.setattr(lesson8.q2, "seed", request.param)
    return lesson8.q2


def test_q2_the_starter_is_not_attempted():
    assert_not_attempted(lesson8.q2, fastest_that_fits=____)


def test_q2_the_reference_is_correct(seeded_q2):
    assert_correct(seeded_q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))


def test_q2_a_loop_with_a_running_best_is_correct(seeded_q2):
    loop = """
    def fastest_that_fits(setups, budget_bytes):
        best, best_rate = None, 0
        for name, (timing, tokens, peak) in setups.items():
            rate = tokens / timing.median
            if peak <= budget_bytes and rate > best_rate:
                best, best_rate = name, rate
        return best
    """
    assert_correct(seeded_q2, fastest_that_fits=learner_function(loop, "fastest_that_fits"))


def _q2(condition="peak <= budget_bytes", rate="tokens / timing.median", none="None"):
    return learner_function(f"""
    def fastest_that_fits(setups, budget_bytes):
        fitting = {{name: {rate} for name, (timing, tokens, peak) in setups.items() if {condition}}}
        return max(fitting, key=fitting.get) if fitting else {none}
    """, "fastest_that_fits")


FIRST_THAT_FITS = learner_function("""
def fastest_that_fits(setups, budget_bytes):
    for name, (timing, tokens, peak) in setups.items():
        if peak <= budget_bytes:
            return name
    return None
""", "fastest_that_fits")


@pytest.mark.parametrize("answer, reason", [
    (_q2(condition="True"), "does not fit"),
    (_q2(condition="peak < budget_bytes"), "<="),
    (_q2(rate="-timing.median"), "time per step"),
    (_q2(rate="tokens / timing.minimum"), "median"),
    (_q2(rate="-peak"), "least memory"),
    (_q2(rate="(tokens, -timing.median)"), "most tokens per step"),
    (FIRST_THAT_FITS, "first set-up that fits"),
    (_q2(none="''"), "should return None"),
])
def test_q2_classic_mistakes_are_named_whatever_set_ups_the_check_draws(seeded_q2, answer, reason):
    assert_incorrect(seeded_q2, reason_contains=reason, fastest_that_fits=answer)


def test_q2_the_set_ups_carry_no_answer_in_their_order_or_tokens():
    """Over the seeds, the right answer sits at every position and is often not the set-up with the most tokens."""
    positions, most_tokens = set(), []
    for seed in SEEDS:
        for setups, budget in lesson8.draw_cases(seed):
            right = lesson8.fastest_that_fits_reference(setups, budget)
            if right is not None:
                positions.add(list(setups).index(right))
                fitting = [name for name, (_, _, peak) in setups.items() if peak <= budget]
                most_tokens.append(right == max(fitting, key=lambda name: setups[name][1]))
    assert positions == set(range(6))
    assert 0.2 < sum(most_tokens) / len(most_tokens) < 0.8


def test_q2_each_check_draws_new_set_ups_unless_a_seed_is_set():
    assert lesson8.q2.seed is None
    first, second = lesson8.q2.cases(), lesson8.q2.cases()
    assert [list(setups) for setups, _ in first] != [list(setups) for setups, _ in second]
    assert lesson8.draw_cases(3)[0][0].keys() == lesson8.draw_cases(3)[0][0].keys()


@pytest.mark.parametrize("source, reason", [
    ("""
    def fastest_that_fits(setups, budget_bytes):
        for name in [n for n, (_, _, peak) in setups.items() if peak > budget_bytes]:
            del setups[name]
        fitting = {name: tokens / timing.median for name, (timing, tokens, peak) in setups.items()}
        return max(fitting, key=fitting.get) if fitting else None
    """, "changed the set-ups it was given"),
    ("""
    def fastest_that_fits(setups, budget_bytes):
        fitting = {name: tokens / timing.median for name, (timing, tokens, peak) in setups.items() if peak <= budget_bytes}
        best = max(fitting, key=fitting.get) if fitting else None
    """, "Did you forget `return`?"),
    ("""
    def fastest_that_fits(setups, budget_bytes):
        return "the fastest one"
    """, "not one of the set-ups' names"),
])
def test_q2_a_changed_input_a_missing_return_and_a_made_up_name_get_their_own_words(seeded_q2, source, reason):
    assert_incorrect(seeded_q2, reason_contains=reason, fastest_that_fits=learner_function(source, "fastest_that_fits"))


def test_q2_a_string_instead_of_a_function_is_told_so():
    assert_incorrect(lesson8.q2, reason_contains="should be a function", fastest_that_fits="batch 32")


def test_q2_odd_answers_are_judged():
    assert_handles_bad_answers(lesson8.q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))
    assert_odd_answers_are_judged(lesson8.q2, fastest_that_fits=learner_function(lesson8.q2.solution_code, "fastest_that_fits"))
