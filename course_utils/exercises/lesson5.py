"""Exercises of lesson 5: making training fit.

- ``q1``: gradient accumulation, so that micro-batches of 8 take the steps of batches of 32
- ``q2``: gradient clipping in the right place of an accumulating loop
- ``q3``: levers that make a BERT-large fine-tuning fit in 8 GB, checked with the planner
- ``q4``: resuming an interrupted training from its saved state

Each check trains on a few pairs of the course data (about a second a run)
and judges what the learner's code did to the model, not how it is written.
"""

from __future__ import annotations

import math
import tempfile
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import AutoModelForSequenceClassification, BertConfig

from course_utils import accelerate_state, data, feature_loops, levers, loops, memory, models, optimizers, parallel, schedules
from course_utils.exercises.core import Exercise, Incorrect, describe_value
from course_utils.units import GB, format_bytes

EXAMPLES = 64  # 2 batches of 32, 8 micro-batches of 8
MICRO_BATCH_SIZE = 8
BIG_BATCH_SIZE = 32
ACCUMULATION_STEPS = BIG_BATCH_SIZE // MICRO_BATCH_SIZE
SEED = 0


def dropout_free_classifier():
    """Return the course checkpoint with every dropout at 0, so runs differ only by how they batch."""
    return parallel.without_dropout(models.load_pretrained_classifier())


def _sgd_objects(batch_size):
    """Model, SGD optimizer (no momentum, so an update is lr x gradient), constant schedule, dataloader."""
    set_seed(SEED)
    model = dropout_free_classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train_dataloader = data.make_dataloader("train", batch_size=batch_size, seed=SEED, limit=EXAMPLES)
    return model, optimizer, lr_scheduler, train_dataloader


def _parameters(model):
    return [parameter.detach().clone() for parameter in model.parameters()]


def _largest_gap(first, second):
    return max((a - b).abs().max().item() for a, b in zip(first, second))


def _all_finite(model):
    """Return True if every parameter of ``model`` is finite (no NaN, no infinity)."""
    return all(bool(torch.isfinite(p.detach()).all()) for p in model.parameters())


NOT_FINITE = ("Your parameters became NaN or infinite: a division by zero or an overflow in the loss or the step? "
              "Keep the step as lesson 1's loop has it.")


def _count_steps(optimizer):
    """Return a list that gets one entry per real ``optimizer.step()``."""
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))
    return steps


_reference_cache: dict[str, object] = {}

# One step of lesson 1's loop, as the solutions of exercises 1 and 4 write it.
_STEP_LINES = ("outputs = model(**batch)", "loss = outputs.loss", "accelerator.backward(loss)",
               "optimizer.step()", "lr_scheduler.step()", "optimizer.zero_grad()")


def _with_step(head, indent):
    """Return the source ``head`` (ending in its loop's header line) followed by the step, ``indent`` spaces deep."""
    return head.rstrip(" ") + "".join(" " * indent + line + "\n" for line in _STEP_LINES)


def _record_gradient_norms(optimizer, model):
    """Return a list that gets the norm of the whole gradient at every real ``optimizer.step()``."""
    norms = []
    optimizer.register_step_pre_hook(lambda *args: norms.append(_gradient_norm(model)))
    return norms


def _big_batch_run():
    """Parameters after one epoch of SGD on batches of 32 (2 steps), and the gradient norm of the first step."""
    if "big batch" not in _reference_cache:
        model, optimizer, lr_scheduler, train_dataloader = _sgd_objects(BIG_BATCH_SIZE)
        norms = _record_gradient_norms(optimizer, model)
        loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, 1, accelerate_state.fresh_accelerator())
        _reference_cache["big batch"] = (_parameters(model), norms[0])
    return _reference_cache["big batch"]


