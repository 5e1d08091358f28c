"""Lesson 1's exercises judge known answers as a teacher would: blank, wrong (with the diagnosis), right."""

import math
import textwrap
import warnings

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from exercise_helpers import (
    assert_correct,
    assert_handles_bad_answers,
    assert_incorrect,
    assert_lesson_shows_the_solution,
    assert_odd_answers_are_judged,
    assert_not_attempted,
    cell_copy,
    lesson_cell,
    normalised,
)

from course_utils import REPO_DIR
from course_utils.exercises import ____, lesson1

LESSON = REPO_DIR / "lessons" / "01_from_loop_to_accelerator.py"

# ---------------------------------------------------------------- q1: warm-up steps

EPOCHS, BATCHES = 4, 94  # 376 steps in all: 10% is 37.6, so 37 (int) or 38 (round, ceil)


def warmup(value, epochs=EPOCHS, batches=BATCHES):
    return {"num_warmup_steps": value, "num_epochs": epochs, "num_batches_per_epoch": batches}


def test_q1_blank_is_not_attempted():
    assert_not_attempted(lesson1.q1, **warmup(____))


@pytest.mark.parametrize("broken", [float("nan"), float("inf"), -math.inf, np.float32("nan"), torch.tensor(float("inf"))])
def test_q1_nan_and_infinity_are_named_never_accepted(broken):
    assert_incorrect(lesson1.q1, reason_contains="a division by zero or an overflow?", **warmup(broken))


@pytest.mark.parametrize(
    "answer",
    [
        int(0.1 * EPOCHS * BATCHES),  # the reference: 37
        round(0.1 * EPOCHS * BATCHES),  # 38
        math.ceil(EPOCHS * BATCHES / 10),  # 38
        EPOCHS * BATCHES // 10,
        int(EPOCHS * BATCHES * 10 / 100),
        np.int64(37),
        np.floor(0.1 * EPOCHS * BATCHES).astype(int),
        torch.tensor(37),
    ],
)
def test_q1_ten_percent_of_all_steps_rounded_either_way_is_correct(answer):
    assert_correct(lesson1.q1, **warmup(answer))


def test_q1_numpy_epoch_and_batch_counts_are_read_as_numbers():
    assert_correct(lesson1.q1, **warmup(37, np.int64(EPOCHS), np.int64(BATCHES)))


@pytest.mark.parametrize(
    "wrong, diagnosis",
    [(9, "one epoch"), (376, "every training step"), (37.6, "not an int"), (37.0, "not an int"), (10, "fraction"),
     (100, "26.6% of the training steps, not 10%"), (np.float64(37.6), "not an int")],
)
def test_q1_typical_mistakes_are_named(wrong, diagnosis):
    assert_incorrect(lesson1.q1, reason_contains=diagnosis, hides=37, **warmup(wrong))


@pytest.mark.parametrize("odd", [10**400, np.array([37, 38]), np.zeros(0), torch.ones(2), "37", float("nan"), [37]])
def test_q1_odd_values_are_incorrect(odd):
    assert_incorrect(lesson1.q1, **warmup(odd))


def test_q1_bad_answers_are_reported_not_raised():
    assert_handles_bad_answers(lesson1.q1, **warmup(37))


def test_q1_messages_use_the_right_article():
    result = assert_incorrect(lesson1.q1, **warmup(np.int64(37), "4", BATCHES))
    assert "a int" not in result.message


# ---------------------------------------------------------------- q2: prepare


MY_NAMES = ["my_model", "my_optimizer", "my_dataloader", "my_scheduler"]


def prepared_objects(skip=(), accelerator=None, assign=True):
    accelerator = accelerator or Accelerator()
    objects = dict(zip(MY_NAMES, lesson1.fresh_training_objects()))
    to_prepare = [name for name in objects if name not in skip]
    prepared = accelerator.prepare(*[objects[name] for name in to_prepare])
    prepared = prepared if isinstance(prepared, tuple) else (prepared,)
    if assign:
        objects.update(zip(to_prepare, prepared))
    return {"my_accelerator": accelerator, **objects}


def test_q2_blank_is_not_attempted():
    values = prepared_objects()
    assert_not_attempted(lesson1.q2, **{**values, "my_model": ____, "my_optimizer": ____})


