"""Lesson 1's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right."""

import importlib.util
import textwrap

import pytest
from accelerate import Accelerator
from exercise_helpers import assert_correct, assert_handles_bad_answers, assert_incorrect, assert_not_attempted

from course_utils.exercises import ____, lesson1

# ---------------------------------------------------------------- q1: warm-up steps

EPOCHS, BATCHES = 4, 94  # 376 steps in all: 10% is 37.6, so 37 (int) or 38 (round)


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson1.q1, num_warmup_steps=____, num_epochs=EPOCHS, num_batches_per_epoch=BATCHES)


def test_q1_ten_percent_of_all_steps_is_correct():
    assert_correct(lesson1.q1, num_warmup_steps=37, num_epochs=EPOCHS, num_batches_per_epoch=BATCHES)


def test_q1_rounding_instead_of_truncating_is_also_accepted():
    assert_correct(lesson1.q1, num_warmup_steps=38, num_epochs=EPOCHS, num_batches_per_epoch=BATCHES)


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [(9, "one epoch"), (376, "every training step"), (37.6, "float"), (10, "fraction"), (100, "not 10%")],
)
def test_q1_typical_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(
        lesson1.q1, reason_contains=diagnosis, hides=37,
        num_warmup_steps=wrong, num_epochs=EPOCHS, num_batches_per_epoch=BATCHES,
    )


def test_q1_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson1.q1, num_warmup_steps=37, num_epochs=EPOCHS, num_batches_per_epoch=BATCHES)


# ---------------------------------------------------------------- q2: prepare


def prepared_objects(skip=()):
    accelerator = Accelerator()
    objects = dict(zip(["model", "optimizer", "train_dataloader", "lr_scheduler"], lesson1.fresh_training_objects()))
    to_prepare = [name for name in objects if name not in skip]
    prepared = accelerator.prepare(*[objects[name] for name in to_prepare])
    prepared = prepared if isinstance(prepared, tuple) else (prepared,)
    objects.update(zip(to_prepare, prepared))
    return {"accelerator": accelerator, **objects}


def test_q2_blank_is_not_attempted():
    values = prepared_objects()
    assert_not_attempted(lesson1.q2, **{**values, "model": ____, "optimizer": ____})


def test_q2_all_four_prepared_is_correct():
    assert_correct(lesson1.q2, **prepared_objects())


@pytest.mark.parametrize("forgotten", ["model", "lr_scheduler", "train_dataloader"])
def test_q2_an_object_left_out_of_prepare_is_named(forgotten):
    assert_incorrect(lesson1.q2, reason_contains=[f"`{forgotten}`", "not passed through"], **prepared_objects(skip=(forgotten,)))


def test_q2_results_assigned_in_the_wrong_order_are_diagnosed():
    values = prepared_objects()
    values["optimizer"], values["lr_scheduler"] = values["lr_scheduler"], values["optimizer"]
    assert_incorrect(lesson1.q2, reason_contains="order", **values)


# ---------------------------------------------------------------- q3: convert a loop