class AccumulateMicroBatches(Exercise):
    title = "Exercise 1"
    variables = ["train_in_micro_batches"]
    time_limit_s = 60.0
    hints = [
        "A batch of 32 is 32 / 8 micro-batches of 8: that is the number of `gradient_accumulation_steps`.",
        "`with accelerator.accumulate(model):` around the forward, backward and the three step lines lets the "
        "optimizer, the scheduler and `zero_grad` act only on the micro-batch that completes a big batch.",
        "Keep `accelerator.backward(loss)`: it divides each micro-batch's loss by the accumulation steps.",
    ]
    solution_code = _with_step("""
        def train_in_micro_batches(model, optimizer, lr_scheduler, micro_dataloader):
            accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=4)
            model, optimizer, micro_dataloader, lr_scheduler = accelerator.prepare(
                model, optimizer, micro_dataloader, lr_scheduler
            )
            model.train()
            for step, batch in enumerate(micro_dataloader):
                with accelerator.accumulate(model):
    """, indent=20)
    correct_message = "Two optimizer steps of 32 examples each, made of 8 micro-batches: the parameters of the big batches."

    def check_answer(self, train_in_micro_batches):
        if not callable(train_in_micro_batches):
            raise Incorrect(f"`train_in_micro_batches` should be a function, but it is {describe_value(train_in_micro_batches)}.")
        expected, expected_first_norm = _big_batch_run()
        model, optimizer, lr_scheduler, micro_dataloader = _sgd_objects(MICRO_BATCH_SIZE)
        steps = _record_gradient_norms(optimizer, model)
        accelerate_state.fresh_accelerator()  # the learner's own Accelerator(...) then starts from a clean state
        self.call_learner(train_in_micro_batches, model, optimizer, lr_scheduler, micro_dataloader)
        after = _parameters(model)
        wanted_steps = EXAMPLES // BIG_BATCH_SIZE
        if not steps:
            raise Incorrect("The optimizer never took a step: call `optimizer.step()` inside the loop.")
        if len(steps) != wanted_steps:
            examples_per_step = EXAMPLES / len(steps)
            reason = (
                f"The optimizer stepped {len(steps)} times over {EXAMPLES} examples, so each step saw "
                f"{examples_per_step:g} examples, not {BIG_BATCH_SIZE}."
            )
            if len(steps) == EXAMPLES // MICRO_BATCH_SIZE:
                reason += (" Every micro-batch updated the weights: is the step inside "
                           "`with accelerator.accumulate(model):`, and the Accelerator built for accumulation?")
            else:
                reason += " Check `gradient_accumulation_steps`: micro-batches of 8 per batch of 32."
            raise Incorrect(reason)
        if _largest_gap(after, expected) <= 1e-5:
            return None
        if not _all_finite(model):
            raise Incorrect(NOT_FINITE)
        ratio = steps[0] / expected_first_norm
        if abs(ratio - ACCUMULATION_STEPS) < 0.05:
            raise Incorrect(
                f"The first step's gradient is {ratio:.2f} times the big batch's: the micro-batch gradients were added without "
                "being divided. Use `accelerator.backward(loss)`, which divides the loss by the accumulation steps."
            )
        raise Incorrect(
            f"Two steps, as wanted, but the parameters differ from those of batches of 32 (largest gap "
            f"{_largest_gap(after, expected):.1e}). Does `zero_grad()` run only with the step, inside `accumulate`, "
            "so that the gradients of a big batch's micro-batches add up?"
        )


CLIP_NORM = 0.05  # below every gradient norm of the exercise's steps, so clipping always acts


def _clip_reference_parameters():
    if "clipped" not in _reference_cache:
        model, optimizer, lr_scheduler, train_dataloader = _sgd_objects(MICRO_BATCH_SIZE)
        accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=ACCUMULATION_STEPS)
        feature_loops.train_clipping(model, optimizer, lr_scheduler, train_dataloader, 1, accelerator, CLIP_NORM)
        _reference_cache["clipped"] = _parameters(model)
    return _reference_cache["clipped"]


