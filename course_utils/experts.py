"""Expert parallelism: a mixture-of-experts layer whose experts live on different processes (lesson 9).

A mixture-of-experts (MoE) layer replaces one MLP by E smaller MLPs, the
experts, and a router: a linear layer that scores each token against every
expert; each token goes to its best expert only (top-1, as the Switch
Transformer routes), and the expert's output is scaled by the router's
probability for it (so the router learns). Parameters grow with E; the compute
per token does not.

Under expert parallelism each of N processes holds E/N of the experts (process
r the experts r*E/N .. (r+1)*E/N - 1) and its own share of the tokens. Each
token must visit the process of its expert and come back, which takes two
all-to-alls (``torch.distributed.all_to_all_single``): one that sends every
token to its expert's process, one that brings the results home. Before the
first, each process sorts its tokens by destination and tells every other how
many it will send (a small all-to-all of counts), since a process cannot know
in advance how many tokens it will receive: that depends on the router.

- :func:`make_moe`: the router and the experts, drawn from a seed (the same in every process);
- :func:`route`: each token's expert and gate; :func:`moe_one_process`: the layer in one process, the reference;
- :func:`dispatch`: the order that sorts tokens by destination, and how many go to each process;
- :func:`expert_parallel_moe`: the layer over the processes of a group, with what each process received;
- :func:`load_balancing_loss`: the Switch Transformer's auxiliary loss, 1 when the tokens spread evenly;
- :func:`expert_parallel_run`: what each launched process of the lesson runs.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch

from course_utils.validation import (
    check_in_launch, check_instance, check_non_negative_int, check_non_negative_number, check_positive_int,
)

__all__ = [
    "ExpertParallelRun",
    "MoE",
    "dispatch",
    "expert_parallel_moe",
    "expert_parallel_run",
    "load_balancing_loss",
    "make_moe",
    "moe_one_process",
    "route",
    "token_batch",
]

DIM, HIDDEN = 32, 64  # a token's width and each expert's hidden width in the lesson's layer


@dataclass
class MoE:
    """A mixture-of-experts layer's parts: ``router`` (Linear dim -> E) and ``experts`` (E MLPs dim -> hidden -> dim)."""

    router: torch.nn.Linear
    experts: torch.nn.ModuleList

    def parameters(self):
        return [*self.router.parameters(), *self.experts.parameters()]


def make_moe(num_experts: int, seed: int = 0, dim: int = DIM, hidden: int = HIDDEN, skew: float = 0.0) -> MoE:
    """Return a :class:`MoE` with ``num_experts`` experts, drawn from ``seed`` (every process draws the same).

    ``skew`` is added to the router's bias for expert 0: a router that prefers
    one expert, as a badly balanced trained one does.
    """
    check_positive_int(num_experts, "num_experts")
    check_non_negative_int(seed, "seed")
    check_positive_int(dim, "dim")
    check_positive_int(hidden, "hidden")
    check_non_negative_number(skew, "skew")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        router = torch.nn.Linear(dim, num_experts)
        experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim))
            for _ in range(num_experts)
        )
    finally:
        torch.random.set_rng_state(generator_state)  # the learner's own random stream is left as it was
    with torch.no_grad():
        router.bias[0] += skew
    return MoE(router, experts)


def token_batch(seed: int, num_tokens: int, dim: int = DIM) -> torch.Tensor:
    """Return ``num_tokens`` tokens (num_tokens, dim) fp32, drawn from ``seed``: the whole batch, the same in every process."""
    check_positive_int(num_tokens, "num_tokens")
    return torch.randn(num_tokens, dim, generator=torch.Generator().manual_seed(seed))


