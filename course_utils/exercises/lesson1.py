"""Exercises of lesson 1: from a plain PyTorch loop to Accelerate.

- ``q1``: the number of warm-up steps for a linear schedule
- ``q2``: passing the training objects through ``accelerator.prepare``
- ``q3``: converting a plain training function to Accelerate
- ``q4``: when the Trainer is not enough
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from unittest import mock

import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderAdapter
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import set_seed

from course_utils import data, loops, models
from course_utils.exercises.core import Exercise, Incorrect, NotAttempted, ValueExercise

# The small problem the code exercises train on: 4 optimizer steps, about a second.
EXERCISE_EXAMPLES = 64
EXERCISE_BATCH_SIZE = 16
EXERCISE_SEED = 0


def fresh_training_objects(seed=EXERCISE_SEED):
    """Return a new ``(model, optimizer, train_dataloader, lr_scheduler)`` for a short training run.

    The model is the course checkpoint, the dataloader holds the first
    64 training pairs in batches of 16, and the schedule warms up over 10% of
    one epoch. The same ``seed`` gives the same objects.
    """
    set_seed(seed)
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader(
        "train", batch_size=EXERCISE_BATCH_SIZE, seed=seed, limit=EXERCISE_EXAMPLES
    )
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, num_training_steps=len(train_dataloader))
    return model, optimizer, train_dataloader, lr_scheduler


class WarmupSteps(Exercise):
    title = "Exercise 1"
    variables = ["num_warmup_steps", "num_epochs", "num_batches_per_epoch"]
    hints = [
        "The warm-up is a share of *all* the optimizer steps of the training, not of one epoch.",
        "There is one optimizer step per batch, so training takes `num_epochs * num_batches_per_epoch` steps.",
        "10% of them is `0.1 * ...`; `get_linear_schedule_with_warmup` wants a whole number: wrap it in `int(...)`.",
    ]
    solution_code = "num_warmup_steps = int(0.1 * num_epochs * num_batches_per_epoch)"
    correct_message = "The learning rate now rises for the first 10% of the steps, then decays to 0."

    def check_answer(self, num_warmup_steps, num_epochs, num_batches_per_epoch):
        if isinstance(num_warmup_steps, bool) or not isinstance(num_warmup_steps, (int, float)):
            raise Incorrect(f"`num_warmup_steps` should be a whole number of steps, not a {type(num_warmup_steps).__name__}.")
        if isinstance(num_warmup_steps, float):
            raise Incorrect("`num_warmup_steps` is a float: a number of steps is a whole number. Wrap it in `int(...)`.")
        for name, value in (("num_epochs", num_epochs), ("num_batches_per_epoch", num_batches_per_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise Incorrect(f"`{name}` should be the positive int the cell above sets; run that cell again.")
        total_steps = num_epochs * num_batches_per_epoch
        # int() is the usual choice; rounding to the nearest step is as good.
        if num_warmup_steps in (int(0.1 * total_steps), round(0.1 * total_steps)):
            return None
        if num_warmup_steps in (int(0.1 * num_batches_per_epoch), round(0.1 * num_batches_per_epoch)):
            raise Incorrect("That is 10% of one epoch. The warm-up is 10% of *all* training steps, over every epoch.")
        if num_warmup_steps == total_steps:
            raise Incorrect("That is every training step: the learning rate would only ever rise. Take 10% of it.")
        if num_warmup_steps == 10:
            raise Incorrect("10% means a fraction, 0.1, of the number of training steps, not 10 steps.")
        raise Incorrect(f"`num_warmup_steps` is {num_warmup_steps:,}, which is not 10% of the training steps.")


class PrepareObjects(Exercise):
    title = "Exercise 2"
    variables = ["accelerator", "model", "optimizer", "train_dataloader", "lr_scheduler"]
    hints = [
        "`accelerator.prepare(...)` takes all four objects in one call.",
        "It returns them in the order you passed them: assign the result to the same four names.",
        "`model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)`",
    ]
    solution_code = """
        model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_dataloader, lr_scheduler
        )
    """
    correct_message = "All four objects are now managed by Accelerate."

    # What each name should hold once prepared, and what a learner would recognise it by.
    prepared_types = {
        "optimizer": (AcceleratedOptimizer, "an AcceleratedOptimizer"),
        "train_dataloader": (DataLoaderAdapter, "a prepared DataLoader (DataLoaderShard)"),
        "lr_scheduler": (AcceleratedScheduler, "an AcceleratedScheduler"),
    }

    def check_answer(self, accelerator, model, optimizer, train_dataloader, lr_scheduler):
        if not isinstance(accelerator, Accelerator):
            raise Incorrect("`accelerator` should be the `Accelerator` created earlier in the lesson; run that cell again.")
        values = {"optimizer": optimizer, "train_dataloader": train_dataloader, "lr_scheduler": lr_scheduler}
        for name, value in values.items():
            for other_name, (other_type, _) in self.prepared_types.items():
                if other_name != name and isinstance(value, other_type):
                    raise Incorrect(
                        f"`{name}` holds the prepared {other_name.replace('_', ' ')}: `prepare` returns the "
                        "objects in the order you pass them. Keep the same order on both sides of `=`."
                    )
        if isinstance(model, (AcceleratedOptimizer, DataLoaderAdapter, AcceleratedScheduler)):
            raise Incorrect("`model` holds another prepared object: keep the same order on both sides of `=`.")
        if not isinstance(model, torch.nn.Module):
            raise Incorrect(f"`model` should be the model, but it is a {type(model).__name__}.")
        missing = [name for name, value in values.items() if not isinstance(value, self.prepared_types[name][0])]
        if not any(prepared is model for prepared in accelerator._models):
            missing.insert(0, "model")
        if missing:
            names = ", ".join(f"`{name}`" for name in missing)
            raise Incorrect(
                f"{names} {'was' if len(missing) == 1 else 'were'} not passed through `accelerator.prepare`. "
                "Accelerate can only place, shard and synchronise the objects it has prepared."
            )


STARTER_LOOP = '''
def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
    device = torch.device("cpu")
    model.to(device)
    model.train()
    losses = []
    for epoch in range(num_epochs):
        for batch in train_dataloader:
            optimizer.zero_grad()
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
    return losses
'''


def _reference_accelerate_run(num_epochs=1):
    """Return (final parameters, losses) of the course's Accelerate loop on the exercise problem."""
    model, optimizer, train_dataloader, lr_scheduler = fresh_training_objects()
    losses = loops.train_accelerate(
        model, optimizer, lr_scheduler, train_dataloader, num_epochs, Accelerator()
    )
    return [parameter.detach().clone() for parameter in model.parameters()], losses


