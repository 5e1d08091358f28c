"""Tensor parallelism: one layer's matrices split over processes, the all-reduce made visible (lesson 9).

A transformer block's MLP is ``down(gelu(up(x)))``. Split ``up``'s output
features (the rows of its ``weight``, Megatron-LM's "column" split of
``Y = X A``) over N processes, and each process computes ``hidden / N`` of the
hidden units from the whole input; split ``down``'s input features (the columns
of its ``weight``, the "row" split) the same way, and each process turns its own
hidden units into a *partial* output. The N partial outputs sum to the output:
one all-reduce, and no communication between ``up`` and ``down``. Attention
splits the same way, by heads: ``q``, ``k``, ``v`` by columns, ``out`` by rows.

In the backward pass the roles swap (Megatron-LM's operators *f* and *g*,
:func:`copy_to_tensor_parallel` and :func:`reduce_from_tensor_parallel`): the
gradient of the whole input is the sum of every process's part, another
all-reduce. So a block costs two all-reduces forward and two backward, each of
the whole activation ``batch x sequence x dim``: why tensor parallelism stays
on the fast links inside a node.

This module holds the small pre-norm :class:`Block` the lesson splits, the
split written from scratch (:func:`tensor_parallel_block`), and the plans
DTensor's ``parallelize_module`` takes for the same block (:func:`block_plan`)
and for the course's DistilBERT (:func:`distilbert_plan`, in ``layouts``,
which applies both: the lesson's runs lay a model out as the planner does).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.layouts import Layout, apply_layout, distilbert_plan
from course_utils.validation import check_instance, check_int_in_range, check_positive_int

__all__ = [
    "Attention",
    "Block",
    "CopyToTensorParallel",
    "MLP",
    "RUNS",
    "ReduceFromTensorParallel",
    "SplitRun",
    "TensorParallel",
    "block_plan",
    "copy_to_tensor_parallel",
    "distilbert_plan",
    "reduce_from_tensor_parallel",
    "run_split",
    "split_columns",
    "split_rows",
    "tensor_parallel_block",
    "tiny_block",
]


# --------------------------------------------------------------------------- the block, on one process


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Attention(nn.Module):
    """Multi-head self-attention; the number of heads is read from the shapes, so a split keeps working."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = (proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(mixed.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    """A pre-norm transformer block, as in GPT-2 and Llama: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 256):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = Attention(dim, heads), MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def tiny_block(dim: int = 64, heads: int = 4, hidden: int = 256, seed: int = 0) -> Block:
    """Return a :class:`Block` with weights drawn from ``seed``: the same block in every process."""
    check_positive_int(dim, "dim")
    check_positive_int(heads, "heads")
    check_positive_int(hidden, "hidden")
    if dim % heads:
        raise ValueError(f"heads must divide dim: dim={dim}, heads={heads}")
    torch.manual_seed(seed)
    return Block(dim, heads, hidden)