def test_q2_uses_names_of_its_own_so_the_sections_keep_theirs():
    # Exercise 2 once rebound `train_dataloader` to its 4-batch loader: section 1, run again, trained on it.
    assert not set(lesson1.q2.variables) & {"model", "optimizer", "train_dataloader", "lr_scheduler"}


def test_q2_all_four_prepared_is_correct():
    assert_correct(lesson1.q2, **prepared_objects())


def test_q2_preparing_one_object_at_a_time_is_correct():
    accelerator = Accelerator()
    model, optimizer, train_dataloader, lr_scheduler = lesson1.fresh_training_objects()
    model = accelerator.prepare_model(model)
    optimizer = accelerator.prepare_optimizer(optimizer)
    train_dataloader = accelerator.prepare_data_loader(train_dataloader)
    lr_scheduler = accelerator.prepare_scheduler(lr_scheduler)
    assert_correct(lesson1.q2, my_accelerator=accelerator, my_model=model, my_optimizer=optimizer,
                   my_dataloader=train_dataloader, my_scheduler=lr_scheduler)


class _WarnsWhenRead:
    """Like torch.distributed.reduce_op in a kernel: an object that warns when its attributes are read."""

    def __getattribute__(self, name):
        warnings.warn("deprecated", FutureWarning)
        return object.__getattribute__(self, name)


def test_q2_an_accelerator_of_the_learners_own_is_correct():
    my_accelerator = Accelerator()
    values = prepared_objects(accelerator=my_accelerator)
    noisy = _WarnsWhenRead()  # the check looks through every live object for the learner's Accelerator
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the learner would see any warning under their cell
        assert_correct(lesson1.q2, **{**values, "my_accelerator": Accelerator()})
    del noisy


def test_q2_prepare_called_but_its_results_ignored_says_prepare_returns_new_objects():
    result = assert_incorrect(lesson1.q2, reason_contains="prepare` returns new objects: train with those",
                              **prepared_objects(assign=False))
    assert "not passed through" not in result.message


@pytest.mark.parametrize("forgotten", ["my_model", "my_scheduler", "my_dataloader"])
def test_q2_an_object_left_out_of_prepare_is_named(forgotten):
    assert_incorrect(lesson1.q2, reason_contains=[f"`{forgotten}`", "not passed through"], **prepared_objects(skip=(forgotten,)))


def test_q2_results_assigned_in_the_wrong_order_are_diagnosed():
    values = prepared_objects()
    values["my_optimizer"], values["my_scheduler"] = values["my_scheduler"], values["my_optimizer"]
    assert_incorrect(lesson1.q2, reason_contains="order", **values)


def test_q2_bad_answers_are_reported_not_raised():
    values = prepared_objects()  # the accelerator may be any object: the check finds the one that prepared them
    for name in MY_NAMES:
        for bad in (None, "x", [1, 2], 10**400, np.ones(3)):
            assert_incorrect(lesson1.q2, **{**values, name: bad})


# ---------------------------------------------------------------- q3: convert a loop

SOLUTION = lesson1.q3.solution_text


def learner_function(tmp_path, source, name="train_with_accelerate"):
    """Define the learner's function from a real file, as a notebook cell does, so its source can be read."""
    path = tmp_path / f"learner_{abs(hash(source))}.py"
    text = "import torch\nfrom accelerate import Accelerator\nfrom tqdm.auto import tqdm\n\n" + textwrap.dedent(source)
    path.write_text(text)
    namespace = {"__name__": path.stem}
    exec(compile(text, str(path), "exec"), namespace)  # inspect reads the source back from the file, as from a cell's
    return namespace[name]


def edited(*changes, source=SOLUTION):
    for old, new in changes:
        assert old in source, f"the edit {old!r} no longer applies"
        source = source.replace(old, new)
    return source


PREPARE_ALL = """    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )"""

