"""Context parallelism: attention over a sequence split across processes, by a ring of sends and receives (lesson 9).

A long sequence is cut into N contiguous chunks, one per process: each process
holds the queries, keys and values of its own tokens only. Attention needs every
query to meet every key, so the key/value chunks travel round a ring: at each
of N steps a process attends its queries to the chunk it holds, hands that chunk
to the next process and receives one from the previous. No process ever holds
the whole sequence's keys, or a score matrix bigger than chunk x chunk.

Each step gives a softmax over *some* keys; they merge exactly because a
softmax over all keys is the partial ones reweighted by their log-sum-exp
(:func:`merge_partial`, the "online softmax" of FlashAttention). With a causal
mask, the mask is a rule on *global* positions (:func:`causal_mask`): the chunk
from an earlier process is wholly visible, one's own chunk is lower-triangular,
a later process's chunk is wholly hidden and skipped (so the first process
computes one block and the last N: causal ring attention is unbalanced).

- :func:`attention`: full attention in one process, the reference;
- :func:`block_attention`: one query chunk on one key/value chunk, with its log-sum-exp;
- :func:`merge_partial`, :func:`causal_mask`: the two pieces the ring relies on;
- :func:`ring_attention`: the ring itself, forward and backward (the backward
  sends the key/value chunks round again, with their gradients travelling beside them);
- :func:`ring_attention_forward`, :func:`use_ring_attention`: the ring as a
  transformers attention implementation (registered in transformers'
  ``AttentionInterface`` as :data:`RING_ATTENTION`), how ``layouts.apply_layout``
  gives a model context parallelism;
- :func:`attention_memory`: the bytes one process keeps for the backward pass and its allocator peak;
- :func:`context_parallel_run`: what each launched process of the lesson runs.

torch's own ``torch.distributed.tensor.experimental.context_parallel`` does the
same on GPUs; on CPU (torch 2.13) it fails: no sharding strategy for the CPU
flash-attention kernel.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from course_utils.validation import (
    check_bool, check_in_launch, check_instance, check_non_negative_int, check_positive_int,
)

__all__ = [
    "RING_ATTENTION",
    "ContextParallelRun",
    "RingAttention",
    "attention",
    "attention_memory",
    "block_attention",
    "causal_mask",
    "context_parallel_run",
    "merge_partial",
    "random_qkv",
    "ring_attention",
    "ring_attention_forward",
    "sequence_chunk",
    "use_ring_attention",
]

RING_ATTENTION = "course_ring_attention"
"""The name :func:`ring_attention_forward` is registered under in transformers' ``AttentionInterface``."""


