"""Exercises of lesson 1: from a plain PyTorch loop to Accelerate.

- ``q1``: the number of warm-up steps for a linear schedule
- ``q2``: passing the training objects through ``my_accelerator.prepare``
- ``q3``: converting a plain training function to Accelerate
- ``q4``: when the Trainer is not enough
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import math
import sys
import textwrap
import threading
import types
from unittest import mock

import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderAdapter
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.scheduler import AcceleratedScheduler
from accelerate.state import PartialState
from accelerate.utils import set_seed
from transformers import get_linear_schedule_with_warmup

from course_utils import data, models, optimizers
from course_utils.validation import check_int_in_range
from course_utils.exercises.core import Exercise, Incorrect, NotAttempted, ValueExercise, as_number, describe_value

# The small problem the code exercises train on: 4 optimizer steps, about a second.
EXERCISE_EXAMPLES = 64
EXERCISE_BATCH_SIZE = 16
EXERCISE_SEED = 0
EXERCISE_LR = 1e-3


def fresh_training_objects(seed=EXERCISE_SEED):
    """Return a new ``(model, optimizer, train_dataloader, lr_scheduler)`` for a short training run.

    The model is the course checkpoint, the dataloader holds the first
    64 training pairs in batches of 16, the optimizer is Adam at 1e-3 and the
    schedule warms up over 10% of one epoch. The same ``seed`` gives the same objects.
    """
    check_int_in_range(seed, "seed", 0, 2**32 - 1)  # set_seed's range
    set_seed(seed)
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=EXERCISE_BATCH_SIZE, seed=seed, limit=EXERCISE_EXAMPLES)
    optimizer = optimizers.make_optimizer("adam", model.parameters(), lr=EXERCISE_LR)
    num_training_steps = len(train_dataloader)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * num_training_steps), num_training_steps)
    return model, optimizer, train_dataloader, lr_scheduler


# --------------------------------------------------------------------------- q1


def _whole_number(value):
    """Return ``value`` as an int if it is a whole number of an integer type (Python, NumPy, torch), else None."""
    number = as_number(value)
    if number is None or not isinstance(number[0], int):
        return None
    return number[0]


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
        epochs, batches = _whole_number(num_epochs), _whole_number(num_batches_per_epoch)
        for name, value in (("num_epochs", epochs), ("num_batches_per_epoch", batches)):
            if value is None or not 0 < value < 10**12:  # beyond any training, and beyond a float's reach
                raise Incorrect(f"`{name}` should be the positive int the cell above sets; run that cell again.")
        steps = _whole_number(num_warmup_steps)
        if steps is None:
            number = as_number(num_warmup_steps)
            if number is not None and isinstance(number[0], float) and not math.isfinite(number[0]):
                raise Incorrect(
                    f"`num_warmup_steps` is {describe_value(num_warmup_steps)}, not a number of steps: "
                    "a division by zero or an overflow?"
                )
            if number is not None:
                raise Incorrect(
                    f"`num_warmup_steps` is {describe_value(num_warmup_steps)}, not an int: the schedule counts whole "
                    "steps, and `get_linear_schedule_with_warmup` expects an int. Wrap it in `int(...)`."
                )
            raise Incorrect(f"`num_warmup_steps` should be a whole number of steps, but it is {describe_value(num_warmup_steps)}.")
        total_steps = epochs * batches
        # 10% is rarely whole: int() rounds down, round() and math.ceil() may round up; one step either way is fine.
        if math.floor(0.1 * total_steps) <= steps <= math.ceil(0.1 * total_steps):
            return None
        if steps == 10:
            raise Incorrect("10% means a fraction, 0.1, of *all* the training steps (over every epoch), not 10 steps.")
        if math.floor(0.1 * batches) <= steps <= math.ceil(0.1 * batches):
            raise Incorrect("That is 10% of one epoch. The warm-up is 10% of *all* training steps, over every epoch.")
        if steps == total_steps:
            raise Incorrect("That is every training step: the learning rate would only ever rise. Take 10% of it.")
        if not 0 <= steps <= total_steps:
            raise Incorrect(f"`num_warmup_steps` is {describe_value(steps)}: a warm-up is a part of the training steps.")
        share = 100 * steps / total_steps
        raise Incorrect(f"`num_warmup_steps` is {steps:,}, which is {share:.3g}% of the training steps, not 10%.")


# --------------------------------------------------------------------------- q2

_PREPARE_RETURNS_NEW_OBJECTS = "`prepare` returns new objects: train with those."


def _accelerators(accelerator):
    """Return ``accelerator`` (if it is one) and every other live Accelerator: the learner may have made their own."""
    import gc

    found = [accelerator] if isinstance(accelerator, Accelerator) else []
    # type(), not isinstance(): isinstance also reads an object's __class__, and a few of the
    # kernel's objects warn when read (torch.distributed.reduce_op: a FutureWarning the learner would see).
    found += [obj for obj in gc.get_objects() if issubclass(type(obj), Accelerator) and obj is not accelerator]
    return found


def _knows_any(accelerator, *objects):
    """Return True if ``accelerator`` prepared any of ``objects`` (or the original any of them wraps)."""
    prepared = [*accelerator._models, *accelerator._optimizers, *accelerator._dataloaders, *accelerator._schedulers]
    inner = [getattr(p, "optimizer", None) for p in accelerator._optimizers]
    inner += [getattr(p, "scheduler", None) for p in accelerator._schedulers]
    return any(obj is known for obj in objects for known in prepared + inner if known is not None)


# Exercise 2's own names: the lesson's sections use `model`, `optimizer`, `train_dataloader` and
# `lr_scheduler`, and an exercise must not rebind them (re-running a section afterwards would train
# on the exercise's 4-batch loader). Each role of a training object, and the name it has in exercise 2.
EXERCISE_NAMES = {"model": "my_model", "optimizer": "my_optimizer", "train_dataloader": "my_dataloader",
                  "lr_scheduler": "my_scheduler"}


def _prepared_but_ignored(accelerators, optimizer, train_dataloader, lr_scheduler):
    """Return the roles whose original object some Accelerator prepared although the name still holds the original."""
    ignored = []
    for accelerator in accelerators:
        if any(getattr(prepared, "optimizer", None) is optimizer for prepared in accelerator._optimizers):
            ignored.append("optimizer")
        dataset = getattr(train_dataloader, "dataset", None)
        if dataset is not None and any(getattr(p, "dataset", None) is dataset for p in accelerator._dataloaders):
            ignored.append("train_dataloader")
        if any(getattr(prepared, "scheduler", None) is lr_scheduler for prepared in accelerator._schedulers):
            ignored.append("lr_scheduler")
    return sorted(set(ignored), key=["optimizer", "train_dataloader", "lr_scheduler"].index)


def _names(names):
    return ", ".join(f"`{name}`" for name in names)


def _exercise_names(roles):
    return _names(EXERCISE_NAMES[role] for role in roles)


class PrepareObjects(Exercise):
    title = "Exercise 2"
    variables = ["my_accelerator", *EXERCISE_NAMES.values()]
    hints = [
        "`my_accelerator.prepare(...)` takes all four objects in one call.",
        "It returns new objects, in the order you passed them: assign the result to the same four names.",
        "`my_model, my_optimizer, my_dataloader, my_scheduler = my_accelerator.prepare(my_model, my_optimizer, "
        "my_dataloader, my_scheduler)`",
    ]
    solution_code = """
        my_model, my_optimizer, my_dataloader, my_scheduler = my_accelerator.prepare(
            my_model, my_optimizer, my_dataloader, my_scheduler
        )
    """
    correct_message = "All four names now hold the objects Accelerate prepared."

    # What each role's name should hold once prepared.
    prepared_types = {
        "optimizer": AcceleratedOptimizer,
        "train_dataloader": DataLoaderAdapter,
        "lr_scheduler": AcceleratedScheduler,
    }

    def check_answer(self, my_accelerator, my_model, my_optimizer, my_dataloader, my_scheduler):
        return self._judge(my_accelerator, my_model, my_optimizer, my_dataloader, my_scheduler)

    def _judge(self, accelerator, model, optimizer, train_dataloader, lr_scheduler):
        values = {"optimizer": optimizer, "train_dataloader": train_dataloader, "lr_scheduler": lr_scheduler}
        for role, value in values.items():
            for other_role, other_type in self.prepared_types.items():
                if other_role != role and isinstance(value, other_type):
                    raise Incorrect(
                        f"`{EXERCISE_NAMES[role]}` holds the prepared {other_role.replace('_', ' ')}: `prepare` returns "
                        "the objects in the order you pass them. Keep the same order on both sides of `=`."
                    )
        if isinstance(model, tuple(self.prepared_types.values())):
            raise Incorrect("`my_model` holds another prepared object: keep the same order on both sides of `=`.")
        if not isinstance(model, torch.nn.Module):
            raise Incorrect(f"`my_model` should be the model, but it is {describe_value(model)}.")
        missing = [role for role, value in values.items() if not isinstance(value, self.prepared_types[role])]
        accelerators = [accelerator] if isinstance(accelerator, Accelerator) else []
        if not missing and any(prepared is model for acc in accelerators for prepared in acc._models):
            return None
        if not accelerators or not _knows_any(accelerators[0], model, optimizer, train_dataloader, lr_scheduler):
            accelerators = _accelerators(accelerator)  # the learner may have prepared with an Accelerator of their own
        if not any(prepared is model for acc in accelerators for prepared in acc._models):
            missing.insert(0, "model")
        if not missing:
            return None
        ignored = [r for r in _prepared_but_ignored(accelerators, optimizer, train_dataloader, lr_scheduler) if r in missing]
        if ignored:
            raise Incorrect(
                f"{_PREPARE_RETURNS_NEW_OBJECTS} You called `prepare`, but {_exercise_names(ignored)} still "
                f"{'holds' if len(ignored) == 1 else 'hold'} the original{'s' if len(ignored) > 1 else ''}: "
                "assign what it returns, `my_model, my_optimizer, my_dataloader, my_scheduler = my_accelerator.prepare(...)`."
            )
        raise Incorrect(
            f"{_exercise_names(missing)} {'was' if len(missing) == 1 else 'were'} not passed through `accelerator.prepare`. "
            "Accelerate can only place, shard and synchronise the objects it has prepared."
        )


# --------------------------------------------------------------------------- q3

STARTER_LOOP = """
def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
    device = torch.device("cpu")
    model.to(device)
    losses = []
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses
"""

SOLUTION_LOOP = """
def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
    accelerator = Accelerator()
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    losses = []
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses
"""

# The methods that move a tensor or a model to a device: what a converted loop no longer needs to call.
_MOVING_METHODS = [(torch.Tensor, "to"), (torch.Tensor, "cpu"), (torch.Tensor, "cuda"),
                   (torch.nn.Module, "to"), (torch.nn.Module, "cpu"), (torch.nn.Module, "cuda")]


class _Recorder:
    """What a learner's loop did with the objects it was given: filled in by the patches of :meth:`watch`."""

    def __init__(self, model, optimizer, train_dataloader, lr_scheduler):
        self.originals = {"model": model, "optimizer": optimizer, "train_dataloader": train_dataloader,
                          "lr_scheduler": lr_scheduler}
        self.prepared = set()  # names of the originals that went through a prepare method
        self.used_originals = set()  # names of originals the loop used directly after preparing them
        self.events = []  # ("forward", training) and ("backward", through_accelerator), in order
        self.moves = []  # (what, device) for each move to a device the learner's own code made
        self._inside = threading.local()

    def _flag(self, name):
        return getattr(self._inside, name, 0) > 0

    @contextlib.contextmanager
    def _within(self, name):
        setattr(self._inside, name, getattr(self._inside, name, 0) + 1)
        try:
            yield
        finally:
            setattr(self._inside, name, getattr(self._inside, name) - 1)

    def _recording_prepare(self, method):
        recorder = self

        def prepare_one(accelerator, obj, *args, **kwargs):
            for name, original in recorder.originals.items():
                if obj is original:
                    recorder.prepared.add(name)
            with recorder._within("prepare"):
                return method(accelerator, obj, *args, **kwargs)

        return prepare_one

    def _through(self, method, flag):
        recorder = self

        def wrapped(*args, **kwargs):
            with recorder._within(flag):
                return method(*args, **kwargs)

        return wrapped

    def _direct(self, name, method):
        # functools.wraps keeps the marks torch's schedulers put on `optimizer.step` (no "overridden" warning).
        @functools.wraps(method)
        def wrapped(*args, **kwargs):
            if name in self.prepared and not self._flag("accelerate"):
                self.used_originals.add(name)
            return method(*args, **kwargs)

        return wrapped

    def _recording_move(self, method, learner_codes):
        """Wrap a moving method so that a call made by the learner's own code records where it moved what."""
        recorder = self

        @functools.wraps(method)
        def wrapped(obj, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller in learner_codes:
                device = _target_device(method.__name__, args, kwargs)
                # `accelerator.device` is the process's one device object, shared by every Accelerator.
                on_accelerator = device is PartialState._shared_state.get("device")
                if device is not None and not on_accelerator:
                    what = "the model" if isinstance(obj, torch.nn.Module) else "a tensor"
                    recorder.moves.append((what, device))
            return method(obj, *args, **kwargs)

        return wrapped

    @contextlib.contextmanager
    def watch(self, learner_function=None):
        """Record what ``learner_function`` (optional: whose own calls to ``.to()`` count as moves) does."""
        model, optimizer, loader, scheduler = self.originals.values()
        original_backward, original_accelerator_backward = torch.Tensor.backward, Accelerator.backward
        recorder = self

        def tensor_backward(tensor, *args, **kwargs):
            recorder.events.append(("backward", recorder._flag("backward")))
            return original_backward(tensor, *args, **kwargs)

        class WatchedLoader(type(loader)):
            def __iter__(self):
                if not recorder._flag("prepare") and "train_dataloader" in recorder.prepared:
                    recorder.used_originals.add("train_dataloader")
                return super().__iter__()

        hook = model.register_forward_pre_hook(lambda module, args: self.events.append(("forward", module.training)))
        patches = [mock.patch.object(Accelerator, name, self._recording_prepare(getattr(Accelerator, name)))
                   for name in ("prepare_model", "prepare_optimizer", "prepare_data_loader", "prepare_scheduler")]
        patches += [
            mock.patch.object(Accelerator, "backward", self._through(original_accelerator_backward, "backward")),
            mock.patch.object(torch.Tensor, "backward", tensor_backward),
            mock.patch.object(AcceleratedOptimizer, "step", self._through(AcceleratedOptimizer.step, "accelerate")),
            mock.patch.object(AcceleratedScheduler, "step", self._through(AcceleratedScheduler.step, "accelerate")),
            mock.patch.object(optimizer, "step", self._direct("optimizer", optimizer.step)),
            mock.patch.object(scheduler, "step", self._direct("lr_scheduler", scheduler.step)),
        ]
        learner_codes = _code_objects(getattr(learner_function, "__code__", None))
        if learner_codes:
            # transformers' models override `to`, `cpu` and `cuda`: patch every class of the model that defines one.
            methods = [(owner, name, getattr(owner, name)) for owner, name in _MOVING_METHODS if owner is torch.Tensor]
            methods += [(cls, name, vars(cls)[name]) for cls in type(model).__mro__
                        for owner, name in _MOVING_METHODS if owner is torch.nn.Module and name in vars(cls)]
            patches += [mock.patch.object(owner, name, self._recording_move(method, learner_codes))
                        for owner, name, method in methods]
        loader_class = type(loader)
        loader.__class__ = WatchedLoader
        try:
            with contextlib.ExitStack() as stack:
                for patch in patches:
                    stack.enter_context(patch)
                yield self
        finally:
            loader.__class__ = loader_class
            hook.remove()


_reference_runs = {}


def _reference_run(num_epochs=1):
    """Return (final parameters, losses) of the solution loop on the exercise problem (computed once per process)."""
    if num_epochs not in _reference_runs:
        namespace = {"torch": torch, "Accelerator": Accelerator}
        exec(SOLUTION_LOOP, namespace)
        model, optimizer, train_dataloader, lr_scheduler = fresh_training_objects()
        losses = namespace["train_with_accelerate"](model, optimizer, lr_scheduler, train_dataloader, num_epochs)
        _reference_runs[num_epochs] = ([p.detach().clone() for p in model.parameters()], losses)
    return _reference_runs[num_epochs]


def _code_objects(code):
    """Return the set of ``code`` and every code object nested in it (comprehensions, lambdas, inner functions)."""
    if not isinstance(code, types.CodeType):
        return set()
    found = {code}
    for const in code.co_consts:
        found |= _code_objects(const)
    return found


def _target_device(method_name, args, kwargs):
    """Return the device a call of ``.to(*args, **kwargs)``, ``.cpu()`` or ``.cuda()`` moves to, or None (a dtype only)."""
    if method_name == "cpu":
        return "cpu"
    if method_name == "cuda":
        return "cuda"
    try:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
    except Exception:  # arguments torch will refuse: the call itself raises, and the learner sees that
        return None
    if device is None:
        return None
    # The argument itself, when it is the object passed (so that `accelerator.device` is recognised by identity).
    passed = kwargs.get("device", args[0] if args else None)
    return passed if isinstance(passed, (str, torch.device)) else device


class ConvertLoop(Exercise):
    title = "Exercise 3"
    variables = ["train_with_accelerate"]
    hints = [
        "Start the function with `accelerator = Accelerator()`, then pass the four objects through `accelerator.prepare` "
        "and keep what it returns: `model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(...)`.",
        "A prepared dataloader yields batches already on the right device: delete `device`, `model.to(device)` "
        "and the line that moves the batch.",
        "Replace `loss.backward()` with `accelerator.backward(loss)`: it scales the loss for mixed precision and "
        "gradient accumulation. (The averaging of gradients across processes is done by the wrapper `prepare` "
        "puts around the model, during any backward.)",
    ]
    solution_code = SOLUTION_LOOP
    correct_message = (
        "Same parameters as the reference loop: the objects you train with are the prepared ones, and the code runs "
        "unchanged on GPUs and several processes."
    )
    time_limit_s = 120.0
    time_limit_cause = "A loop over `range(num_epochs)` and the batches of `train_dataloader` ends; does yours?"

    def check_answer(self, train_with_accelerate):
        if not callable(train_with_accelerate):
            raise Incorrect(f"`train_with_accelerate` should be a function, but it is {describe_value(train_with_accelerate)}.")
        source = _source_of(train_with_accelerate)
        if source is not None and source == _normalised(STARTER_LOOP):
            raise NotAttempted("`train_with_accelerate` is still the plain loop: edit it, run the cell, then check again.")
        model, optimizer, train_dataloader, lr_scheduler = fresh_training_objects()
        recorder = _Recorder(model, optimizer, train_dataloader, lr_scheduler)
        with recorder.watch(train_with_accelerate):
            losses = self.call_learner(train_with_accelerate, model, optimizer, lr_scheduler, train_dataloader, 1)
        self._judge_moves(recorder)
        self._judge(recorder, losses, len(train_dataloader), lr_scheduler)
        self._compare_with_reference(model, losses)

    @staticmethod
    def _judge_moves(recorder):
        """Reject a loop whose own code moved the model or a tensor to a device it chose (judged by the calls made)."""
        if not recorder.moves:
            return
        moved = sorted({what for what, _ in recorder.moves}, key=["the model", "a tensor"].index)
        device = str(recorder.moves[0][1])
        raise Incorrect(
            f'Your function still moves {" and ".join(moved)} to a device it chose itself, "{device}" (with `.to(...)`, '
            "`.cpu()` or `.cuda()`): after `prepare`, the model and every batch are already on the right device, "
            "whatever the machine. Remove `model.to(device)` and the line that moves the batch."
        )

    @staticmethod
    def _judge(recorder, losses, steps, lr_scheduler):
        if not recorder.prepared:
            raise Incorrect(
                "Nothing went through `prepare`: create an `Accelerator()` and pass the four objects to "
                "`accelerator.prepare`."
            )
        missing = [name for name in recorder.originals if name not in recorder.prepared]
        if missing:
            raise Incorrect(f"{_names(missing)} never went through `accelerator.prepare`: pass all four objects to it.")
        if recorder.used_originals:
            used = [name for name in recorder.originals if name in recorder.used_originals]
            raise Incorrect(
                f"{_PREPARE_RETURNS_NEW_OBJECTS} Your loop still uses the original {_names(used)}, so on several "
                "processes each one would train alone on all the data. Keep what `prepare` returns: "
                "`model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(...)`."
            )
        backwards = [through for kind, through in recorder.events if kind == "backward"]
        if not backwards:
            raise Incorrect("Your loop never computed gradients: call `accelerator.backward(loss)` after the forward pass.")
        if not all(backwards):
            raise Incorrect(
                "Your loop calls `loss.backward()` directly. Use `accelerator.backward(loss)`: it divides the loss when "
                "gradients are accumulated, scales it in fp16 mixed precision and hands over to DeepSpeed or Megatron "
                "where they are used. (Gradients are averaged across processes by the wrapper `prepare` puts around "
                "the model, during either call.)"
            )
        last_forward_mode = None
        for kind, value in recorder.events:
            if kind == "forward":
                last_forward_mode = value
            elif last_forward_mode is False:
                raise Incorrect(
                    "The forward passes you trained on ran in evaluation mode (dropout off): call `model.train()` "
                    "before the training loop."
                )
        if lr_scheduler.last_epoch == 0:
            raise Incorrect("The learning rate never changed: call `lr_scheduler.step()` after `optimizer.step()`.")
        if not isinstance(losses, (list, tuple)) or len(losses) != steps:
            length = f" of length {len(losses)}" if isinstance(losses, (list, tuple)) else ""
            raise Incorrect(
                f"`train_with_accelerate` should return the list of losses, one per step ({steps} steps here), "
                f"but it returned {describe_value(losses) if not length else 'a ' + type(losses).__name__ + length}."
            )
        if any(torch.is_tensor(loss) for loss in losses):
            raise Incorrect(
                "The losses should be Python numbers: append `loss.item()`, not the tensor `loss` (each tensor also "
                "keeps its whole graph alive)."
            )
        if not all(as_number(loss) is not None for loss in losses):
            raise Incorrect("The losses should be numbers: append `loss.item()` at each step.")

    @staticmethod
    def _compare_with_reference(model, losses):
        reference_parameters, reference_losses = _reference_run()
        parameters = [parameter.detach() for parameter in model.parameters()]
        if any(parameter.isnan().any() for parameter in parameters):
            raise Incorrect(
                "After training, your parameters became NaN (not a number): a division by zero or an overflow? "
                "Compare how your loop computes the loss with the plain loop's `loss = outputs.loss`."
            )
        if any(parameter.isinf().any() for parameter in parameters):
            raise Incorrect(
                "After training, some of your parameters are infinite: an overflow, or a division by zero? "
                "Compare how your loop computes the loss with the plain loop's `loss = outputs.loss`."
            )
        largest_gap = max((mine - theirs).abs().max().item() for mine, theirs in zip(parameters, reference_parameters))
        try:
            losses_agree = all(math.isclose(as_number(a)[0], b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(losses, reference_losses))
        except OverflowError:  # a "loss" too large for a float agrees with nothing
            losses_agree = False
        # Accept only on a positive test: a NaN gap is not "small" (NaN <= 1e-5 is False).
        if largest_gap <= 1e-5 and not losses_agree:
            raise Incorrect(
                "Your model trained exactly like the reference, but the losses you return are not its losses: "
                "append `loss.item()` once per step, right after the forward pass's loss is computed."
            )
        if not largest_gap <= 1e-5:
            raise Incorrect(
                "After training, your model's parameters differ from the reference loop's (largest gap "
                f"{largest_gap:.2e}). Compare the order of forward, backward, the two steps and `zero_grad` with the "
                "plain loop (an extra seed or random call also changes them)."
            )


def _source_of(function):
    """Return the normalised source of ``function``, or None when it cannot be read or parsed (exec, a lambda)."""
    try:
        return _normalised(inspect.getsource(function))
    except Exception:
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
            raise Incorrect(f"`answer` should be a string: \"a\", \"b\" or \"c\", but it is {describe_value(answer)}.")
        choice = answer.strip().lower().rstrip(".")
        if choice not in ("a", "b", "c"):
            raise Incorrect(f"`answer` should be \"a\", \"b\" or \"c\", not {answer!r}.")
        if choice != self.expected:
            raise Incorrect(self.reasons[choice])


q1 = WarmupSteps()
q2 = PrepareObjects()
q3 = ConvertLoop()
q4 = TrainerOrCustomLoop()
