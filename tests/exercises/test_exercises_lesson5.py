"""Lesson 5's exercises judge what the learner's code did: right answers written three ways pass, each known mistake is named."""

import dataclasses
import textwrap

import pytest
import torch
from accelerate import Accelerator
from exercise_helpers import assert_correct, assert_handles_bad_answers, assert_incorrect, assert_not_attempted

from course_utils import accelerate_state, levers
from course_utils.exercises import ____, lesson5

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow


def learner_function(source, name):
    """Return what ``source`` binds to ``name`` (a function, or the levers of q3), as a notebook cell would."""
    namespace = {"torch": torch, "Accelerator": Accelerator, "levers": levers, "accelerate_state": accelerate_state, "____": ____}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the test's own learner answers
    return namespace[name]


@pytest.fixture
def short_time_limit(monkeypatch):
    """A learner function that never returns is stopped after 2 s instead of a minute."""
    for exercise in (lesson5.q1, lesson5.q2, lesson5.q4):
        monkeypatch.setattr(exercise, "time_limit_s", 2.0)


def never_returns(*args, **kwargs):
    while True:
        pass


# ---------------------------------------------------------------- q1: accumulation

ACCUMULATE = """
def train_in_micro_batches(model, optimizer, lr_scheduler, micro_dataloader):
    accelerator = {accelerator}
    model, optimizer, micro_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, micro_dataloader, lr_scheduler)
    model.train()
    for step, batch in enumerate(micro_dataloader):
        {body}
"""
STEP_IN_ACCUMULATE = """with accelerator.accumulate(model):
            loss = model(**batch).loss
            {backward}
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()"""


def accumulating(accelerator="accelerate_state.fresh_accelerator(gradient_accumulation_steps=4)",
                 body=STEP_IN_ACCUMULATE, backward="accelerator.backward(loss)"):
    return learner_function(
        ACCUMULATE.format(accelerator=accelerator, body=body.format(backward=backward)), "train_in_micro_batches"
    )


def test_q1_the_starter_is_not_attempted():
    starter = accumulating("accelerate_state.fresh_accelerator(gradient_accumulation_steps=____)",
                           body=STEP_IN_ACCUMULATE.replace("accelerator.accumulate(model)", "____"))
    assert_not_attempted(lesson5.q1, train_in_micro_batches=starter)


def test_q1_the_reference_solution_is_correct():
    reference = learner_function(lesson5.q1.solution_code, "train_in_micro_batches")
    assert_correct(lesson5.q1, train_in_micro_batches=reference)


def test_q1_a_plain_accelerator_with_the_steps_computed_is_correct():
    assert_correct(lesson5.q1, train_in_micro_batches=accumulating("Accelerator(gradient_accumulation_steps=32 // 8)"))


def test_q1_accumulating_by_hand_is_correct():
    by_hand = """loss = model(**batch).loss / 4
        accelerator.backward(loss)
        if (step + 1) % 4 == 0:
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()"""
    assert_correct(lesson5.q1, train_in_micro_batches=accumulating("Accelerator()", body=by_hand))


def test_q1_the_step_outside_accumulate_is_named():
    no_context = STEP_IN_ACCUMULATE.replace("with accelerator.accumulate(model):", "if True:")
    assert_incorrect(lesson5.q1, reason_contains=["every micro-batch", "accumulate"],
                     train_in_micro_batches=accumulating(body=no_context))


def test_q1_the_wrong_number_of_accumulation_steps_is_named():
    assert_incorrect(lesson5.q1, reason_contains=["16 examples", "gradient_accumulation_steps"],
                     train_in_micro_batches=accumulating("accelerate_state.fresh_accelerator(gradient_accumulation_steps=2)"))


def test_q1_an_undivided_loss_is_named():
    assert_incorrect(lesson5.q1, reason_contains=["4.00 times", "accelerator.backward"],
                     train_in_micro_batches=accumulating(backward="loss.backward()"))


def test_q1_gradients_zeroed_on_every_micro_batch_are_named():
    zeroing = STEP_IN_ACCUMULATE.replace("loss = model(**batch).loss", "model.zero_grad()\n            loss = model(**batch).loss")
    assert_incorrect(lesson5.q1, reason_contains="zero_grad", train_in_micro_batches=accumulating(body=zeroing))