# --------------------------------------------------------------------------- the pieces


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Return softmax(q k^T / sqrt(d)) v over the whole sequence, in one process (the reference).

    Written out as the math kernel runs it: autograd keeps the seq x seq
    probabilities for the backward pass, the memory that grows as the square
    of the sequence. Shapes: (..., seq, d) in, (..., seq, d) out.
    """
    _check_qkv(q, k, v)
    check_bool(causal, "causal")
    positions = torch.arange(q.shape[-2])
    mask = causal_mask(positions, positions) if causal else None
    return block_attention(q, k, v, mask)[0]


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out, lse): attention of the queries ``q`` on these keys ``k`` and values ``v`` only.

    ``out`` is normalised over these keys (a softmax of its own); ``lse`` is the
    log-sum-exp of each query's scores, shape ``q.shape[:-1]``: what it takes to
    reweight ``out`` when more keys come (:func:`merge_partial`). ``mask``
    (query x key, True where a query may see a key) hides the other keys.
    """
    _check_block(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def merge_partial(out_a: torch.Tensor, lse_a: torch.Tensor,
                  out_b: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out, lse) of attention over the keys of both parts, from each part's (out, lse).

    A part's softmax divided its exponentials by its own sum, exp(lse); over
    both parts the sum is exp(lse_a) + exp(lse_b), so each part is reweighted
    by its share of it, exp(lse_part - lse). Computed with ``logaddexp``, never
    exp(lse) itself, which overflows once scores are large.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
    return out, lse


def causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """Return the (query x key) mask that lets each query see the keys at its own position and before.

    Positions are global (where the tokens sit in the whole sequence), so the
    same rule masks every block of the ring, not only the diagonal one.
    """
    return key_positions[None, :] <= query_positions[:, None]


def sequence_chunk(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Return process ``rank``'s contiguous chunk of ``tensor``'s sequence dimension (dim -2), of ``world_size`` equal chunks."""
    check_instance(tensor, "tensor", torch.Tensor, "a torch.Tensor shaped (..., seq, d)")
    check_positive_int(world_size, "world_size")
    if tensor.dim() < 2 or tensor.shape[-2] % world_size:
        raise ValueError(f"tensor must have a sequence dimension (dim -2) divisible by world_size={world_size}, "
                         f"got shape {tuple(tensor.shape)}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank must be an int from 0 to {world_size - 1}, got {rank!r}")
    return tensor.chunk(world_size, dim=-2)[rank]


# --------------------------------------------------------------------------- the ring


def _group():
    """Return (rank, world size) of this process's group; (0, 1) when it is in none (the ring of one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _pass_on(tensor: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Send ``tensor`` to the next process of the ring and return the one the previous process sent."""
    import torch.distributed as dist

    received = torch.empty_like(tensor)
    # Both posted before either is waited on: with a blocking send first, every process would wait for a
    # receiver that is itself still sending.
    requests = [dist.isend(tensor, (rank + 1) % world), dist.irecv(received, (rank - 1) % world)]
    for request in requests:
        request.wait()
    return received


def _step_mask(mask, causal: bool, rank: int, source: int, chunk: int):
    """Return (whether any of this process's queries sees a key of ``source``'s chunk, the mask for it or None)."""
    if not causal:
        return True, None
    if mask is causal_mask and source > rank:
        # A later process's chunk, wholly hidden by the causal rule: decided from the ranks, without a tensor
        # (so also on fake tensors, which have no values to read: the planner follows this ring).
        return False, None
    block = mask(torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(source * chunk, (source + 1) * chunk))
    return mask is causal_mask or bool(block.any()), block


class RingAttention(torch.autograd.Function):
    """Ring attention with its own backward pass: only this process's chunk is kept for it."""

    @staticmethod
    def forward(ctx, q, k, v, causal, merge, mask, trace):
        rank, world = _group()
        chunk = q.shape[-2]
        out = lse = None
        kv = torch.stack([k, v])  # one message per step instead of two
        for step in range(world):
            source = (rank - step) % world  # whose chunk this process holds at this step
            visible, block_mask = _step_mask(mask, causal, rank, source, chunk)
            if visible:  # a wholly hidden block costs nothing
                part = block_attention(q, kv[0], kv[1], block_mask)
                out, lse = part if out is None else merge(out, lse, *part)
            if trace is not None:
                trace.append((step, source, visible))
            if step < world - 1:
                kv = _pass_on(kv, rank, world)
        if out is None:
            raise ValueError(f"mask hides every key from the queries of process {rank}: each query must see one key")
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.mask = causal, mask
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = _group()
        chunk, scale = q.shape[-2], q.shape[-1] ** -0.5
        # The softmax's backward needs, per query, the sum over its keys of p * dp = (grad_out * out).sum(-1).
        delta = (grad_out * out).sum(-1, keepdim=True)
        grad_q = torch.zeros_like(q)
        # Keys, values and their gradients travel together: each process adds its queries' share to the
        # gradients of the chunk it holds; after N passes every chunk is home with all N shares.
        travelling = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(world):
            visible, block_mask = _step_mask(ctx.mask, ctx.causal, rank, (rank - step) % world, chunk)
            if visible:
                k_s, v_s = travelling[0], travelling[1]
                scores = q @ k_s.transpose(-2, -1) * scale
                if block_mask is not None:
                    scores = scores.masked_fill(~block_mask, float("-inf"))
                p = torch.exp(scores - lse[..., None])  # recomputed from the saved lse: no seq x seq tensor kept
                travelling[3] += p.transpose(-2, -1) @ grad_out
                grad_scores = p * (grad_out @ v_s.transpose(-2, -1) - delta)
                grad_q += grad_scores @ k_s * scale
                travelling[2] += grad_scores.transpose(-2, -1) @ q * scale
            if world > 1:
                # The last pass only brings the gradients home: the keys and values are not needed there.
                travelling = _pass_on(travelling if step < world - 1 else travelling[2:], rank, world)
        grad_k, grad_v = travelling[-2], travelling[-1]
        return grad_q, grad_k, grad_v, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   merge=merge_partial, mask=causal_mask, trace: list | None = None) -> torch.Tensor:
    """Return this process's chunk of the attention output, computed by a ring over the processes of its group.

    ``q``, ``k``, ``v``: this process's contiguous chunk of the sequence
    (:func:`sequence_chunk`), shaped (..., chunk, d), the same chunk size on
    every process. Every process of the group must call it (it sends and
    receives); outside a process group it is the ring of one process.
    Differentiable: its backward pass sends the chunks round the ring again.
    ``merge`` and ``mask`` are the pieces the ring uses (:func:`merge_partial`,
    :func:`causal_mask`; lesson 9's exercises put a learner's in their place);
    ``trace``, if a list, gets one ``(step, source rank, computed)`` per step of the forward pass.
    """
    _check_qkv(q, k, v)
    check_bool(causal, "causal")
    if not callable(merge) or not callable(mask):
        raise TypeError("merge and mask must be functions, as merge_partial and causal_mask")
    if trace is not None:
        check_instance(trace, "trace", list, "a list (or None)")
    return RingAttention.apply(q, k, v, causal, merge, mask, trace)


# --------------------------------------------------------------------------- in a transformers model


def ring_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           **kwargs: object) -> tuple[torch.Tensor, None]:
    """Return (this process's attention output, no weights): :func:`ring_attention` as a transformers attention implementation.

    transformers 5.24 calls it as it calls its own (``modeling_llama.eager_attention_forward``):
    ``query`` (batch, heads, chunk, head_dim), ``key`` and ``value`` with
    ``heads / key_value_heads`` fewer heads (grouped-query attention: each is
    repeated to every query head, as the eager kernel does); the output
    (batch, chunk, heads, head_dim). Causal, on the positions of the whole
    sequence (this process's chunk is the ``rank``-th); no padding mask, no
    dropout, the scale 1/sqrt(head_dim), no autocast: anything else is refused.
    """
    if not getattr(module, "is_causal", False):
        raise ValueError(f"module: ring attention is causal, and {type(module).__name__} is not (is_causal)")
    if attention_mask is not None:
        raise ValueError("attention_mask must be None under ring attention (unpadded sequences; the ring masks by "
                         "position)")
    if dropout:
        raise ValueError(f"dropout must be 0 under ring attention, got {dropout}")
    if torch.is_autocast_enabled("cpu"):
        # Its backward pass is written out (RingAttention.backward) in the inputs' one dtype: under autocast
        # the forward pass would mix bf16 scores with fp32 log-sum-exps, and the backward pass fail on them.
        raise ValueError("mixed_precision: ring attention runs in its inputs' dtype, not under autocast; "
                         "train in fp32 or build the model in bf16")
    if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-12:
        raise ValueError(f"scaling must be 1/sqrt(head_dim) = {query.shape[-1] ** -0.5} under ring attention, got {scaling}")
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return ring_attention(query, key, value, causal=True).transpose(1, 2).contiguous(), None


