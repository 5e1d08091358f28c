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

Expert parallelism over the same processes (``ep == cp``): ``apply_layout``
divides a mixture-of-experts model's experts with transformers' own expert
parallelism (two all-to-alls per experts module), on the fake copy as on the
real model, and the optimizer step is followed on the laid-out copy (each
process steps its own experts). The all-to-alls' sizes are counts of the
router's choices, values a fake tensor does not have: the planner states the
routing, balanced (:class:`BalancedRouting`), and a real run holds the plan
when its routing is balanced (the test forces it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
        """Within this block, this process is process ``rank`` of a fake group, and ``fake`` is laid out as the real run's model.

        With ``ep > 1``, each experts module's exchange is followed under the
        stated routing (:class:`BalancedRouting`).
        """
        with fake_process_group(self.layout.world_size, self.rank):
            apply_layout(fake, self.layout)
            if self.layout.ep > 1:
                for module in fake.modules():
                    if getattr(module, "_is_expert_parallel", False):  # transformers' mark on divided experts
                        module.forward = balanced_forward(module.forward, self.layout.ep)
            yield

    def batch_of(self, batch: dict) -> dict:
        """Return this process's part of the whole ``batch`` (``layouts.context_batch``)."""
        return context_batch(batch, self.layout, self.rank)


def context_process(model: torch.nn.Module, layout: Layout, rank: int, mixed_precision: str = "no") -> ContextProcess:
    """Return process ``rank`` of ``layout`` for the planner, or refuse a model it cannot split by sequence.

    The ring attention is causal, and the batch split is a causal language
    model's (its labels shifted on the whole sequence): other heads are
    refused, and so is autocast, which the ring refuses too
    (``ring_attention.ring_attention_forward``); with ``ep > 1``, a model with
    no expert-parallel plan.
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
    if layout.ep > 1 and not getattr(getattr(model, "config", None), "base_model_ep_plan", None):
        raise PlannerRefused(
            f"model: expert parallelism (ep={layout.ep}) divides a transformers mixture-of-experts model's experts "
            f"(its config's base_model_ep_plan), and {type(model).__name__} has none"
        )
    return ContextProcess(layout, rank)


class BalancedRouting(TorchDispatchMode):
    """Answer the experts' one value read, how many (token, expert) pairs go to and come from each process: ``pairs`` each.

    Under expert parallelism (transformers' ``AllToAllEP``) the sizes of the
    two all-to-alls are counts of the router's choices: values, which fake
    tensors do not have. The planner states a routing instead, balanced: each
    process sends an equal share of its pairs to every process and receives
    as many. (A real run holds what the plan says when its router routes so;
    ``tests/memory/test_planner_context_parallel.py`` forces it.) Nothing else
    in the layer reads a value: the experts' shapes follow from these sizes.
    """

    def __init__(self, pairs: int) -> None:
        super().__init__()
        self.pairs = pairs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            return self.pairs
        return func(*args, **(kwargs or {}))


def balanced_forward(forward, ep: int):
    """Return the experts module's ``forward`` followed under :class:`BalancedRouting` of its (token, expert) pairs over ``ep`` processes."""

    def balanced(hidden_states, top_k_index, top_k_weights):
        pairs = top_k_index.numel()
        if pairs % ep:
            raise PlannerRefused(f"layout: a balanced routing splits the {pairs} (token, expert) pairs of a process "
                                 f"evenly over ep={ep} processes; choose a batch whose tokens x top_k divides")
        with BalancedRouting(pairs // ep):
            return forward(hidden_states, top_k_index, top_k_weights)

    return balanced