def test_q1_odd_answers_are_incorrect_not_a_crash(short_time_limit):
    reference = learner_function(lesson5.q1.solution_code, "train_in_micro_batches")
    assert_handles_bad_answers(lesson5.q1, train_in_micro_batches=reference)
    assert_incorrect(lesson5.q1, reason_contains="still running", train_in_micro_batches=never_returns)


# ---------------------------------------------------------------- q2: clipping

CLIPPED = """
def train_clipped(model, optimizer, lr_scheduler, train_dataloader, accelerator, max_grad_norm):
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
    model.train()
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            {before}
            loss = model(**batch).loss
            accelerator.backward(loss)
            {between}
            optimizer.step()
            {after}
            lr_scheduler.step()
            optimizer.zero_grad()
"""
CLIP = "accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)"
ON_UPDATE = f"if accelerator.sync_gradients: {CLIP}"


def clipped(before="pass", between="pass", after="pass"):
    return learner_function(CLIPPED.format(before=before, between=between, after=after), "train_clipped")


def test_q2_the_starter_is_not_attempted():
    assert_not_attempted(lesson5.q2, train_clipped=clipped(between="____"))


def test_q2_the_reference_solution_is_correct():
    assert_correct(lesson5.q2, train_clipped=learner_function(lesson5.q2.solution_code, "train_clipped"))


def test_q2_counting_the_micro_batches_instead_of_sync_gradients_is_correct():
    counted = f"if (step + 1) % accelerator.gradient_accumulation_steps == 0: {CLIP}"
    assert_correct(lesson5.q2, train_clipped=clipped(between=counted))


def test_q2_rescaling_the_gradient_by_hand_is_correct():
    by_hand = ("if accelerator.sync_gradients:\n"
               "                grads = [p.grad for p in model.parameters()]\n"
               "                scale = min(1.0, max_grad_norm / (torch.nn.utils.get_total_norm(grads).item() + 1e-6))\n"
               "                [g.mul_(scale) for g in grads]")
    assert_correct(lesson5.q2, train_clipped=clipped(between=by_hand))


def test_q2_torch_clip_grad_norm_on_the_update_is_correct():
    assert_correct(lesson5.q2, train_clipped=clipped(
        between="if accelerator.sync_gradients: torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)"))


def test_q2_no_clipping_is_named():
    assert_incorrect(lesson5.q2, reason_contains="nothing clipped it", train_clipped=clipped())


def test_q2_clipping_every_micro_batch_is_named():
    assert_incorrect(lesson5.q2, reason_contains=["partial sum", "sync_gradients"], train_clipped=clipped(between=CLIP))


@pytest.mark.parametrize("place, diagnosis", [("before", "before the backward"), ("after", "after the step")])
def test_q2_clipping_before_backward_or_after_the_step_is_named(place, diagnosis):
    # Each placement gets its own reason, read from the order of the recorded calls.
    assert_incorrect(lesson5.q2, reason_contains=diagnosis, train_clipped=clipped(**{place: ON_UPDATE}))


def test_q2_a_nan_threshold_is_named_not_accepted():
    # The answer that exposed issue 23: every parameter NaN, and `gap > tol` is False for NaN.
    for threshold in ("float('nan')", "max_grad_norm * float('nan')", "float('inf')"):
        assert_incorrect(lesson5.q2, reason_contains=["threshold", "NaN or infinite"], train_clipped=clipped(
            between=f"if accelerator.sync_gradients: accelerator.clip_grad_norm_(model.parameters(), {threshold})"))


def test_q2_a_loss_divided_by_zero_is_named():
    nan_loop = CLIPPED.replace("accelerator.backward(loss)", "accelerator.backward(loss / 0)")
    assert_incorrect(lesson5.q2, reason_contains="NaN or infinite",
                     train_clipped=learner_function(nan_loop.format(before="pass", between=ON_UPDATE, after="pass"),
                                                    "train_clipped"))


@pytest.mark.parametrize("per_parameter", [
    "if accelerator.sync_gradients:\n                for p in model.parameters(): accelerator.clip_grad_norm_(p, max_grad_norm)",
    "if accelerator.sync_gradients:\n                for p in model.parameters(): torch.nn.utils.clip_grad_norm_([p], max_grad_norm)",
    "if accelerator.sync_gradients:\n                for m in model.modules(): accelerator.clip_grad_norm_(m.parameters(recurse=False), max_grad_norm)",
])
def test_q2_clipping_each_parameter_separately_is_named(per_parameter):
    assert_incorrect(lesson5.q2, reason_contains="separately", train_clipped=clipped(between=per_parameter))


