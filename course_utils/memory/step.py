"""The course's training step, written once: run for real by the measurement and on fake tensors by the planner.

:func:`training_step` is one optimizer step over the micro-batches: for each,
the forward pass (:func:`forward`, autocast as Accelerate's prepared model
does it) and the loss (:func:`default_loss` unless the caller gives one),
divided by the micro-batches, ``.backward()``; then ``optimizer.step()`` and
``zero_grad()``. Under a :class:`course_utils.memory._step_tracker.StepTracker`
(or torch's FSDPMemTracker, through ``per_process``'s adapter) it also
records what the tracker saw at the end of each of :data:`PHASES`.
``training_memory.measure_training_step_peak`` runs it on a real model,
``fake_step`` on a fake copy (its passes alone, and whole), ``per_process``
on one process of a sharded model (real or fake).
"""

from __future__ import annotations

import contextlib
import gc

import torch

__all__ = ["PHASES", "default_loss", "forward", "training_step"]

PHASES = ("forward", "backward", "optimizer step")


def default_loss(outputs) -> torch.Tensor:
    """Return the model's own loss, or for a base model (no labels, no loss) the mean of its last hidden state."""
    loss = getattr(outputs, "loss", None)
    if loss is not None:
        return loss
    return outputs.last_hidden_state.mean()


def forward(model, batch, loss_fn, mixed_precision: str) -> torch.Tensor:
    """Return the loss of one forward pass, autocast as Accelerate's prepared model does it."""
    if mixed_precision == "no":
        return loss_fn(model(**batch))
    from accelerate.utils import convert_to_fp32

    # Accelerate wraps the model's forward in autocast and converts its outputs to fp32.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(**batch)
    return loss_fn(convert_to_fp32(outputs))


def training_step(model, optimizer, batch, loss_fn, mixed_precision, steps, tracker=None,
                  in_optimizer_step=contextlib.nullcontext, stop_at_repeat=False) -> dict:
    """Run one optimizer step over ``steps`` micro-batches; with ``tracker``, return what it saw.

    ``tracker``: a :class:`course_utils.memory._step_tracker.StepTracker`, or
    anything with its ``snapshot(kind)`` ({category: bytes}), ``total(kind)``,
    ``start_phase()`` and ``reset_mod_stats()``.
    With ``optimizer`` None, only the forward and backward passes run (the
    planner follows the optimizer step apart). ``in_optimizer_step()`` is a
    context the optimizer step runs in (the planner answers value reads there,
    see ``course_utils.memory.fake_step``). With ``stop_at_repeat``, the
    micro-batches stop once one (from the second on) leaves memory exactly as
    it found it: the next would repeat it. What it saw, in bytes:
    ``peak_by_phase``, ``micro_batch_peaks`` (each micro-batch's forward and
    backward peak), the tracker's snapshots ``after_forward``,
    ``after_backward`` and ``after_step`` (the last micro-batch's), and
    ``repeated`` (it stopped at a repeat).
    """
    seen = {"peak_by_phase": dict.fromkeys(PHASES, 0), "micro_batch_peaks": [], "repeated": False}

    def phase_ends(phase):
        if tracker is None:
            return None
        peak = tracker.total("peak")
        seen["peak_by_phase"][phase] = max(seen["peak_by_phase"][phase], peak)
        tracker.start_phase()
        return peak

    for index in range(steps):
        if tracker is not None:
            # MemTracker takes a second call of the root module for a second iteration and
            # refuses it; forgetting its per-module statistics (not its totals) allows it.
            tracker.reset_mod_stats()
        started_from = tracker.snapshot("current") if stop_at_repeat and tracker is not None else None
        loss = forward(model, batch, loss_fn, mixed_precision)
        if steps > 1:
            loss = loss / steps  # what Accelerator.backward does when accumulating
        if tracker is not None:
            # MemTracker's hooks put the model's outputs in reference cycles: an output
            # the loss does not use (BERT's pooler branch) would otherwise live until the
            # next garbage collection, when without the tracker it is freed at once.
            gc.collect()
            seen["after_forward"] = tracker.snapshot("current")
        forward_peak = phase_ends("forward")
        loss.backward()
        del loss
        if tracker is not None:
            seen["after_backward"] = tracker.snapshot("current")
        seen["micro_batch_peaks"].append((forward_peak, phase_ends("backward")))
        if index >= 1 and started_from is not None and seen["after_backward"] == started_from:
            seen["repeated"] = True
            break
    if optimizer is None:
        return seen
    with in_optimizer_step():
        optimizer.step()
    optimizer.zero_grad()
    phase_ends("optimizer step")
    if tracker is not None:
        seen["after_step"] = tracker.snapshot("current")
    return seen