class PlaceClipping(Exercise):
    title = "Exercise 2"
    variables = ["train_clipped"]
    time_limit_s = 60.0
    hints = [
        "`accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)` rescales the gradient in place: it must "
        "run after `accelerator.backward(loss)` and before `optimizer.step()`.",
        "While accumulating, the gradient is only complete on the micro-batch that updates: "
        "`if accelerator.sync_gradients:` is True exactly then.",
    ]
    solution_code = """
        def train_clipped(model, optimizer, lr_scheduler, train_dataloader, accelerator, max_grad_norm):
            model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
                model, optimizer, train_dataloader, lr_scheduler
            )
            model.train()
            for step, batch in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
    """
    correct_message = "Clipped once per update, on the whole gradient, just before the step uses it."

    def check_answer(self, train_clipped):
        if not callable(train_clipped):
            raise Incorrect(f"`train_clipped` should be a function, but it is {describe_value(train_clipped)}.")
        expected = _clip_reference_parameters()
        model, optimizer, lr_scheduler, train_dataloader = _sgd_objects(MICRO_BATCH_SIZE)
        accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=ACCUMULATION_STEPS)
        events = _ClipEvents(model, accelerator)
        optimizer.register_step_pre_hook(lambda *args: events.step())
        with events.recording():
            self.call_learner(train_clipped, model, optimizer, lr_scheduler, train_dataloader, accelerator, CLIP_NORM)
        wanted_steps = EXAMPLES // BIG_BATCH_SIZE
        if len(events.norms_at_step) != wanted_steps:
            raise Incorrect(
                f"The optimizer stepped {len(events.norms_at_step)} times instead of {wanted_steps}: keep the step "
                "inside `with accelerator.accumulate(model):` as the loop had it."
            )
        reason = _clipping_mistake(events, model)
        if reason is not None:
            raise Incorrect(reason)
        # Accepted only on a positive test: every step's gradient within the threshold, the parameters the reference's.
        clipped_everywhere = all(norm <= CLIP_NORM * (1 + 1e-3) for norm in events.norms_at_step)
        if clipped_everywhere and _largest_gap(_parameters(model), expected) <= 1e-5:
            return None
        if not clipped_everywhere:
            raise Incorrect(
                f"`optimizer.step()` used a gradient of norm {max(events.norms_at_step):.3f}, above `max_grad_norm` = "
                f"{CLIP_NORM}. Clip with `accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)` between "
                "`accelerator.backward(loss)` and `optimizer.step()`."
            )
        if not events.clips():
            raise Incorrect(
                "No clipping function ran, and the steps' gradients are not the reference's clipped ones (norms "
                + ", ".join(f"{norm:.3f}" for norm in events.norms_at_step) + "): clamping or rescaling the loss "
                "changes the gradient (a clamped loss has none at all) instead of bounding its norm. Leave the loss "
                "as it is and clip the gradient: `accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)`."
            )
        raise Incorrect(
            "Every step used a gradient within `max_grad_norm`, but the parameters differ from the reference "
            f"(largest gap {_largest_gap(_parameters(model), expected):.1e}): rescale the whole gradient "
            "(`model.parameters()`) by its norm, once per update, and change nothing else of the step."
        )