# --------------------------------------------------------------------------- the split, from scratch


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron-LM's *f*: the input goes to every process as it is; its gradient is the sum of theirs."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.clone()
        dist.all_reduce(grad)  # each process's columns contributed part of the input's gradient
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron-LM's *g*: the partial outputs are summed; the gradient goes back to every process as it is."""

    @staticmethod
    def forward(ctx, partial):
        import torch.distributed as dist

        total = partial.clone()
        dist.all_reduce(total)  # the row split leaves each process a partial sum of the output
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def copy_to_tensor_parallel(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` unchanged; in the backward pass, all-reduce its gradient over the processes."""
    check_instance(x, "x", torch.Tensor, "a torch.Tensor (a block's input)")
    return CopyToTensorParallel.apply(x)


def reduce_from_tensor_parallel(partial: torch.Tensor) -> torch.Tensor:
    """Return the sum over the processes of ``partial`` (an all-reduce); its gradient passes back unchanged."""
    check_instance(partial, "partial", torch.Tensor, "a torch.Tensor (this process's partial output)")
    return ReduceFromTensorParallel.apply(partial)


def _check_split(linear, rank, world_size, features):
    check_instance(linear, "linear", nn.Linear, "a torch.nn.Linear")
    size, what = getattr(linear, features), features.replace("_", " ")
    check_positive_int(world_size, "world_size")
    check_int_in_range(rank, "rank", 0, world_size - 1)
    if size % world_size:
        raise ValueError(f"world_size: the linear's {size} {what} do not divide over {world_size} processes")


def split_columns(linear: nn.Linear, rank: int, world_size: int) -> nn.Linear:
    """Return process ``rank``'s part of ``linear`` split by output features (rows of ``weight``, with their biases)."""
    _check_split(linear, rank, world_size, "out_features")
    rows = linear.out_features // world_size
    part = nn.Linear(linear.in_features, rows, bias=linear.bias is not None)
    with torch.no_grad():
        part.weight.copy_(linear.weight[rank * rows:(rank + 1) * rows])
        if linear.bias is not None:
            part.bias.copy_(linear.bias[rank * rows:(rank + 1) * rows])
    return part


def split_rows(linear: nn.Linear, rank: int, world_size: int) -> nn.Linear:
    """Return process ``rank``'s part of ``linear`` split by input features (columns of ``weight``), without bias.

    Its outputs are partial sums; the bias is added once, after they are summed (:class:`TensorParallel`).
    """
    _check_split(linear, rank, world_size, "in_features")
    columns = linear.in_features // world_size
    part = nn.Linear(columns, linear.out_features, bias=False)
    with torch.no_grad():
        part.weight.copy_(linear.weight[:, rank * columns:(rank + 1) * columns])
    return part


class TensorParallel(nn.Module):
    """One half of a block split over the processes: *f*, this process's columns then rows, *g*, then the bias."""

    def __init__(self, local: nn.Module, bias: torch.Tensor | None):
        super().__init__()
        self.local = local
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def forward(self, x):
        out = reduce_from_tensor_parallel(self.local(copy_to_tensor_parallel(x)))
        return out if self.bias is None else out + self.bias


def tensor_parallel_block(block: Block, rank: int, world_size: int) -> Block:
    """Return a copy of ``block`` holding process ``rank``'s share: its heads of attention, its hidden units of the MLP.

    The norms stay whole in every process (sequence parallelism divides their work).
    """
    check_instance(block, "block", Block, "a tensor_parallel.Block")
    check_positive_int(world_size, "world_size")
    check_int_in_range(rank, "rank", 0, world_size - 1)
    heads = block.attn.q.out_features // block.attn.head_dim
    if heads % world_size:
        raise ValueError(f"world_size: the block's {heads} heads do not divide over {world_size} processes")
    mine = copy.deepcopy(block)
    attn, mlp = block.attn, block.mlp
    local_attn = copy.deepcopy(attn)
    local_attn.q, local_attn.k, local_attn.v = (split_columns(p, rank, world_size) for p in (attn.q, attn.k, attn.v))
    local_attn.out = split_rows(attn.out, rank, world_size)
    local_mlp = copy.deepcopy(mlp)
    local_mlp.up, local_mlp.down = split_columns(mlp.up, rank, world_size), split_rows(mlp.down, rank, world_size)
    mine.attn = TensorParallel(local_attn, attn.out.bias)
    mine.mlp = TensorParallel(local_mlp, mlp.down.bias)
    return mine


# --------------------------------------------------------------------------- the same split, by DTensor


def block_plan(sequence_parallel: bool = False) -> dict:
    """Return the ``parallelize_module`` plan of a :class:`Block`: heads and hidden units split, as written above.

    With ``sequence_parallel=True`` the norms and the residual stream are split
    along the sequence too (``SequenceParallel``): each row-split layer
    reduce-scatters its partial outputs to this process's tokens instead of
    all-reducing them, and each column-split half all-gathers the tokens first.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    )

    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "mlp.up": ColwiseParallel()}
    if not sequence_parallel:
        return {**plan, "attn.out": RowwiseParallel(), "mlp.down": RowwiseParallel()}
    gather_tokens = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        **plan,
        "norm1": SequenceParallel(), "norm2": SequenceParallel(),
        "attn": gather_tokens, "mlp": copy.deepcopy(gather_tokens),  # the all-gathers
        "attn.out": RowwiseParallel(output_layouts=Shard(1)), "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }


# --------------------------------------------------------------------------- run on launched processes, checked against one

RUNS = ("from scratch", "parallelize_module", "sequence parallel", "distilbert")
"""What :func:`run_split` runs: the block split by hand, by DTensor, by DTensor with sequence parallelism, and the
course's DistilBERT split by DTensor."""


@dataclass(frozen=True)
class SplitRun:
    """One process of a split run, measured in that process, beside the same step on one process. Bytes.

    - ``run``, ``rank``, ``world_size``;
    - ``forward_gap``: the largest difference between this process's output and one process's (its own tokens
      under sequence parallelism);
    - ``gradient_gap``: the largest difference between the gradients this process holds and the same part of one
      process's gradients;
    - ``held``, ``one_process``: {"weights", "gradients", "optimizer_state", "activations"} of this process and of
      the one-process step (AdamW's state after one step; activations: what the forward pass saved);
    - ``forward_collectives``, ``backward_collectives``: {kind: number of calls} in each pass;
    - ``forward_payload``: {kind: bytes handed in} in the forward pass;
    - ``activation_shape``: (batch, sequence, dim) of the block's input.
    """

    run: str
    rank: int
    world_size: int
    forward_gap: float
    gradient_gap: float
    held: dict
    one_process: dict
    forward_collectives: dict
    backward_collectives: dict
    forward_payload: dict
    activation_shape: tuple


def _step(model, inputs, loss_of):
    """Forward (its saved activations counted), backward, one AdamW step; return (output, bytes held, the logs)."""
    from course_utils.collectives import CollectiveLog
    from course_utils.saved_activations import ActivationMeter
    from course_utils.sharding import held_bytes

    with CollectiveLog() as forward_log, ActivationMeter(model) as meter:
        output = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    with CollectiveLog() as backward_log:
        loss_of(output).backward()
    gradients = [p.grad for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    held = {"weights": held_bytes(model.parameters()), "gradients": held_bytes(gradients),
            "optimizer_state": held_bytes(states), "activations": meter.saved}
    return output, gradients, held, forward_log, backward_log


def _largest_gap(pairs) -> float:
    return max(float((a.detach() - b.detach()).abs().max()) for a, b in pairs)


def _full(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def run_split(runs=RUNS, batch: int = 4, seq: int = 32, seed: int = 0) -> dict[str, SplitRun]:
    """In each launched process: for each of ``runs`` (:data:`RUNS`), split the model so, run one step, compare with
    one process. Returns {run: :class:`SplitRun`}."""
    from course_utils.validation import check_choice, check_in_launch

    if isinstance(runs, str) or not isinstance(runs, (list, tuple)) or not runs:
        raise ValueError(f"runs must be a non-empty list of names among {RUNS}, got {runs!r}")
    for run in runs:
        check_choice(run, "runs", RUNS)
    check_positive_int(batch, "batch")
    check_positive_int(seq, "seq")
    check_in_launch("run_split")
    import torch.distributed as dist

    from course_utils.sharding import gloo_group

    with gloo_group():
        rank, world = dist.get_rank(), dist.get_world_size()
        return {run: _run_distilbert(rank, world, batch, seq) if run == "distilbert"
                else _run_block(run, rank, world, batch, seq, seed) for run in runs}


def _run_block(run, rank, world, batch, seq, seed) -> SplitRun:
    block = tiny_block(seed=seed)
    torch.manual_seed(seed + 1)
    x, target = torch.randn(batch, seq, block.norm1.normalized_shape[0]), torch.randn(batch, seq, 64)
    reference = copy.deepcopy(block)
    ref_out, ref_grads, ref_held, _, _ = _step(reference, x, lambda out: (out * target).sum())
    if run == "from scratch":
        split = tensor_parallel_block(block, rank, world)
        out, grads, held, f_log, b_log = _step(split, x, lambda out: (out * target).sum())
        gradient_block = copy.deepcopy(block)  # one process's gradients, split as the weights were
        for parameter, gradient in zip(gradient_block.parameters(), ref_grads):
            parameter.data = gradient
        expected = [p.data for p in tensor_parallel_block(gradient_block, rank, world).parameters()]
        forward_gap, gradient_gap = _largest_gap([(out, ref_out)]), _largest_gap(zip(grads, expected))
    else:
        sequence = run == "sequence parallel"
        apply_layout(block, Layout("none", world, tp=world, sequence_parallel=sequence),
                     plan=block_plan(sequence_parallel=sequence))
        tokens = slice(rank * seq // world, (rank + 1) * seq // world) if sequence else slice(None)
        mine = x[:, tokens].contiguous()
        out, grads, held, f_log, b_log = _step(block, mine, lambda out: (out * target[:, tokens]).sum())
        forward_gap = _largest_gap([(out, ref_out[:, tokens])])
        gradient_gap = _largest_gap((_full(g), r) for g, r in zip(grads, ref_grads))
    return SplitRun(run, rank, world, forward_gap, gradient_gap, held, ref_held, f_log.counts(), b_log.counts(),
                    f_log.payload(), tuple(x.shape))


def _run_distilbert(rank, world, batch, seq) -> SplitRun:
    from course_utils import sharding

    model = sharding.fresh_course_model()
    reference = copy.deepcopy(model)
    inputs = {name: value[:, :seq] if value.dim() == 2 else value
              for name, value in sharding.course_batches(1, batch)[0].items()}
    ref_out, ref_grads, ref_held, _, _ = _step(reference, inputs, lambda out: out.loss)
    apply_layout(model, Layout("none", world, tp=world))  # the course's DistilBERT plan (layouts.distilbert_plan)
    out, grads, held, f_log, b_log = _step(model, inputs, lambda out: out.loss)
    dim = model.config.dim
    return SplitRun("distilbert", rank, world, _largest_gap([(out.logits, ref_out.logits)]),
                    _largest_gap((_full(g), r) for g, r in zip(grads, ref_grads)), held, ref_held,
                    f_log.counts(), b_log.counts(), f_log.payload(), (*inputs["input_ids"].shape, dim))
