"""Lesson 2's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right.

The wrong answers here are written the way a learner would write them (in place,
with other names), not copied from the exercise module, so that the checks are
shown to recognise a mistake by what it does.
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

from course_utils import REPO_DIR, adamw
from course_utils.exercises import ____, lesson2

# ---------------------------------------------------------------- q1: one AdamW step


def blank_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    exp_avg = ____
    exp_avg_sq = ____
    param = ____
    return param, exp_avg, exp_avg_sq


def right_step_in_place(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denominator = (exp_avg_sq / (1 - beta2**step)).sqrt() + eps
    param.mul_(1 - lr * weight_decay).addcdiv_(exp_avg / (1 - beta1**step), denominator, value=-lr)
    return param, exp_avg, exp_avg_sq


def make_step(bias_correction=(True, True), decay="decoupled", second_moment="grad**2", eps_inside=False, first_step=1):
    """Return a learner-style step with one mistake switched on."""

    def step_function(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        t = step - 1 + first_step
        if decay == "in the gradient":
            grad = grad + weight_decay * param
        m = beta1 * exp_avg + (1 - beta1) * grad
        quantity = {"grad**2": grad**2, "grad": grad, "m**2": m**2, "|grad|": grad.abs()}[second_moment]
        v = beta2 * exp_avg_sq + (1 - beta2) * quantity
        m_hat = m / (1 - beta1**t) if bias_correction[0] else m
        v_hat = v / (1 - beta2**t) if bias_correction[1] else v
        denominator = torch.sqrt(v_hat + eps) if eps_inside else torch.sqrt(v_hat) + eps
        new_param = param - lr * m_hat / denominator
        if decay == "decoupled":
            new_param = new_param - lr * weight_decay * param
        elif decay == "without lr":
            new_param = new_param - weight_decay * param
        return new_param, m, v

    return step_function


def right_step_with_torch_functions(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    m = torch.lerp(m, g, 1 - beta1)
    v = torch.addcmul(v * beta2, g, g, value=1 - beta2)
    update = (m / (1 - beta1**t)) / (torch.sqrt(v / (1 - beta2**t)) + eps)
    return p * (1 - lr * weight_decay) - lr * update, m, v


def right_step_with_math_and_a_list(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999,
                                    eps=1e-8, weight_decay=0.01):
    exp_avg = exp_avg * beta1 + grad * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    step_size = lr / (1 - beta1**step)
    denominator = exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step) + eps
    param = param * (1 - lr * weight_decay)
    return [param - step_size * exp_avg / denominator, exp_avg, exp_avg_sq]


@pytest.mark.parametrize("answer", [right_step_with_torch_functions, right_step_with_math_and_a_list],
                         ids=["torch functions", "math and a list"])
def test_q1_more_correct_steps_written_differently_pass(answer):
    assert_correct(lesson2.q1, my_adamw_step=answer)


def test_q1_storing_the_corrected_averages_is_named_as_such():
    def stores_corrected(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        exp_avg = (beta1 * exp_avg + (1 - beta1) * grad) / (1 - beta1**step)
        exp_avg_sq = (beta2 * exp_avg_sq + (1 - beta2) * grad**2) / (1 - beta2**step)
        param = param - lr * weight_decay * param - lr * exp_avg / (exp_avg_sq.sqrt() + eps)
        return param, exp_avg, exp_avg_sq

    result = assert_incorrect(lesson2.q1, reason_contains="returns the bias-corrected averages",
                              my_adamw_step=stores_corrected)
    assert "it should be" not in result.message


@pytest.mark.parametrize(
    "odd",
    [lambda *a, **k: (torch.ones(1), torch.ones(1), torch.ones(1)),
     lambda *a, **k: (torch.empty(4, 3, device="meta"),) * 3,
     lambda *a, **k: (torch.zeros(4, 3, dtype=torch.int64),) * 3,
     lambda *a, **k: np.ones((4, 3)),
     lambda *a, **k: (10**400, 1, 2)],
    ids=["wrong shape", "meta", "int tensors", "array", "huge int"],
)
def test_q1_odd_results_are_incorrect(odd):
    assert_incorrect(lesson2.q1, my_adamw_step=odd)


def test_q1_a_step_that_never_returns_is_stopped():
    class Quick(type(lesson2.q1)):
        time_limit_s = 0.5

    def endless(*args, **kwargs):
        while True:
            pass

    assert_incorrect(Quick(), reason_contains="still running after 0.5 s", my_adamw_step=endless)


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson2.q1, my_adamw_step=____)
    assert_not_attempted(lesson2.q1, my_adamw_step=blank_step)


@pytest.mark.parametrize("answer", [adamw.adamw_step, right_step_in_place, make_step()], ids=["course", "in place", "learner"])
def test_q1_steps_that_agree_with_torch_adamw_are_correct(answer):
    assert_correct(lesson2.q1, my_adamw_step=answer)


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (make_step(bias_correction=(False, False)), "no bias correction"),
        (make_step(bias_correction=(True, False)), "only the first moment"),
        (make_step(bias_correction=(False, True)), "only the second moment"),
        (make_step(decay="in the gradient"), "Adam with L2"),
        (make_step(decay="without lr"), "not scaled by the learning rate"),
        (make_step(second_moment="grad"), "averages the gradient itself"),
        (make_step(second_moment="|grad|"), "absolute value"),
        (make_step(second_moment="m**2"), "square of the first moment"),
        (make_step(eps_inside=True), "inside the square root"),
        (lambda param, grad, exp_avg, exp_avg_sq, step, **ignored: adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step),
         "default hyperparameters only"),
    ],
    ids=["no bias correction", "m only", "v only", "L2", "decay without lr", "v of g", "v of |g|", "v of m", "eps inside",
         "ignores arguments"],
)
def test_q1_usual_mistakes_are_diagnosed(answer, diagnosis):
    assert_incorrect(lesson2.q1, reason_contains=diagnosis, my_adamw_step=answer)


def test_q1_step_counted_from_zero_is_told_it_divides_by_zero():
    result = assert_incorrect(lesson2.q1, reason_contains="not finite", my_adamw_step=make_step(first_step=0))
    assert "step` is 1 on the first call" in result.message


def test_q1_an_unknown_mistake_points_at_the_first_tensor_that_differs():
    def wrong_first_moment(param, grad, exp_avg, exp_avg_sq, step, **hyperparameters):
        new_param, m, v = adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step, **hyperparameters)
        return new_param, 2 * m, v

    assert_incorrect(lesson2.q1, reason_contains="`exp_avg` differs", my_adamw_step=wrong_first_moment)


def test_q1_a_step_that_returns_the_wrong_things_is_told_what_to_return():
    def returns_param_only(param, grad, exp_avg, exp_avg_sq, step, **hyperparameters):
        return adamw.adamw_step(param, grad, exp_avg, exp_avg_sq, step, **hyperparameters)[0]

    assert_incorrect(lesson2.q1, reason_contains="return param, exp_avg, exp_avg_sq", my_adamw_step=returns_param_only)


def test_q1_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson2.q1, my_adamw_step=adamw.adamw_step)


def test_q1_every_known_mistake_really_differs_from_adamw():
    # Otherwise a diagnosis could fire on a right answer.
    for mistake, _ in lesson2.KNOWN_STEP_MISTAKES:
        differs = False
        for name in lesson2.STEP_PROBLEMS:
            initial_param, gradients, hyperparameters = lesson2.step_problem(name)
            theirs = adamw.run_steps(mistake, initial_param, gradients, **hyperparameters)
            expected = adamw.run_torch_adamw(initial_param, gradients, **hyperparameters)
            differs = differs or lesson2._first_difference(theirs, expected) is not None
        assert differs, mistake.__name__


def _step_dividing_by_zero_at_step_1(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999,
                                     eps=1e-8, weight_decay=0.01):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1 ** (step - 1))  # 1 - beta1**0 = 0 on the first call
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2 ** (step - 1))
    param = param - lr * weight_decay * param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
    return param, exp_avg, exp_avg_sq


def _step_returning_nan(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                        weight_decay=0.01):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    return param * float("nan"), exp_avg, exp_avg_sq


@pytest.mark.parametrize("broken", [_step_dividing_by_zero_at_step_1, _step_returning_nan])
def test_q1_a_step_that_gives_nan_or_infinity_is_named_never_accepted(broken):
    assert_incorrect(lesson2.q1, reason_contains="not finite (NaN or infinity)", my_adamw_step=broken)


# ---------------------------------------------------------------- q2: estimate the state

BERT = 108_311_810  # bert-base-cased, with its classification head
RIGHT_MIB = BERT * 8 / 1024**2


def test_q2_asks_about_bert_base_cased_counted_from_its_configuration():
    from accelerate import init_empty_weights
    from transformers import BertConfig, BertForSequenceClassification

    with init_empty_weights():
        bert = BertForSequenceClassification(BertConfig(vocab_size=28_996))
    assert sum(p.numel() for p in bert.parameters()) == BERT == lesson2.BERT_BASE_CASED_PARAMETERS


def test_q2s_answer_is_printed_nowhere_in_the_learner_copy():
    # The lesson measures distilbert-base-cased after the exercise: none of its outputs may show the answer.
    import json

    notebook = json.loads((REPO_DIR / "notebooks" / "02_adamw_ema_states.ipynb").read_text())
    texts = [
        "".join(output.get("text", "")) + "".join("".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/"))
        for cell in notebook["cells"] if cell["cell_type"] == "code" for output in cell.get("outputs", [])
    ]
    for form in (f"{RIGHT_MIB:.1f}", f"{RIGHT_MIB:,.1f}", f"{RIGHT_MIB:.0f}", f"{BERT * 8:,}"):
        assert not any(form in text for text in texts), form


def test_q2_blank_is_not_attempted():
    assert_not_attempted(lesson2.q2, estimated_mib=____)


@pytest.mark.parametrize("answer", [RIGHT_MIB, round(RIGHT_MIB), round(RIGHT_MIB, 1), torch.tensor(RIGHT_MIB),
                                    np.float32(RIGHT_MIB), np.array([[RIGHT_MIB]]), BERT * 2 * 4 / 2**20,
                                    torch.tensor(BERT, dtype=torch.float32) * 8 / 1024**2])
def test_q2_eight_bytes_per_parameter_in_mib_is_correct(answer):
    assert_correct(lesson2.q2, estimated_mib=answer)


@pytest.mark.parametrize(
    "bytes_per_parameter, divisor, diagnosis",
    [
        (4, 1024**2, "one state"),
        (12, 1024**2, "weights too"),
        (16, 1024**2, "whole training rule"),
        (64, 1024**2, "bits"),
        (8, 10**6, "MB (10**6 bytes)"),
        (8, 1, "in bytes"),
        (8, 1024, "KiB"),
        (8, 1024**3, "in GiB"),
        (2, 1, "elements"),
    ],
)
def test_q2_usual_mistakes_are_diagnosed_without_giving_the_answer(bytes_per_parameter, divisor, diagnosis):
    assert_incorrect(
        lesson2.q2, reason_contains=diagnosis, hides=round(RIGHT_MIB, 1),
        estimated_mib=BERT * bytes_per_parameter / divisor,
    )


def test_q2_a_wrong_value_in_a_one_by_one_array_is_diagnosed():
    assert_incorrect(lesson2.q2, reason_contains="one state", estimated_mib=np.array([[BERT * 4 / 1024**2]]))


@pytest.mark.parametrize("odd", [10**400, np.ones(2), torch.ones(2, 2), torch.zeros(0), "502", 1j])
def test_q2_odd_values_are_incorrect(odd):
    assert_incorrect(lesson2.q2, estimated_mib=odd)


@pytest.mark.parametrize("broken, named", [(float("nan"), "NaN"), (math.inf, "infinite"), (np.float32("inf"), "infinite"),
                                           (torch.tensor(float("nan")), "NaN")])
def test_q2_nan_and_infinity_are_named_never_accepted(broken, named):
    assert_incorrect(lesson2.q2, reason_contains=[named, "overflow"], estimated_mib=broken)


def test_q2_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson2.q2, estimated_mib=RIGHT_MIB)


# ---------------------------------------------------------------- q3: measure the state


def right_size(optimizer):
    num_elements, num_bytes, seen = 0, 0, set()
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                num_elements += value.untyped_storage().nbytes() // value.element_size()
                num_bytes += value.untyped_storage().nbytes()
    return num_elements, num_bytes


def first_view_only(optimizer):
    """The old reference answer: each storage once, but only as much of it as the first view shows."""
    num_elements, num_bytes, seen = 0, 0, set()
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                num_elements += value.numel()
                num_bytes += value.numel() * value.element_size()
    return num_elements, num_bytes


def test_q3_the_flat_buffer_case_is_one_storage_of_4040_bytes_and_rejects_the_first_view_answer():
    optimizer = lesson2._stepped(lambda p: lesson2.FlatBufferMomentum(p), lesson2._small_mlp, seed=0)
    views = [state["momentum_buffer"] for state in optimizer.state.values()]
    assert len(views) >= 2 and len({v.untyped_storage().data_ptr() for v in views}) == 1
    assert lesson2.q3.reference(optimizer) == (1_010, 4_040) == right_size(optimizer)
    assert first_view_only(optimizer)[1] < 4_040
    assert_incorrect(lesson2.q3, reason_contains="whole storage once", optimizer_state_size=first_view_only)


def counts_shared_tables_twice(optimizer):
    tensors = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def the_slides_way(optimizer):
    """Copies every tensor with torch.tensor(t), which warns."""
    num_elements, num_bytes = 0, 0
    for state in optimizer.state.values():
        for value in state.values():
            value = torch.tensor(value)
            num_elements += value.numel()
            num_bytes += value.numel() * value.element_size()
    return num_elements, num_bytes


def assumes_four_bytes(optimizer):
    num_elements, _ = right_size(optimizer)
    return num_elements, 4 * num_elements


def no_step_tensors(optimizer):
    elements, num_bytes = right_size(optimizer)
    steps = [s["step"] for s in optimizer.state.values() if torch.is_tensor(s.get("step"))]
    return elements - len(steps), num_bytes - sum(s.element_size() for s in steps)


def crashes_on_int_steps(optimizer):
    seen, elements, num_bytes = set(), 0, 0
    for state in optimizer.state.values():
        for value in state.values():
            if value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                elements += value.numel()
                num_bytes += value.numel() * value.element_size()
    return elements, num_bytes


def test_q3_blank_is_not_attempted():
    assert_not_attempted(lesson2.q3, optimizer_state_size=____)


def test_q3_counting_each_storage_once_is_correct():
    assert_correct(lesson2.q3, optimizer_state_size=right_size)


@pytest.mark.parametrize(
    "answer, diagnosis",
    [
        (counts_shared_tables_twice, "count each storage once"),
        (the_slides_way, "copies tensors"),
        (assumes_four_bytes, "4 bytes per element"),
        (no_step_tensors, "leaves out the `step` tensors"),
        (crashes_on_int_steps, "Python int"),
        (lambda optimizer: tuple(reversed(right_size(optimizer))), "swapped"),
        (lambda optimizer: (right_size(optimizer)[0], right_size(optimizer)[1] / 1024**2), "in MiB"),
        (lambda optimizer: right_size(optimizer)[1], "return two numbers"),
    ],
    ids=["shared twice", "copies", "4 bytes", "no step", "int step", "swapped", "MiB", "one number"],
)
def test_q3_usual_mistakes_are_diagnosed(answer, diagnosis):
    assert_incorrect(lesson2.q3, reason_contains=diagnosis, optimizer_state_size=answer)


def right_size_with_a_dict_of_storages(optimizer):
    storages = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                storages[storage.data_ptr()] = (storage.nbytes() // value.element_size(), storage.nbytes())
    return sum(n for n, _ in storages.values()), sum(b for _, b in storages.values())


def right_size_as_numpy_and_tensor(optimizer):
    elements, num_bytes = right_size(optimizer)
    return np.int64(elements), torch.tensor(num_bytes)


@pytest.mark.parametrize("answer", [right_size_with_a_dict_of_storages, right_size_as_numpy_and_tensor])
def test_q3_more_correct_answers_written_differently_pass(answer):
    assert_correct(lesson2.q3, optimizer_state_size=answer)


@pytest.mark.parametrize("odd", [lambda o: (10**400, 1), lambda o: (torch.ones(3), torch.ones(3)), lambda o: (None, None),
                                 lambda o: np.ones(2), lambda o: (float("nan"), float("nan")),
                                 lambda o: (right_size(o)[0], float("inf"))])
def test_q3_odd_results_are_incorrect(odd):
    assert_incorrect(lesson2.q3, optimizer_state_size=odd)


@pytest.mark.parametrize("broken", [lambda o: (float("nan"), float("nan")), lambda o: (right_size(o)[0], math.inf),
                                    lambda o: (torch.tensor(float("nan")), right_size(o)[1])])
def test_q3_nan_and_infinity_are_named_never_accepted(broken):
    assert_incorrect(lesson2.q3, reason_contains="a division by zero or an overflow?", optimizer_state_size=broken)


def test_q3_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson2.q3, optimizer_state_size=right_size)


def test_q3_shared_table_optimizer_really_shares_one_storage():
    optimizer = lesson2._stepped(lambda p: lesson2.SharedTableSGD(p, lr=0.1), lesson2._small_mlp, seed=0)
    tables = [state["table"] for state in optimizer.state.values()]
    assert len(tables) == 4 and all(t is tables[0] for t in tables)


# ---------------------------------------------------------------- all


def test_every_exercise_has_hints_and_a_solution_that_passes():
    namespace = {"torch": torch}
    for exercise in (lesson2.q1, lesson2.q2, lesson2.q3):
        assert exercise.hints and exercise.solution_text
    exec(lesson2.q1.solution_text, namespace)
    assert_correct(lesson2.q1, my_adamw_step=namespace["my_adamw_step"])
    exec(lesson2.q2.solution_text, {**namespace, "bert_parameters": BERT}, namespace)
    assert_correct(lesson2.q2, estimated_mib=namespace["estimated_mib"])
    exec(lesson2.q3.solution_text, namespace)
    assert_correct(lesson2.q3, optimizer_state_size=namespace["optimizer_state_size"])


@pytest.mark.parametrize("number", [1, 2, 3])
def test_the_solved_copy_shows_the_solution_the_check_prints(number):
    lesson = REPO_DIR / "lessons" / "02_adamw_ema_states.py"
    assert_lesson_shows_the_solution(getattr(lesson2, f"q{number}"), lesson, f"ex.q{number}.check()")


def test_odd_answers_to_every_exercise_are_judged_never_a_check_failure():
    assert_odd_answers_are_judged(lesson2.q1, my_adamw_step=adamw.adamw_step)
    assert_odd_answers_are_judged(lesson2.q2, estimated_mib=RIGHT_MIB)
    assert_odd_answers_are_judged(lesson2.q3, optimizer_state_size=right_size)