def use_ring_attention(model: torch.nn.Module) -> None:
    """Make ``model`` (a transformers model) attend by :func:`ring_attention_forward`, through transformers' registry.

    Registered once in ``transformers.AttentionInterface`` as :data:`RING_ATTENTION`,
    then set with the model's own ``set_attn_implementation``. transformers
    builds no mask for an implementation it does not know (the ring masks by position).
    """
    from transformers import AttentionInterface, PreTrainedModel

    check_instance(model, "model", PreTrainedModel, "a transformers model (PreTrainedModel)")
    if not model._can_set_attn_implementation():
        raise ValueError(f"model: {type(model).__name__} does not take its attention from transformers' "
                         f"AttentionInterface, so ring attention cannot be put into it")
    AttentionInterface.register(RING_ATTENTION, ring_attention_forward)
    model.set_attn_implementation(RING_ATTENTION)


# --------------------------------------------------------------------------- memory and the lesson's run


def attention_memory(function, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    """Return (bytes kept for the backward pass, allocator peak rise in bytes) of ``function(q, k, v)``'s forward and backward.

    The first: every storage autograd saved during the forward pass, each once
    (:class:`course_utils.saved_activations.ActivationMeter`), q, k and v
    included when it keeps them. The second: the CPU allocator's largest rise
    over the forward and backward pass (torch's profiler, every thread).
    """
    from course_utils.memory import recording_allocator
    from course_utils.saved_activations import ActivationMeter

    _check_qkv(q, k, v)
    if not callable(function):
        raise TypeError(f"function must be callable, as attention or ring_attention, got {type(function).__name__}")
    with recording_allocator() as record:
        with ActivationMeter() as meter:
            out = function(q, k, v)
        out.sum().backward()
        del out
    return meter.saved, record.rise


@dataclass(frozen=True)
class ContextParallelRun:
    """What one process of :func:`context_parallel_run` saw. Sizes in bytes.

    - ``rank``, ``world_size``;
    - ``output_errors``, ``gradient_errors``: per (seed, causal) case, the largest
      absolute difference of this process's output chunk and of its q, k, v
      gradient chunks from full attention's in one process;
    - ``steps``: the forward pass's trace, ``(step, source rank, computed)`` per step (causal, first seed);
    - ``seq_lens``, ``kept``, ``peaks``: per whole-sequence length, the bytes
      this process kept for the backward pass and its allocator peak rise, under ring attention.
    """

    rank: int
    world_size: int
    output_errors: dict = field(default_factory=dict)
    gradient_errors: dict = field(default_factory=dict)
    steps: tuple = ()
    seq_lens: tuple = ()
    kept: tuple = ()
    peaks: tuple = ()


def random_qkv(seed: int, seq_len: int, heads: int = 2, head_dim: int = 32) -> tuple[torch.Tensor, ...]:
    """Return (q, k, v) for a whole sequence, (heads, seq_len, head_dim) fp32, drawn from ``seed``: the same in every process."""
    check_non_negative_int(seed, "seed")
    for value, name in ((seq_len, "seq_len"), (heads, "heads"), (head_dim, "head_dim")):
        check_positive_int(value, name)
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(heads, seq_len, head_dim, generator=generator) for _ in range(3))


