"""What the planner remembers and what stops it: its one cache, the fingerprint of a model its keys hold, its refusal.

:data:`cache` holds whole estimates (``planner``), the passes and optimizer
steps of ``fake_step``, the per-process steps of ``per_process`` and the
timelines of ``step_timeline``, each keyed by a tuple whose first item says
which, then the model's :class:`Fingerprint` (taken once per estimate:
:func:`model_fingerprint`) and the set-up's choices it depends on.
:class:`PlannerRefused` is how every part of the planner says it cannot
follow a step, naming what and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from course_utils.memory.qlora import quant_state_tensors

cache: dict[tuple, object] = {}


class PlannerRefused(ValueError):
    """The planner cannot follow this step; the message names what and why."""


@dataclass(frozen=True)
class Fingerprint:
    """What of a model decides a fake run's bytes, as two strings: equal exactly when two models run the same.

    ``parameters``: the model's class, its parameters and buffers (names,
    shapes, dtypes, requires_grad) and its 4-bit weights' quantisation states
    (shapes, dtypes), all the optimizer step sees. ``passes``:
    that, its config, every module's class and checkpointing flag and the
    attention kernel, what the forward and backward passes run.
    """

    parameters: str
    passes: str


def model_fingerprint(model: torch.nn.Module) -> Fingerprint:
    """Return the :class:`Fingerprint` of ``model``; the planner takes it once per estimate."""
    tensors = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    tensors += [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    # Two 4-bit bases with the same packed weights can differ in their quantisation states (double quantisation).
    tensors += [(tuple(t.shape), str(t.dtype)) for t in quant_state_tensors(model)]
    parameters = [type(model).__name__, repr(tensors)]
    try:
        config = model.config.to_json_string(use_diff=False)
    except (TypeError, ValueError):
        config = repr(model.config)
    modules = [(n, type(m).__name__, bool(getattr(m, "gradient_checkpointing", False)))
               for n, m in model.named_modules()]
    # The attention kernel ("eager", "sdpa") changes what the passes keep, and
    # to_json_string leaves it out: an eager model would get an sdpa model's plan.
    attention = getattr(model.config, "_attn_implementation", None)
    return Fingerprint(json.dumps(parameters), json.dumps([*parameters, config, repr(modules), attention], default=str))