class ConvertLoop(Exercise):
    title = "Exercise 3"
    variables = ["train_with_accelerate"]
    hints = [
        "Start the function with `accelerator = Accelerator()`, then pass the four objects through `accelerator.prepare`.",
        "A prepared dataloader yields batches already on the right device: delete `device`, `model.to(device)` "
        "and the line that moves the batch.",
        "Replace `loss.backward()` with `accelerator.backward(loss)`: it also averages gradients across processes.",
    ]
    solution_code = """
        def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
            accelerator = Accelerator()
            model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
                model, optimizer, train_dataloader, lr_scheduler
            )
            model.train()
            losses = []
            for epoch in range(num_epochs):
                for batch in train_dataloader:
                    optimizer.zero_grad()
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    losses.append(loss.item())
            return losses
    """
    correct_message = "Same parameters as the course's Accelerate loop, and the code now runs unchanged on GPUs and several processes."

    def check_answer(self, train_with_accelerate):
        if not callable(train_with_accelerate):
            raise Incorrect(f"`train_with_accelerate` should be a function, but it is a {type(train_with_accelerate).__name__}.")
        source = _source_of(train_with_accelerate)
        if source is not None and _normalised(source) == _normalised(STARTER_LOOP):
            raise NotAttempted("`train_with_accelerate` is still the plain loop: edit it, run the cell, then check again.")
        if source is not None:
            self._check_source(source)

        model, optimizer, train_dataloader, lr_scheduler = fresh_training_objects()
        prepared_ids = set()
        original_prepare = Accelerator.prepare

        def recording_prepare(accelerator, *objects, **kwargs):
            prepared_ids.update(id(obj) for obj in objects)
            return original_prepare(accelerator, *objects, **kwargs)

        with mock.patch.object(Accelerator, "prepare", recording_prepare):
            losses = self.call_learner(train_with_accelerate, model, optimizer, lr_scheduler, train_dataloader, 1)

        given = {"model": model, "optimizer": optimizer, "train_dataloader": train_dataloader, "lr_scheduler": lr_scheduler}
        missing = [name for name, obj in given.items() if id(obj) not in prepared_ids]
        if missing:
            names = ", ".join(f"`{name}`" for name in missing)
            raise Incorrect(f"{names} never went through `accelerator.prepare`: pass all four objects to it.")
        if lr_scheduler.last_epoch == 0:
            raise Incorrect("The learning rate never changed: call `lr_scheduler.step()` after `optimizer.step()`.")
        if not model.training:
            raise Incorrect("The model stayed in evaluation mode (dropout off): call `model.train()` before the loop.")
        steps = len(train_dataloader)
        if not isinstance(losses, (list, tuple)) or len(losses) != steps:
            raise Incorrect(
                f"`train_with_accelerate` should return the list of losses, one per step ({steps} steps here), "
                f"but it returned a {type(losses).__name__}"
                + (f" of length {len(losses)}." if hasattr(losses, "__len__") else ".")
            )
        if not all(isinstance(loss, float) for loss in losses):
            raise Incorrect("The losses should be Python floats: append `loss.item()`, not the tensor `loss`.")

        reference_parameters, reference_losses = _reference_accelerate_run()
        largest_gap = max(
            (mine.detach() - theirs).abs().max().item() for mine, theirs in zip(model.parameters(), reference_parameters)
        )
        if largest_gap > 1e-6 or any(abs(a - b) > 1e-6 for a, b in zip(losses, reference_losses)):
            raise Incorrect(
                "After training, your model's parameters differ from the reference loop's (largest gap "
                f"{largest_gap:.2e}). Compare the order of zero_grad, forward, backward and the two steps with the plain loop."
            )

    @staticmethod
    def _check_source(source):
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            if node.func.attr == "to":
                raise Incorrect(
                    f"`{ast.unparse(node)}` still moves something by hand. After `prepare`, the model and every "
                    "batch are already on the right device: remove the `.to(...)` calls (and `device`)."
                )
            if node.func.attr == "backward" and not (isinstance(receiver, ast.Name) and receiver.id == "accelerator"):
                raise Incorrect(
                    f"`{ast.unparse(node)}` computes gradients without Accelerate. Use `accelerator.backward(loss)`: "
                    "it also averages gradients across processes and scales the loss in mixed precision."
                )