def _compare_with_full(seed: int, seq_len: int, causal: bool, rank: int, world: int, merge, mask, trace=None):
    """Return (output error, gradient error) of this process's ring chunk against full attention on the whole sequence."""
    q, k, v = (t.requires_grad_() for t in random_qkv(seed, seq_len))
    reference = attention(q, k, v, causal)
    weights = torch.randn(reference.shape, generator=torch.Generator().manual_seed(seed + 1))
    (reference * weights).sum().backward()  # a loss whose gradient differs per element, not just a sum
    chunks = [sequence_chunk(t.detach(), rank, world).clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*chunks, causal=causal, merge=merge, mask=mask, trace=trace)
    (out * sequence_chunk(weights, rank, world)).sum().backward()
    output_error = (out.detach() - sequence_chunk(reference.detach(), rank, world)).abs().max().item()
    gradient_error = max((mine.grad - sequence_chunk(full.grad, rank, world)).abs().max().item()
                         for mine, full in zip(chunks, (q, k, v)))
    return output_error, gradient_error


def context_parallel_run(seeds=(0, 1, 2), seq_len: int = 256, memory_seq_lens=(), merge=merge_partial,
                         mask=causal_mask) -> ContextParallelRun:
    """What each launched process of lesson 9's context parallelism runs; returns its :class:`ContextParallelRun`.

    For each seed, causal and not: ring attention on this process's chunk of a
    ``seq_len`` sequence, compared with full attention, forward and gradients.
    Then, for each of ``memory_seq_lens``, the bytes this process keeps for the
    backward pass and its allocator peak under ring attention.
    """
    from course_utils.sharding import gloo_group

    check_in_launch("context_parallel_run")
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ValueError(f"seeds must be a non-empty list of seeds (ints from 0), got {seeds!r}")
    for seed in seeds:
        check_non_negative_int(seed, "seeds[i]")
    check_positive_int(seq_len, "seq_len")
    if not isinstance(memory_seq_lens, (list, tuple)) or not all(isinstance(n, int) and n > 0 for n in memory_seq_lens):
        raise ValueError(f"memory_seq_lens must be a list of positive ints, got {memory_seq_lens!r}")
    import os

    world = int(os.environ["WORLD_SIZE"])
    # A group of one would need no ring; the launcher starts one process without a group.
    group = gloo_group() if world > 1 else contextlib.nullcontext()
    with group:
        rank, world = _group()
        output_errors, gradient_errors, steps = {}, {}, []
        for seed in seeds:
            for causal in (True, False):
                errors = _compare_with_full(int(seed), seq_len, causal, rank, world, merge, mask,
                                            steps if causal and seed == seeds[0] else None)
                output_errors[seed, causal], gradient_errors[seed, causal] = errors
        kept, peaks = [], []
        for n in memory_seq_lens:
            chunks = [sequence_chunk(t, rank, world).clone().requires_grad_() for t in random_qkv(0, n)]
            saved, peak = attention_memory(ring_attention, *chunks)
            kept.append(saved)
            peaks.append(peak)
    return ContextParallelRun(rank, world, output_errors, gradient_errors, tuple(steps), tuple(memory_seq_lens),
                              tuple(kept), tuple(peaks))


def _check_qkv(q, k, v) -> None:
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_instance(tensor, name, torch.Tensor, "a torch.Tensor shaped (..., seq, d)")
        if tensor.dim() < 2 or not tensor.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor shaped (..., seq, d), got "
                             f"{tensor.dtype} of shape {tuple(tensor.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must have one shape (this process's chunk of each), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")


def _check_block(q, k, v, mask) -> None:
    """Queries on a block of keys: tensors whose last dimensions fit, a bool mask (queries x keys) or None."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_instance(tensor, name, torch.Tensor, "a torch.Tensor shaped (..., seq, d)")
    if q.dim() < 2 or k.shape != v.shape or q.shape[-1] != k.shape[-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q must be (..., queries, d) and k, v one shape (..., keys, d), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or tuple(mask.shape[-2:]) != (q.shape[-2], k.shape[-2])):
        raise ValueError(f"mask must be None or a bool tensor (queries x keys) = ({q.shape[-2]}, {k.shape[-2]}), "
                         f"got {mask!r:.80}")