@pytest.mark.parametrize("threshold", ["1.0", "0.5", "0.01"])
def test_q2_a_typed_in_threshold_in_the_right_place_is_named(threshold):
    assert_incorrect(lesson5.q2, reason_contains=["not to `max_grad_norm`", "typed in"], train_clipped=clipped(
        between=f"if accelerator.sync_gradients: accelerator.clip_grad_norm_(model.parameters(), {threshold})"))


@pytest.mark.parametrize("clamped", ["loss = loss.clamp(max=max_grad_norm)", "loss = torch.clamp(loss, 0, max_grad_norm)",
                                     "loss = loss * max_grad_norm"])
def test_q2_clamping_or_scaling_the_loss_is_named(clamped):
    loop = CLIPPED.replace("            accelerator.backward(loss)", f"            {clamped}\n            accelerator.backward(loss)")
    assert_incorrect(lesson5.q2, reason_contains=["No clipping function ran", "loss"],
                     train_clipped=learner_function(loop.format(before="pass", between="pass", after="pass"),
                                                    "train_clipped"))


def test_q2_clipping_each_value_is_named():
    assert_incorrect(lesson5.q2, reason_contains="each value", train_clipped=clipped(
        between="if accelerator.sync_gradients: torch.nn.utils.clip_grad_value_(model.parameters(), max_grad_norm)"))


def test_q2_clipping_with_a_list_or_the_keyword_is_correct():
    for call in ("accelerator.clip_grad_norm_(list(model.parameters()), max_norm=max_grad_norm)",
                 "torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_grad_norm)"):
        assert_correct(lesson5.q2, train_clipped=clipped(between=f"if accelerator.sync_gradients: {call}"))


def test_q2_odd_answers_are_incorrect_not_a_crash(short_time_limit):
    assert_handles_bad_answers(lesson5.q2, train_clipped=learner_function(lesson5.q2.solution_code, "train_clipped"))
    assert_incorrect(lesson5.q2, reason_contains="still running", train_clipped=never_returns)


# ---------------------------------------------------------------- q3: fit BERT-large


def test_q3_the_reference_levers_fit():
    assert_correct(lesson5.q3, bert_large_levers=learner_function(lesson5.q3.solution_code, "bert_large_levers"))


def test_q3_bf16_autocast_with_checkpointing_and_four_micro_batches_also_fits():
    assert_correct(lesson5.q3, bert_large_levers=levers.Levers(
        mixed_precision="bf16", activation_checkpointing=True, micro_batch_size=8, gradient_accumulation_steps=4))


def test_q3_accumulation_alone_is_over_budget():
    assert_incorrect(lesson5.q3, reason_contains=["above", "activations"],
                     bert_large_levers=levers.Levers(micro_batch_size=8, gradient_accumulation_steps=4))


def test_q3_checkpointing_in_fp32_with_more_micro_batches_also_fits():
    assert_correct(lesson5.q3, bert_large_levers=levers.Levers(
        activation_checkpointing=True, micro_batch_size=4, gradient_accumulation_steps=8))


def test_q3_bf16_autocast_with_checkpointing_and_two_micro_batches_also_fits():
    assert_correct(lesson5.q3, bert_large_levers=levers.Levers(
        mixed_precision="bf16", activation_checkpointing=True, micro_batch_size=16, gradient_accumulation_steps=2))


def test_q3_no_levers_is_over_budget_and_names_the_activations():
    assert_incorrect(lesson5.q3, reason_contains=["above", "activations"],
                     bert_large_levers=levers.Levers(micro_batch_size=32))


@pytest.mark.parametrize(
    "levers_, diagnosis",
    [
        (levers.Levers(train="lora", micro_batch_size=32), "only part of the model"),
        (levers.Levers(train="head", micro_batch_size=32), "only part of the model"),
        (levers.Levers(bf16_weights=True, activation_checkpointing=True, micro_batch_size=8,
                        gradient_accumulation_steps=4), "vanish"),
        (levers.Levers(activation_checkpointing=True, micro_batch_size=8), "8 x 1 = 8 sequences"),
    ],
)
def test_q3_known_mistakes_are_named(levers_, diagnosis):
    assert_incorrect(lesson5.q3, reason_contains=diagnosis, bert_large_levers=levers_)


