"""How far a memory-efficient optimizer's updates land from AdamW's, on exactly the same gradients (lesson 3).

Optimizers are compared fairly only when they see the same gradients from the
same weights. So the experiment has three steps:

1. :func:`record_gradients`: the gradients of the loss on a few batches, all at
   the model's current weights, recorded once;
2. :func:`replay_gradients`: the same list fed to a fresh optimizer on a copy of
   the model, step by step; it returns each parameter's total update;
3. :func:`relative_distance`: ``||updates - reference|| / ||reference||``, how
   far one optimizer's updates are from another's (0 means identical).

This measures fidelity to an update rule, not quantisation: Adafactor's
distance comes from its algorithm, 8-bit AdamW's from rounding.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence

import torch

from course_utils.validation import check_instance, check_positive_int

__all__ = ["record_gradients", "replay_gradients", "relative_distance"]


def record_gradients(model: torch.nn.Module, batches: Iterable[dict], max_batches: int | None = None) -> list[list[torch.Tensor]]:
    """Return the gradients of ``model``'s loss on each batch, all taken at the model's current weights.

    One list per batch, holding one tensor per trainable parameter in
    ``model.parameters()`` order (a copy, so later steps cannot change it).
    Batches are dicts with ``input_ids``, ``attention_mask`` and ``labels``.
    The model's weights are not changed; its gradients are cleared afterwards.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if max_batches is not None:
        check_positive_int(max_batches, "max_batches")
    parameters = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    # Dropout stays off so that the recorded gradients depend only on the batch.
    model.eval()
    gradients = []
    for index, batch in enumerate(batches):
        if max_batches is not None and index >= max_batches:
            break
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        gradients.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in parameters])
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    if not gradients:
        raise ValueError("batches is empty: there is no gradient to record")
    return gradients


def replay_gradients(
    model: torch.nn.Module, gradients: Sequence[Sequence[torch.Tensor]], optimizer_name: str, **options: object
) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """Return ``(updates, optimizer)``: replay ``gradients`` through a fresh optimizer on a copy of ``model``.

    The optimizer is the course's builder's ``optimizer_name`` with ``options``
    (``course_utils.optimizers.make_optimizer``), on the copy's trainable
    parameters. Each step sets every parameter's ``.grad`` to the recorded
    gradient and calls ``optimizer.step()``, so every optimizer sees exactly the
    same gradients. ``updates`` holds, per parameter, the total change of its
    weights (final minus initial, fp32). ``model`` itself is not changed.
    """
    from course_utils.optimizers import make_optimizer

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if not isinstance(gradients, (list, tuple)) or len(gradients) == 0:
        raise ValueError("gradients must be a non-empty list of steps, as record_gradients returns")
    replica = copy.deepcopy(model)
    parameters = [p for p in replica.parameters() if p.requires_grad]
    for step, step_gradients in enumerate(gradients):
        if not isinstance(step_gradients, (list, tuple)) or len(step_gradients) != len(parameters):
            got = f"{len(step_gradients)} tensors" if isinstance(step_gradients, (list, tuple)) else type(step_gradients).__name__
            raise ValueError(f"gradients[{step}] must be a list of {len(parameters)} tensors, one per trainable "
                             f"parameter; got {got}")
        for parameter, gradient in zip(parameters, step_gradients):
            if not isinstance(gradient, torch.Tensor) or gradient.shape != parameter.shape:
                got = tuple(gradient.shape) if isinstance(gradient, torch.Tensor) else type(gradient).__name__
                raise ValueError(f"gradients[{step}] must hold tensors shaped like the model's trainable parameters, "
                                 f"in order; got {got} where {tuple(parameter.shape)} is expected")
    initial = [p.detach().float().clone() for p in parameters]
    optimizer = make_optimizer(optimizer_name, parameters, **options)
    for step_gradients in gradients:
        for parameter, gradient in zip(parameters, step_gradients):
            parameter.grad = gradient.to(parameter.dtype).clone()
        optimizer.step()
    updates = [p.detach().float() - start for p, start in zip(parameters, initial)]
    return updates, optimizer


def relative_distance(updates: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """Return ``||updates - reference|| / ||reference||`` over all tensors together (0 means identical).

    Both are lists of tensors of matching shapes (e.g. from :func:`replay_gradients`);
    the norm is the Euclidean norm of everything concatenated.
    """
    if len(updates) != len(reference) or len(reference) == 0:
        raise ValueError(f"updates and reference must be non-empty lists of equal length, got {len(updates)} and {len(reference)}")
    difference_squared, reference_squared = 0.0, 0.0
    for index, (update, ref) in enumerate(zip(updates, reference)):
        if update.shape != ref.shape:
            raise ValueError(f"updates[{index}] has shape {tuple(update.shape)} but reference[{index}] has {tuple(ref.shape)}")
        difference_squared += (update.double() - ref.double()).square().sum().item()
        reference_squared += ref.double().square().sum().item()
    if reference_squared == 0:
        raise ValueError("reference is all zeros: a distance relative to it is undefined")
    return math.sqrt(difference_squared / reference_squared)