CORRECT_VARIANTS = {
    "the reference": SOLUTION,
    "an Accelerator called acc": SOLUTION.replace("accelerator", "acc"),
    "the four prepare_* methods": edited((PREPARE_ALL, """    model = accelerator.prepare_model(model)
    optimizer = accelerator.prepare_optimizer(optimizer)
    train_dataloader = accelerator.prepare_data_loader(train_dataloader)
    lr_scheduler = accelerator.prepare_scheduler(lr_scheduler)""")),
    "new names for the prepared objects": edited(
        (PREPARE_ALL, "    net, opt, loader, schedule = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)"),
        ("model.train()", "net.train()"), ("enumerate(train_dataloader)", "enumerate(loader)"),
        ("model(**batch)", "net(**batch)"), ("optimizer.step()", "opt.step()"),
        ("lr_scheduler.step()", "schedule.step()"), ("optimizer.zero_grad()", "opt.zero_grad()"),
    ),
    "zero_grad first, a plain for loop, model.train() once": edited(
        ("    for epoch in range(num_epochs):\n        model.train()\n",
         "    model.train()\n    for epoch in range(num_epochs):\n"),
        ("for step, batch in enumerate(train_dataloader):\n", "for batch in train_dataloader:\n            optimizer.zero_grad()\n"),
        ("            optimizer.zero_grad()\n            losses.append", "            losses.append"),
    ),
    "keyword arguments and a loss of one's own": edited(
        ("outputs = model(**batch)",
         'outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])'),
        ("loss = outputs.loss", 'loss = torch.nn.functional.cross_entropy(outputs.logits, batch["labels"])'),
    ),
    "accumulate, a progress bar, accelerator.device and float()": edited(
        ("for step, batch in enumerate(train_dataloader):\n",
         "for step, batch in enumerate(tqdm(train_dataloader, disable=True)):\n"
         "          with accelerator.accumulate(model):\n"
         "            batch = {k: v.to(accelerator.device) for k, v in batch.items()}\n"),
        ("losses.append(loss.item())", "losses.append(float(loss.detach()))"),
    ),
    "an evaluation pass in eval mode after training": edited(
        ("    return losses", "    model.eval()\n    with torch.no_grad():\n        for batch in train_dataloader:\n"
                            "            model(**batch)\n    return losses"),
    ),
    "Accelerator(cpu=True) and a tuple of losses": edited(("Accelerator()", "Accelerator(cpu=True)"),
                                                         ("    return losses", "    return tuple(losses)")),
    "autocast, Accelerator options, a while-style loop": edited(
        ("Accelerator()", 'Accelerator(mixed_precision="no", device_placement=True, gradient_accumulation_steps=1)'),
        ("        for step, batch in enumerate(train_dataloader):\n",
         "        batches = iter(train_dataloader)\n        for _ in range(len(train_dataloader)):\n            batch = next(batches)\n"),
        ("            outputs = model(**batch)", "            with accelerator.autocast():\n                outputs = model(**batch)"),
    ),
    "a note printed when the device is a CPU (reading the device moves nothing)": edited(
        ("    losses = []\n", '    if accelerator.device.type == "cpu":\n        print("training on the CPU: slow, but it works")\n'
                          "    losses = []\n"),
    ),
    "the model moved to accelerator.device before prepare": edited(
        ("    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(",
         "    model = model.to(accelerator.device)\n    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare("),
    ),
    "an unused device string, a dtype conversion": edited(
        ("            outputs = model(**batch)",
         '            unused = torch.device("cpu")\n            outputs = model(**{k: v.to(torch.long) for k, v in batch.items()})'),
    ),
    "prepare's tuple unpacked later, a docstring naming the cpu": edited(
        (PREPARE_ALL, '    """Train on the cpu or a GPU, unchanged."""\n'
                      "    prepared = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)\n"
                      "    model, optimizer, train_dataloader, lr_scheduler = prepared"),
    ),
}


def test_q3_untouched_starter_is_not_attempted(tmp_path):
    assert_not_attempted(lesson1.q3, train_with_accelerate=learner_function(tmp_path, lesson1.STARTER_LOOP))


@pytest.mark.parametrize("variant", list(CORRECT_VARIANTS))
def test_q3_correct_loops_written_differently_pass(tmp_path, variant):
    assert_correct(lesson1.q3, train_with_accelerate=learner_function(tmp_path, CORRECT_VARIANTS[variant]))