def route(x: torch.Tensor, router: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (expert of each token, its gate, the router's probabilities): top-1 routing.

    The gate is the router's softmax probability of the chosen expert; scaling
    the expert's output by it is what gives the router a gradient.
    """
    check_instance(x, "x", torch.Tensor, "a torch.Tensor of tokens (tokens, dim)")
    check_instance(router, "router", torch.nn.Linear, "the MoE's router (a torch.nn.Linear)")
    if x.dim() != 2 or x.shape[-1] != router.in_features:
        raise ValueError(f"x must be tokens (tokens, {router.in_features}), got shape {tuple(x.shape)}")
    probabilities = torch.softmax(router(x), dim=-1)
    gates, expert_ids = probabilities.max(dim=-1)
    return expert_ids, gates, probabilities


def moe_one_process(x: torch.Tensor, moe: MoE) -> torch.Tensor:
    """Return the MoE layer's output for tokens ``x`` (tokens, dim), every expert in this process: the reference."""
    check_instance(x, "x", torch.Tensor, "a torch.Tensor of tokens (tokens, dim)")
    check_instance(moe, "moe", MoE, "a MoE (make_moe)")
    expert_ids, gates, _ = route(x, moe.router)
    out = torch.zeros_like(x)
    for index, expert in enumerate(moe.experts):
        chosen = expert_ids == index
        out = out.index_put((chosen,), expert(x[chosen]))
    return out * gates[:, None]


def dispatch(expert_ids: torch.Tensor, experts_per_process: int, world_size: int) -> tuple[torch.Tensor, list[int]]:
    """Return (order, counts): the token order that groups tokens by their expert's process, and the tokens per process.

    Process r holds experts r*experts_per_process .. (r+1)*experts_per_process - 1,
    so a token's process is its expert // experts_per_process. ``all_to_all_single``
    sends the first counts[0] rows to process 0, the next counts[1] to process 1...:
    the rows must be in that order, and counts must have one entry per process, zeros included.
    """
    destinations = expert_ids // experts_per_process
    order = torch.argsort(destinations, stable=True)
    counts = torch.bincount(destinations, minlength=world_size).tolist()
    return order, counts


def load_balancing_loss(probabilities: torch.Tensor, expert_ids: torch.Tensor) -> float:
    """Return the Switch Transformer's auxiliary loss E * sum_i f_i * P_i (Fedus et al. 2021, eq. 4).

    f_i: the share of tokens routed to expert i; P_i: the router's mean
    probability for expert i. It is 1 when both are even (1/E each) and grows
    to E when every token and all probability go to one expert.
    """
    check_instance(probabilities, "probabilities", torch.Tensor, "the router's probabilities (tokens, experts)")
    check_instance(expert_ids, "expert_ids", torch.Tensor, "each token's expert (an int tensor)")
    if probabilities.dim() != 2 or expert_ids.shape != probabilities.shape[:1] or expert_ids.is_floating_point():
        raise ValueError(f"probabilities must be (tokens, experts) and expert_ids one int per token, got shapes "
                         f"{tuple(probabilities.shape)} and {tuple(expert_ids.shape)}")
    num_experts = probabilities.shape[-1]
    shares = torch.bincount(expert_ids, minlength=num_experts).double() / expert_ids.numel()
    return float(num_experts * (shares * probabilities.double().mean(0)).sum())


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with a backward pass: the gradients go back the way the tokens came (the splits swapped)."""

    @staticmethod
    def forward(ctx, x, send_counts, receive_counts):
        import torch.distributed as dist

        received = x.new_empty((sum(receive_counts), *x.shape[1:]))
        dist.all_to_all_single(received, x.contiguous(), receive_counts, send_counts)
        ctx.counts = send_counts, receive_counts
        return received

    @staticmethod
    def backward(ctx, grad):
        send_counts, receive_counts = ctx.counts
        return _AllToAll.apply(grad, receive_counts, send_counts), None, None


def _exchange_counts(send_counts: list[int]) -> list[int]:
    """Return how many tokens each process will send here, given how many this one sends to each (an all-to-all of counts)."""
    import torch.distributed as dist

    received = torch.empty(len(send_counts), dtype=torch.int64)
    dist.all_to_all_single(received, torch.tensor(send_counts, dtype=torch.int64))
    return received.tolist()


def expert_parallel_moe(x: torch.Tensor, moe: MoE, dispatch=dispatch) -> tuple[torch.Tensor, dict]:
    """Return (the MoE output for this process's tokens ``x``, what this process received), its experts only computed here.

    Every process of the group calls it with its own tokens; ``moe`` holds all
    E experts' modules in every process (drawn from one seed) but this process
    runs and trains only its own E/N. The second value: ``received`` (tokens
    this process computed, per local expert), ``misrouted`` (tokens that
    arrived here for an expert this process does not hold: they get no
    expert's output, which is what a wrong ``dispatch`` does). ``dispatch`` is
    the routing piece (lesson 9's exercise puts a learner's in its place).
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    experts_per_process = len(moe.experts) // world
    first = rank * experts_per_process
    expert_ids, gates, _ = route(x, moe.router)
    order, send_counts = dispatch(expert_ids, experts_per_process, world)
    receive_counts = _exchange_counts(send_counts)
    # First all-to-all: every token to its expert's process (the expert ids travel with them).
    tokens = _AllToAll.apply(x[order], send_counts, receive_counts)
    their_experts = torch.empty(sum(receive_counts), dtype=expert_ids.dtype)
    dist.all_to_all_single(their_experts, expert_ids[order].contiguous(), receive_counts, send_counts)
    computed = torch.zeros_like(tokens)
    received = []
    for index in range(first, first + experts_per_process):
        chosen = their_experts == index
        received.append(int(chosen.sum()))
        computed = computed.index_put((chosen,), moe.experts[index](tokens[chosen]))
    # Second all-to-all: the results back to the tokens' own processes, then back into the tokens' order.
    returned = _AllToAll.apply(computed, receive_counts, send_counts)
    out = returned[torch.argsort(order)]
    stats = {"received": received, "misrouted": len(their_experts) - sum(received)}
    return out * gates[:, None], stats


@dataclass(frozen=True)
class ExpertParallelRun:
    """What one process of :func:`expert_parallel_run` saw.

    - ``rank``, ``world_size``, ``experts``: this process and the indices of the experts it holds;
    - ``output_errors``, ``gradient_errors``: per seed, the largest absolute
      difference of this process's outputs, and of its experts' and the router's
      gradients, from the one-process layer on the whole batch;
    - ``received``: per skew, the tokens this process computed per expert it holds;
    - ``misrouted``: per seed, tokens that reached this process for an expert it does not hold;
    - ``balance_loss``: per skew, the Switch load-balancing loss of the whole batch's routing.
    """

    rank: int
    world_size: int
    experts: tuple
    output_errors: dict = field(default_factory=dict)
    gradient_errors: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)
    misrouted: dict = field(default_factory=dict)
    balance_loss: dict = field(default_factory=dict)


def _compare_with_one_process(seed: int, skew: float, tokens_per_process: int, num_experts: int, rank: int,
                              world: int, dispatch):
    """Return (output error, gradient error, stats, balance loss) of the expert-parallel layer against one process."""
    import torch.distributed as dist

    batch = token_batch(seed, tokens_per_process * world)
    weights = torch.randn(batch.shape, generator=torch.Generator().manual_seed(seed + 1))
    reference = make_moe(num_experts, seed, skew=skew)
    expected = moe_one_process(batch, reference)
    (expected * weights).sum().backward()
    _, _, probabilities = route(batch, reference.router)
    balance = load_balancing_loss(probabilities.detach(), probabilities.argmax(-1))

    moe = make_moe(num_experts, seed, skew=skew)
    mine = slice(rank * tokens_per_process, (rank + 1) * tokens_per_process)
    out, stats = expert_parallel_moe(batch[mine], moe, dispatch)
    (out * weights[mine]).sum().backward()
    # The router is replicated: each process's gradient covers its own tokens; summed, they are the whole batch's.
    for parameter in moe.router.parameters():
        dist.all_reduce(parameter.grad)
    per_process = len(moe.experts) // world
    mine_experts = range(rank * per_process, (rank + 1) * per_process)
    pairs = [*zip(moe.router.parameters(), reference.router.parameters())]
    pairs += [pair for index in mine_experts
              for pair in zip(moe.experts[index].parameters(), reference.experts[index].parameters())]
    gradient_error = max(_difference(p.grad, q.grad) for p, q in pairs)
    return _difference(out.detach(), expected[mine].detach()), gradient_error, stats, balance


def _difference(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Return the largest absolute difference of two tensors; inf when one gradient is missing."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    return (a - b).abs().max().item()


def expert_parallel_run(seeds=(0, 1, 2), skews=(0.0, 2.0), tokens_per_process: int = 64, num_experts: int = 4,
                        dispatch=dispatch) -> ExpertParallelRun:
    """What each launched process of lesson 9's expert parallelism runs; returns its :class:`ExpertParallelRun`.

    For each seed (router as drawn): the expert-parallel layer on this
    process's ``tokens_per_process`` tokens, compared with the one-process
    layer on the whole batch, outputs and gradients. For each skew (seed 0):
    the tokens each process computed, and the load-balancing loss.
    """
    from course_utils.sharding import gloo_group

    check_in_launch("expert_parallel_run")
    check_positive_int(tokens_per_process, "tokens_per_process")
    check_positive_int(num_experts, "num_experts")
    world = int(os.environ["WORLD_SIZE"])
    if num_experts % world:
        raise ValueError(f"num_experts must be a multiple of the {world} processes, got {num_experts}")
    group = gloo_group() if world > 1 else contextlib.nullcontext()
    with group:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("expert_parallel_run needs two processes or more: experts are split across them")
        rank = dist.get_rank()
        per_process = num_experts // world
        run = ExpertParallelRun(rank, world, tuple(range(rank * per_process, (rank + 1) * per_process)))
        for seed in seeds:
            output, gradient, stats, _ = _compare_with_one_process(seed, 0.0, tokens_per_process, num_experts, rank,
                                                                   world, dispatch)
            run.output_errors[seed], run.gradient_errors[seed], run.misrouted[seed] = output, gradient, stats["misrouted"]
        for skew in skews:
            _, _, stats, balance = _compare_with_one_process(0, skew, tokens_per_process, num_experts, rank, world,
                                                             dispatch)
            run.received[skew], run.balance_loss[skew] = stats["received"], balance
    return run