def learner_function(tmp_path, source, name="train_with_accelerate"):
    """Define the learner's function from a real file, as a notebook cell does, so its source can be read."""
    path = tmp_path / f"learner_{abs(hash(source))}.py"
    path.write_text("import torch\nfrom accelerate import Accelerator\n\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


SOLUTION = lesson1.q3.solution_text


def test_q3_untouched_starter_is_not_attempted(tmp_path):
    assert_not_attempted(lesson1.q3, train_with_accelerate=learner_function(tmp_path, lesson1.STARTER_LOOP))


def test_q3_reference_solution_is_correct(tmp_path):
    assert_correct(lesson1.q3, train_with_accelerate=learner_function(tmp_path, SOLUTION))


@pytest.mark.parametrize(
    "change, diagnosis",
    [
        (("outputs = model(**batch)", "batch = {k: v.to(accelerator.device) for k, v in batch.items()}\n            outputs = model(**batch)"), ".to("),
        (("accelerator.backward(loss)", "loss.backward()"), "accelerator.backward(loss)"),
        (("            lr_scheduler.step()\n", ""), "learning rate never changed"),
        (("model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(\n        model, optimizer, train_dataloader, lr_scheduler\n    )",
          "model, optimizer, train_dataloader = accelerator.prepare(\n        model, optimizer, train_dataloader\n    )"), "`lr_scheduler` never went through"),
        (("    model.train()\n", ""), "model.train()"),
        (("losses.append(loss.item())", "losses.append(loss)"), "floats"),
        (("    return losses", "    print(losses)"), "list of losses"),
        (("optimizer.zero_grad()", "optimizer.zero_grad(); loss_scale = 2"), None),
    ],
)
def test_q3_typical_mistakes_are_diagnosed(tmp_path, change, diagnosis):
    old, new = change
    assert old in SOLUTION, f"the mutation {old!r} no longer applies to the solution"
    source = SOLUTION.replace(old, new)
    if diagnosis is None:  # a harmless change: still correct
        assert_correct(lesson1.q3, train_with_accelerate=learner_function(tmp_path, source))
    else:
        assert_incorrect(lesson1.q3, reason_contains=diagnosis, train_with_accelerate=learner_function(tmp_path, source))


def test_q3_steps_in_the_wrong_order_change_the_parameters(tmp_path):
    # zero_grad after backward wipes the gradients: the optimizer steps on zeros.
    lines = SOLUTION.splitlines()
    zero_grad = next(i for i, line in enumerate(lines) if "optimizer.zero_grad()" in line)
    backward = next(i for i, line in enumerate(lines) if "accelerator.backward(loss)" in line)
    lines.insert(backward, lines.pop(zero_grad))  # after the pop, index `backward` is just past it
    source = "\n".join(lines)
    assert_incorrect(lesson1.q3, reason_contains="differ from the reference", train_with_accelerate=learner_function(tmp_path, source))


def test_q3_a_function_that_raises_is_reported(tmp_path):
    source = SOLUTION.replace("outputs = model(**batch)", "outputs = model(batch)")
    assert_incorrect(lesson1.q3, reason_contains="raised", train_with_accelerate=learner_function(tmp_path, source))


def test_q3_something_that_is_not_a_function_is_reported():
    assert_incorrect(lesson1.q3, reason_contains="should be a function", train_with_accelerate=42)


# ---------------------------------------------------------------- q4: Trainer or custom loop


def test_q4_blank_is_not_attempted():
    assert_not_attempted(lesson1.q4, answer=____)


@pytest.mark.parametrize("answer", ["b", "B", " b."])
def test_q4_the_gan_needs_a_custom_loop(answer):
    assert_correct(lesson1.q4, answer=answer)


@pytest.mark.parametrize("wrong, diagnosis", [("a", "eval_strategy"), ("c", "bf16"), ("d", "should be"), (2, "string")])
def test_q4_wrong_choices_say_why(wrong, diagnosis):
    assert_incorrect(lesson1.q4, reason_contains=diagnosis, answer=wrong)


# ---------------------------------------------------------------- the lesson's cells and the checks agree


def _lesson1_function_cell(variant):
    """Return the code of ``train_with_accelerate`` as the lesson's ``variant`` copy shows it."""
    from course_utils import REPO_DIR
    from notebook_source import parse_lesson, render_notebook  # scripts/, put on the path by conftest.py

    notebook = render_notebook(parse_lesson(REPO_DIR / "lessons" / "01_from_loop_to_accelerator.py"), variant)
    (cell,) = [cell for cell in notebook["cells"] if "def train_with_accelerate" in cell["source"]]
    code = cell["source"].split("ex.q3.check()")[0]
    if variant == "learner":  # the starter is commented out until the learner edits it
        code = "\n".join(line.removeprefix("# ").removeprefix("#") for line in code.splitlines())
    return code


def test_q3_the_untouched_learner_cell_is_the_loop_the_check_calls_not_attempted():
    # The check recognises an untouched cell by comparing with STARTER_LOOP: the
    # two are written in different files, so this keeps them from drifting apart.
    assert lesson1._normalised(_lesson1_function_cell("learner")) == lesson1._normalised(lesson1.STARTER_LOOP)


def test_q3_the_solved_copy_shows_the_solution_the_check_prints():
    assert lesson1._normalised(_lesson1_function_cell("solved")) == lesson1._normalised(lesson1.q3.solution_text)