def test_q3_blank_and_odd_answers():
    assert_not_attempted(lesson5.q3, bert_large_levers=____)
    for odd in (None, "bf16", {"mixed_precision": "bf16"}, 32):
        assert_incorrect(lesson5.q3, reason_contains="levers.Levers", bert_large_levers=odd)


# ---------------------------------------------------------------- q4: resume

RESUME = """
def resume(model, optimizer, lr_scheduler, train_dataloader, accelerator, checkpoint_folder, completed_steps):
    {before}
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
    {load}
    model.train()
    for step, batch in enumerate({batches}):
        {skip}
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
"""
SKIPPED = "accelerator.skip_first_batches(train_dataloader, completed_steps)"


def resuming(before="pass", load="accelerator.load_state(checkpoint_folder)", batches=SKIPPED, skip="pass"):
    return learner_function(RESUME.format(before=before, load=load, batches=batches, skip=skip), "resume")


def test_q4_the_starter_is_not_attempted():
    assert_not_attempted(lesson5.q4, resume=resuming(load="____", batches="____"))


def test_q4_the_reference_solution_is_correct():
    assert_correct(lesson5.q4, resume=learner_function(lesson5.q4.solution_code, "resume"))


def test_q4_skipping_by_counting_the_steps_is_correct():
    assert_correct(lesson5.q4, resume=resuming(batches="train_dataloader",
                                               skip="if step < completed_steps: continue"))


def test_q4_loading_with_the_keyword_is_correct():
    assert_correct(lesson5.q4, resume=resuming(load="accelerator.load_state(input_dir=str(checkpoint_folder))"))


def test_q4_a_state_never_loaded_is_named():
    assert_incorrect(lesson5.q4, reason_contains="never loaded", resume=resuming(load="pass"))


def test_q4_loading_before_prepare_is_named():
    assert_incorrect(lesson5.q4, reason_contains="before `prepare`",
                     resume=resuming(before="accelerator.load_state(checkpoint_folder)", load="pass"))


@pytest.mark.parametrize("batches", ["train_dataloader", "accelerator.skip_first_batches(train_dataloader, completed_steps - 1)"])
def test_q4_batches_not_skipped_or_skipped_wrongly_are_named(batches):
    assert_incorrect(lesson5.q4, reason_contains="skip_first_batches", resume=resuming(batches=batches))


@pytest.mark.parametrize("broken", ["loss = loss / 0", "loss = loss * float('inf')", "loss = loss * float('nan')"])
def test_q4_a_loop_that_makes_the_parameters_nan_is_named(broken):
    loop = RESUME.replace("        accelerator.backward(loss)", f"        {broken}\n        accelerator.backward(loss)")
    assert_incorrect(lesson5.q4, reason_contains="NaN or infinite", resume=learner_function(
        loop.format(before="pass", load="accelerator.load_state(checkpoint_folder)", batches=SKIPPED, skip="pass"),
        "resume"))


def test_q1_a_loss_divided_by_zero_is_named():
    assert_incorrect(lesson5.q1, reason_contains="NaN or infinite",
                     train_in_micro_batches=accumulating(backward="accelerator.backward(loss / 0)"))


def test_q4_odd_answers_are_incorrect_not_a_crash(short_time_limit):
    assert_handles_bad_answers(lesson5.q4, resume=learner_function(lesson5.q4.solution_code, "resume"))
    assert_incorrect(lesson5.q4, reason_contains="still running", resume=never_returns)


def test_interrupted_training_leaves_a_saved_state_after_its_completed_steps():
    folder, completed = lesson5.interrupted_training()
    assert completed == lesson5.RESUME_AFTER
    assert folder.endswith(f"step_{completed}")
    import os

    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= set(os.listdir(folder))


@pytest.mark.parametrize("peak", [float("nan"), float("inf")])
def test_q3_a_plan_whose_peak_is_not_a_number_is_not_accepted(monkeypatch, peak):
    # The check accepts only on a positive test (peak <= budget): a NaN peak is not "within the budget".
    real_plan = levers.plan_with_levers

    def plan_with_a_broken_peak(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        return dataclasses.replace(plan, peak=peak)

    monkeypatch.setattr(levers, "plan_with_levers", plan_with_a_broken_peak)
    assert_incorrect(lesson5.q3, reason_contains="not a number of bytes", bert_large_levers=learner_function(
        lesson5.q3.solution_code, "bert_large_levers"))