def test_q3_a_correct_loop_built_with_exec_passes_though_its_source_is_unavailable():
    namespace = {"torch": torch, "Accelerator": Accelerator}
    exec(SOLUTION, namespace)
    assert_correct(lesson1.q3, train_with_accelerate=namespace["train_with_accelerate"])


MISTAKES = {
    "prepare's results thrown away": (
        ((PREPARE_ALL, "    accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)"),),
        "prepare` returns new objects: train with those",
    ),
    "new names, but the loop over the original dataloader": (
        ((PREPARE_ALL, "    model, opt, loader, sched = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)"),
         ("optimizer.step()", "opt.step()"), ("lr_scheduler.step()", "sched.step()")),
        "prepare` returns new objects: train with those",
    ),
    "the original optimizer stepped": (
        ((PREPARE_ALL, "    model, opt, train_dataloader, lr_scheduler = accelerator.prepare(\n"
                       "        model, optimizer, train_dataloader, lr_scheduler)"),),
        "original `optimizer`",
    ),
    "loss.backward()": ((("accelerator.backward(loss)", "loss.backward()"),), "scales it in fp16"),
    "no backward at all": ((("accelerator.backward(loss)", "pass"),), "never computed gradients"),
    "no scheduler step": ((("            lr_scheduler.step()\n", ""),), "learning rate never changed"),
    "scheduler not prepared": (
        ((PREPARE_ALL, "    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)"),),
        "`lr_scheduler` never went through",
    ),
    "nothing prepared": ((("    " + PREPARE_ALL.strip(), "    pass"),), "Nothing went through `prepare`"),
    "model.train() left out": ((("        model.train()\n", ""),), "evaluation mode"),
    "model.eval() before training": ((("model.train()", "model.eval()"),), "evaluation mode"),
    "tensors appended": ((("losses.append(loss.item())", "losses.append(loss)"),), "append `loss.item()`"),
    "nothing returned": ((("    return losses", "    print(losses)"),), "list of losses"),
    "a device left by hand": (
        (("outputs = model(**batch)", 'batch = {k: v.to("cpu") for k, v in batch.items()}\n            outputs = model(**batch)'),),
        'moves a tensor to a device it chose itself, "cpu"',
    ),
    "the starter's device object kept": (
        (("    accelerator = Accelerator()\n", '    accelerator = Accelerator()\n    device = torch.device("cpu")\n'),
         ("outputs = model(**batch)", "batch = {k: v.to(device) for k, v in batch.items()}\n            outputs = model(**batch)")),
        'moves a tensor to a device it chose itself, "cpu"',
    ),
    "the model moved by hand after prepare": (
        (("    losses = []\n", "    model.to(torch.device('cpu'))\n    losses = []\n"),),
        "moves the model to a device",
    ),
    "the model moved with .cpu()": (
        (("    losses = []\n", "    model = model.cpu()\n    losses = []\n"),),
        "moves the model to a device",
    ),
    "the loss divided by zero": (
        (("loss = outputs.loss", "loss = outputs.loss / (len(batch) - len(batch))"),),
        "your parameters became NaN (not a number): a division by zero or an overflow?",
    ),
    "the loss divided by zero in float": (
        (("loss = outputs.loss", 'loss = outputs.loss / float("0")'),),
        "your parameters became NaN",
    ),
    "a loss scaled to overflow": (
        (("loss = outputs.loss", "loss = outputs.loss * 1e38 * 1e38"),),
        "a division by zero or an overflow?",
    ),
    "zero_grad between backward and step": (
        (("            accelerator.backward(loss)\n", "            accelerator.backward(loss)\n            optimizer.zero_grad()\n"),),
        "differ from the reference",
    ),
    "a call that raises": ((("outputs = model(**batch)", "outputs = model(batch)"),), "raised"),
    "losses that are not the losses": ((("losses.append(loss.item())", 'losses.append(float("nan"))'),),
                                       "not its losses"),
    "a loss too large for a float": ((("losses.append(loss.item())", "losses.append(10**400)"),), "not its losses"),
    "the forward pass under no_grad": ((("            outputs = model(**batch)",
                                         "            with torch.no_grad():\n                outputs = model(**batch)"),),
                                       "does not require grad"),
    "a device chosen by hand for the GPU": (
        (("outputs = model(**batch)",
          'outputs = model(**{k: v.to("cuda" if torch.cuda.is_available() else "cpu") for k, v in batch.items()})'),),
        "moves a tensor to a device it chose itself",
    ),
    "the model alone kept from prepare": (
        ((PREPARE_ALL, "    model, _, _, _ = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)"),),
        "prepare` returns new objects",
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_q3_each_known_mistake_gets_its_own_diagnosis(tmp_path, mistake):
    changes, diagnosis = MISTAKES[mistake]
    assert_incorrect(lesson1.q3, reason_contains=diagnosis, train_with_accelerate=learner_function(tmp_path, edited(*changes)))


def test_q3_the_plain_backward_message_puts_gradient_averaging_where_it_happens(tmp_path):
    result = assert_incorrect(lesson1.q3, train_with_accelerate=learner_function(tmp_path, edited(("accelerator.backward(loss)", "loss.backward()"))))
    assert "wrapper `prepare` puts around the model" in result.message
    assert "averages gradients" not in result.message.split("(")[0]


def test_q3_an_endless_loop_is_stopped_with_the_likely_cause(tmp_path):
    quick = type("QuickConvertLoop", (type(lesson1.q3),), {"time_limit_s": 1.0})()
    source = edited(("    return losses", "    while True:\n        pass"))
    assert_incorrect(quick, reason_contains=["still running after 1 s", "range(num_epochs)"],
                     train_with_accelerate=learner_function(tmp_path, source))


@pytest.mark.parametrize("odd", [42, None, "def f(): pass", lambda *args: 10**400, lambda *args: np.ones(4),
                                 lambda *args: torch.zeros(0), lambda *args: ____])
def test_q3_odd_answers_are_incorrect_or_not_attempted(odd):
    result = lesson1.q3.evaluate(train_with_accelerate=odd)
    assert result.outcome.name in ("INCORRECT", "NOT_ATTEMPTED"), result.message


def test_q3_a_two_line_lambda_whose_source_cannot_be_parsed_is_judged_on_what_it_did():
    odd = (lambda model, optimizer, lr_scheduler, train_dataloader, num_epochs:
           [0.5])
    assert_incorrect(lesson1.q3, reason_contains="Nothing went through `prepare`", train_with_accelerate=odd)


# ---------------------------------------------------------------- q4: Trainer or custom loop


def test_q4_blank_is_not_attempted():
    assert_not_attempted(lesson1.q4, answer=____)


@pytest.mark.parametrize("answer", ["b", "B", " b.", np.str_("b")])
def test_q4_the_gan_needs_a_custom_loop(answer):
    assert_correct(lesson1.q4, answer=answer)


@pytest.mark.parametrize("wrong, diagnosis", [("a", "eval_strategy"), ("c", "bf16"), ("d", "should be"), (2, "string")])
def test_q4_wrong_choices_say_why(wrong, diagnosis):
    assert_incorrect(lesson1.q4, reason_contains=diagnosis, answer=wrong)


# ---------------------------------------------------------------- the lesson's cells and the checks agree


def test_q3_the_untouched_learner_cell_is_the_loop_the_check_calls_not_attempted():
    # The check recognises an untouched cell by comparing with STARTER_LOOP: the
    # two are written in different files, so this keeps them from drifting apart.
    cell = cell_copy(lesson_cell(LESSON, "ex.q3.check()"), "learner").split("ex.q3.check()")[0]
    assert normalised(cell) == normalised(lesson1.STARTER_LOOP)


@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_the_solved_copy_shows_the_solution_the_check_prints(number):
    assert_lesson_shows_the_solution(getattr(lesson1, f"q{number}"), LESSON, f"ex.q{number}.check()")


def test_odd_answers_to_every_exercise_are_judged_never_a_check_failure():
    assert_odd_answers_are_judged(lesson1.q1, **warmup(37))
    # The accelerator may be any object: the check finds the Accelerator that prepared the objects.
    assert_odd_answers_are_judged(lesson1.q2, vary_only=tuple(MY_NAMES),
                                  **prepared_objects())
    assert_odd_answers_are_judged(lesson1.q3, train_with_accelerate=lambda *args: None)
    assert_odd_answers_are_judged(lesson1.q4, answer="b")
