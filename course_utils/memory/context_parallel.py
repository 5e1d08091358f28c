"""The planner under context parallelism: one process's step, its part of every sequence attending by a ring (lesson 9).

Under a :class:`course_utils.layouts.Layout` with ``cp > 1`` every process
holds the whole model (its weights, gradients and optimizer state are one
process's) and runs the forward and backward passes on its own ``seq/cp``
tokens of each sequence, attention going round the ring of processes
(``course_utils.ring_attention``, sends and receives). So the planner follows
one process's step (``fake_step``'s passes and optimizer step, probed and
extrapolated as for one process) with two differences, both made by the
functions the real runs call: the fake copy is laid out by
``layouts.apply_layout`` inside a fake process group of ``world_size``
processes, as process ``rank`` (ring attention put in through transformers'
attention registry; each gradient averaged in place as it is accumulated),
and the batch is the process's part of it (``layouts.context_batch``).

The ring's messages are followed as the real run makes them: torch's fake
process group (``torch.testing._internal.distributed.fake_pg``, torch 2.13)
answers ``isend``/``irecv`` at once without sending anything, and the buffer
each receive fills is allocated by the ring itself (``torch.empty_like``),
on fake tensors here as on real ones there. What gloo allocates on its own
threads is seen by neither tracker. Checked to the byte against a real
two-process gloo run in ``tests/memory/test_planner_context_parallel.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from course_utils.layouts import Layout, apply_layout, context_batch
from course_utils.memory.fake_tensors import fake_process_group
from course_utils.memory.plan_cache import PlannerRefused
from course_utils.memory.training_memory import head_kind
from course_utils.validation import check_instance, check_int_in_range


@dataclass(frozen=True)
class ContextProcess:
    """Process ``rank`` of a context-parallel ``layout``, as ``fake_step.passes`` follows it (hashable: part of its cache key)."""

    layout: Layout
    rank: int

    def __post_init__(self) -> None:
        check_instance(self.layout, "layout", Layout, "a Layout")
        check_int_in_range(self.rank, "rank", 0, self.layout.world_size - 1)
        if self.layout.cp < 2:
            raise ValueError(f"layout must be context parallel (cp >= 2), got cp={self.layout.cp}")

    @contextlib.contextmanager
    def laid_out(self, fake: torch.nn.Module):
        """Within this block, this process is process ``rank`` of a fake group, and ``fake`` is laid out as the real run's model."""
        with fake_process_group(self.layout.world_size, self.rank):
            apply_layout(fake, self.layout)
            yield

    def batch_of(self, batch: dict) -> dict:
        """Return this process's part of the whole ``batch`` (``layouts.context_batch``)."""
        return context_batch(batch, self.layout, self.rank)


def context_process(model: torch.nn.Module, layout: Layout, rank: int, mixed_precision: str = "no") -> ContextProcess:
    """Return process ``rank`` of ``layout`` for the planner, or refuse a model it cannot split by sequence.

    The ring attention is causal, and the batch split is a causal language
    model's (its labels shifted on the whole sequence): other heads are
    refused, and so is autocast, which the ring refuses too
    (``ring_attention.ring_attention_forward``).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if mixed_precision != "no":
        raise PlannerRefused(
            f"mixed_precision={mixed_precision!r}: the course's ring attention (context parallelism) runs in its "
            f"inputs' dtype, not under autocast; plan fp32 (mixed_precision='no'), or a model built in bf16"
        )
    # Attention modules of transformers say whether they are causal (a masked LM's are not).
    causal = [module.is_causal for module in model.modules() if isinstance(getattr(module, "is_causal", None), bool)]
    if head_kind(model) != "language model" or not causal or not all(causal):
        raise PlannerRefused(
            f"model: context parallelism here splits a causal language model's sequences (its attention by a causal "
            f"ring), and {type(model).__name__} is not one"
        )
    return ContextProcess(layout, rank)