def _source_of(function):
    """Return the dedented source of ``function``, or None when it is not available (e.g. built with exec)."""
    try:
        return textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None


def _normalised(source):
    """Return ``source`` without comments, blank lines and trailing spaces, for comparing code."""
    return ast.unparse(ast.parse(textwrap.dedent(source)))


class TrainerOrCustomLoop(ValueExercise):
    title = "Exercise 4"
    variables = ["answer"]
    expected = "b"
    hints = [
        "The Trainer runs one model, one loss and one optimizer in a fixed order; arguments switch its features on.",
        "Evaluation every epoch and mixed precision on several GPUs are both arguments of `TrainingArguments`.",
    ]
    solution_code = 'answer = "b"'
    correct_message = "Two networks, two optimizers and a fixed order of updates need a loop you write: Accelerate keeps it portable."
    reasons = {
        "a": "The Trainer does this with arguments: `eval_strategy=\"epoch\"`, its default linear schedule, AdamW by default.",
        "c": "The Trainer does this with arguments too (`bf16=True` or `fp16=True`, launched on two GPUs).",
    }

    def check_answer(self, answer):
        if not isinstance(answer, str):
            raise Incorrect(f"`answer` should be a string: \"a\", \"b\" or \"c\", but it is a {type(answer).__name__}.")
        choice = answer.strip().lower().rstrip(".")
        if choice not in ("a", "b", "c"):
            raise Incorrect(f"`answer` should be \"a\", \"b\" or \"c\", not {answer!r}.")
        if choice != self.expected:
            raise Incorrect(self.reasons[choice])


q1 = WarmupSteps()
q2 = PrepareObjects()
q3 = ConvertLoop()
q4 = TrainerOrCustomLoop()