class _ClipEvents:
    """What happened in the learner's loop, in order: each backward, each clipping call (with its arguments), each step.

    A clipping call is recorded once, whether the learner called Accelerate's or torch's
    (Accelerate's calls torch's inside).
    """

    def __init__(self, model, accelerator):
        self.model, self.accelerator = model, accelerator
        self.sequence = []  # "backward", "step", or a dict describing a clipping call
        self.norms_at_step = []
        self._inside = []

    def step(self):
        self.norms_at_step.append(_gradient_norm(self.model))
        self.sequence.append("step")

    def clips(self):
        return [event for event in self.sequence if isinstance(event, dict)]

    def _record(self, kind, parameters, threshold):
        """Record a clipping call; return ``parameters`` as a list (a generator can be read only once)."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        try:
            parameters = list(parameters)
        except TypeError:
            pass  # torch will say what is wrong with it
        count = len(parameters) if isinstance(parameters, list) else 0
        try:
            threshold_value = float(threshold)
        except (TypeError, ValueError, RuntimeError):
            threshold_value = None
        self.sequence.append({"kind": kind, "parameters": count, "threshold": threshold_value,
                              "on_update": self.accelerator.sync_gradients})
        return parameters

    @contextmanager
    def recording(self):
        events = self
        original_backward = torch.Tensor.backward
        accelerate_clip = Accelerator.clip_grad_norm_
        torch_clip, torch_clip_value = torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_

        def backward(tensor, *args, **kwargs):
            events.sequence.append("backward")
            return original_backward(tensor, *args, **kwargs)

        def recording_accelerate_clip(self_, parameters, max_norm, *args, **kwargs):
            parameters = events._record("norm", parameters, max_norm)
            events._inside.append(True)
            try:
                return accelerate_clip(self_, parameters, max_norm, *args, **kwargs)
            finally:
                events._inside.pop()

        def recording_torch_clip(parameters, max_norm, *args, **kwargs):
            if not events._inside:
                parameters = events._record("norm", parameters, max_norm)
            return torch_clip(parameters, max_norm, *args, **kwargs)

        def recording_clip_value(parameters, clip_value, *args, **kwargs):
            parameters = events._record("value", parameters, clip_value)
            return torch_clip_value(parameters, clip_value, *args, **kwargs)

        with mock.patch.object(torch.Tensor, "backward", backward), \
                mock.patch.object(Accelerator, "clip_grad_norm_", recording_accelerate_clip), \
                mock.patch.object(torch.nn.utils, "clip_grad_norm_", recording_torch_clip), \
                mock.patch.object(torch.nn.utils, "clip_grad_value_", recording_clip_value):
            yield


def _clipping_mistake(events, model):
    """Return the reason the recorded clipping is wrong, from what was recorded of each call; None if none is found."""
    clips = events.clips()
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    bad_threshold = [c["threshold"] for c in clips if c["threshold"] is not None and not math.isfinite(c["threshold"])]
    if bad_threshold:
        return (f"A clipping call got a threshold of {bad_threshold[0]}: clipping to a NaN or infinite norm leaves "
                "the gradient NaN or unclipped. Pass `max_grad_norm`, the function's argument.")
    if not _all_finite(model):
        return NOT_FINITE
    if any(c["kind"] == "value" for c in clips):
        return ("`clip_grad_value_` clamps each value of the gradient on its own, which changes its direction. "
                "Clip the whole gradient by its norm: `accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)`.")
    if any(not c["on_update"] for c in clips):
        return (f"The gradient was clipped on {sum(not c['on_update'] for c in clips)} micro-batches that do not update: "
                "there it is a partial sum, and clipping it changes the total. Clip only `if accelerator.sync_gradients:`.")
    if any(c["parameters"] < trainable for c in clips):
        fewest = min(c["parameters"] for c in clips)
        return (f"A clipping call got {fewest} of the model's {trainable} parameter tensors: clipping each parameter (or "
                "a part) separately bounds each piece's norm, not the whole gradient's. Pass all of them at once: "
                "`model.parameters()`.")
    typed = [c["threshold"] for c in clips if c["threshold"] is not None and not math.isclose(c["threshold"], CLIP_NORM)]
    if typed:
        return (f"The gradient was clipped to a norm of {typed[0]:g}, not to `max_grad_norm` (here {CLIP_NORM}): "
                "pass the function's argument `max_grad_norm` rather than a number typed in.")
    if clips:
        misplaced = _misplaced_clip(events.sequence)
        if misplaced is not None:
            return misplaced
    elif not all(norm <= CLIP_NORM * (1 + 1e-3) for norm in events.norms_at_step):
        return (f"`optimizer.step()` used a gradient of norm {max(events.norms_at_step):.3f}, above `max_grad_norm` = "
                f"{CLIP_NORM}: nothing clipped it. Call `accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)`.")
    return None


def _misplaced_clip(sequence):
    """Return a reason if some step ran without a clipping call between its last backward and itself, else None."""
    clipped_since_backward = clipped_before_backward = False  # within the current update
    for event in sequence:
        if event == "backward":
            clipped_before_backward |= clipped_since_backward
            clipped_since_backward = False
        elif event == "step":
            if not clipped_since_backward:
                where = ("before the backward that completes the gradient" if clipped_before_backward
                         else "after the step")
                return (f"A step used a gradient that no clipping call had seen: the clipping came {where}. Put it "
                        "between `accelerator.backward(loss)` and `optimizer.step()`, on the micro-batch that updates.")
            clipped_since_backward = clipped_before_backward = False
        else:
            clipped_since_backward = True
    return None


def _gradient_norm(model):
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(gradients).item() if gradients else 0.0


# BERT-large: 24 blocks of width 1,024, 16 heads, feed-forward 4,096 (335M parameters with a 2-label head).
BERT_LARGE_CLASS = AutoModelForSequenceClassification
BERT_LARGE_CONFIG = BertConfig(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, num_labels=2
)
BERT_LARGE_SEQ_LEN = 256
BERT_LARGE_BATCH = 32
BERT_LARGE_BUDGET = 8 * GB


class FitBertLarge(Exercise):
    title = "Exercise 3"
    variables = ["bert_large_levers"]
    time_limit_s = 120.0
    hints = [
        "Start from `levers.Levers()` (nothing on) and look at `levers.plan_with_levers(...)`: which part is the "
        "largest? At this batch it is the activations.",
        "Three levers shrink activations: smaller micro-batches (with accumulation to keep 32 sequences per step), "
        "activation checkpointing, and bf16 autocast (`mixed_precision=\"bf16\"`).",
        "Every parameter trains in fp32, so `train=\"all\"` and `bf16_weights=False` stay; the weights, gradients "
        "and AdamW state alone take about 5.4 GB, the rest must fit in what is left.",
    ]
    solution_code = """
        bert_large_levers = levers.Levers(activation_checkpointing=True, micro_batch_size=32)
    """
    correct_message = "The planner says it fits, with every parameter trained in fp32 and 32 sequences per step."

    def check_answer(self, bert_large_levers):
        if not isinstance(bert_large_levers, levers.Levers):
            raise Incorrect(
                f"`bert_large_levers` should be a `levers.Levers(...)`, but it is {describe_value(bert_large_levers)}."
            )
        levers_ = bert_large_levers
        if levers_.train != "all":
            raise Incorrect(f"`train={levers_.train!r}` trains only part of the model; the task is to fine-tune "
                            "every parameter (`train=\"all\"`).")
        if levers_.bf16_weights:
            raise Incorrect("`bf16_weights=True` stores the weights in bf16, where small updates vanish (section 3). "
                            "Keep fp32 weights; `mixed_precision=\"bf16\"` is the safe way to use bf16.")
        if levers_.effective_batch_size != BERT_LARGE_BATCH:
            raise Incorrect(
                f"Each optimizer step sees {levers_.micro_batch_size} x {levers_.gradient_accumulation_steps} = "
                f"{levers_.effective_batch_size} sequences; the recipe asks for {BERT_LARGE_BATCH}."
            )
        try:
            plan = levers.plan_with_levers(BERT_LARGE_CLASS, BERT_LARGE_CONFIG, levers_, BERT_LARGE_SEQ_LEN)
        except memory.PlannerRefused as error:
            raise Incorrect(f"The planner cannot follow this combination: {error}") from error
        if not math.isfinite(plan.peak):
            raise Incorrect(f"The planner's peak for these levers is {plan.peak}, not a number of bytes: the check "
                            "cannot say it fits. Try another combination of levers.")
        if not (plan.peak <= BERT_LARGE_BUDGET):  # accepted only on a positive test
            parts = {"activations": plan.activations, "optimizer state": plan.optimizer_state,
                     "gradients": plan.gradients, "weights": plan.weights}
            largest = max(parts, key=parts.get)
            raise Incorrect(
                f"The planner's peak is {format_bytes(plan.peak)} ({plan.phase_of_peak}), above the "
                f"{format_bytes(BERT_LARGE_BUDGET)} of the GPU; the largest part is the {largest} "
                f"({format_bytes(parts[largest])}). Which lever shrinks that?"
            )


RESUME_EXAMPLES = 128  # 8 steps of 16
RESUME_BATCH_SIZE = 16
RESUME_AFTER = 5
_checkpoint_dirs: list[tempfile.TemporaryDirectory] = []  # kept alive until the kernel ends


def resume_objects():
    """Return fresh ``(model, optimizer, lr_scheduler, train_dataloader, accelerator)`` for the resume exercise."""
    set_seed(SEED)
    model = models.load_pretrained_classifier()  # dropout on: the saved random state matters
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=1e-3)
    train_dataloader = data.make_dataloader("train", batch_size=RESUME_BATCH_SIZE, seed=SEED, limit=RESUME_EXAMPLES)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, len(train_dataloader))
    return model, optimizer, lr_scheduler, train_dataloader, accelerate_state.fresh_accelerator()


def interrupted_training():
    """Run the exercise's training until it is interrupted; return ``(checkpoint folder, completed steps)``.

    The state was saved with ``accelerator.save_state`` after the last completed step.
    """
    folder = tempfile.TemporaryDirectory(prefix="lesson5_resume_")
    _checkpoint_dirs.append(folder)
    model, optimizer, lr_scheduler, train_dataloader, accelerator = resume_objects()
    feature_loops.train_resumable(model, optimizer, lr_scheduler, train_dataloader, 1, accelerator,
                           checkpointing_steps=RESUME_AFTER, output_dir=folder.name, stop_after_steps=RESUME_AFTER + 1)
    return str(Path(folder.name) / f"step_{RESUME_AFTER}"), RESUME_AFTER


def _uninterrupted_parameters():
    if "uninterrupted" not in _reference_cache:
        model, optimizer, lr_scheduler, train_dataloader, accelerator = resume_objects()
        loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, 1, accelerator)
        _reference_cache["uninterrupted"] = _parameters(model)
    return _reference_cache["uninterrupted"]


class ResumeTraining(Exercise):
    title = "Exercise 4"
    variables = ["resume"]
    time_limit_s = 60.0
    hints = [
        "`accelerator.load_state(checkpoint_folder)` puts back the weights, AdamW's moments, the scheduler's "
        "position and the random generators; it fills the objects `prepare` returned, so it comes after `prepare`.",
        "The first `completed_steps` batches were already trained on: "
        "`accelerator.skip_first_batches(train_dataloader, completed_steps)` yields the others.",
    ]
    solution_code = _with_step("""
        def resume(model, optimizer, lr_scheduler, train_dataloader, accelerator, checkpoint_folder, completed_steps):
            model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
                model, optimizer, train_dataloader, lr_scheduler
            )
            accelerator.load_state(checkpoint_folder)
            model.train()
            for step, batch in enumerate(accelerator.skip_first_batches(train_dataloader, completed_steps)):
    """, indent=16)
    correct_message = "The resumed training ends on exactly the parameters of the one that was never interrupted."

    def check_answer(self, resume):
        if not callable(resume):
            raise Incorrect(f"`resume` should be a function, but it is {describe_value(resume)}.")
        expected = _uninterrupted_parameters()
        folder, completed = interrupted_training()
        model, optimizer, lr_scheduler, train_dataloader, accelerator = resume_objects()
        steps = _count_steps(optimizer)
        loads = []  # for each load_state call: how many models prepare had registered by then
        original_load = Accelerator.load_state

        def recording_load(self_, *args, **kwargs):
            loads.append(len(self_._models))
            return original_load(self_, *args, **kwargs)

        before_prepare = Incorrect("`load_state` ran before `prepare`, when Accelerate had nothing to load the "
                                   "state into. Call it after `accelerator.prepare(...)`.")
        try:
            with mock.patch.object(Accelerator, "load_state", recording_load):
                self.call_learner(resume, model, optimizer, lr_scheduler, train_dataloader, accelerator, folder, completed)
        except Incorrect as error:
            if loads and loads[0] == 0:
                raise before_prepare from error
            raise
        remaining = len(train_dataloader) - completed
        if not loads:
            raise Incorrect("The saved state was never loaded: call `accelerator.load_state(checkpoint_folder)`. "
                            "Without it the model, the optimizer and the schedule start over.")
        if loads[0] == 0:
            raise before_prepare
        if len(steps) != remaining:
            raise Incorrect(
                f"The resumed training took {len(steps)} optimizer steps; {completed} of the "
                f"{len(train_dataloader)} batches were done before the interruption. Skip those with "
                "`accelerator.skip_first_batches(train_dataloader, completed_steps)`."
            )
        gap = _largest_gap(_parameters(model), expected)
        if gap <= 1e-6:  # accepted only on a positive test: a NaN gap is not small
            return None
        if not _all_finite(model):
            raise Incorrect(NOT_FINITE)
        raise Incorrect(
            f"The state was loaded and {remaining} steps taken, but the parameters differ from the uninterrupted "
            f"training's (largest gap {gap:.1e}): are the skipped batches the *first* `completed_steps` ones, "
            "and is the model in training mode (`model.train()`)?"
        )


q1 = AccumulateMicroBatches()
q2 = PlaceClipping()
q3 = FitBertLarge()
q4 = ResumeTraining()
