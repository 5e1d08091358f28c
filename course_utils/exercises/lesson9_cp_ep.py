"""Exercises of lesson 9's context and expert parallelism, checked on probes, then against launched runs.

- ``q1``: merge two partial softmaxes by their log-sum-exp; the ring of 3 processes runs with it;
- ``q2``: the causal mask of a ring step, on global positions; the ring of 2 processes runs with it;
- ``q3``: dispatch tokens to their experts' processes (order and counts for ``all_to_all_single``);
  the expert-parallel layer on 2 processes runs with it.

Each check first runs the learner's function here on small cases, under a time
limit, where each classic mistake is recognised by what the function returned;
only an answer that passes them is launched, and it is accepted only when the
launched run equals one process (outputs and gradients, finite) to rounding.
"""

from __future__ import annotations

import math

import torch

from course_utils import experts
from course_utils import ring_attention as ra
from course_utils.exercises.core import Incorrect, describe_value
from course_utils.exercises.lesson7 import LaunchedExercise

TOLERANCE = 1e-5  # largest difference from one process that rounding explains (the lesson: about 1e-6)
PROBE_SEEDS = (0, 1, 2)


def _not_a_function(name: str, arguments: str, value: object) -> str | None:
    """Return the diagnosis of an answer that should be a function ``name(arguments)``, or None if it is one."""
    if callable(value):
        return None
    if isinstance(value, str):
        return (f"`{name}` is a string ({describe_value(value)}), not code that runs: define it with "
                f"`def {name}({arguments}):` and run the cell.")
    return f"`{name}` should be a function `{name}({arguments})`, but it is {describe_value(value)}."


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float = TOLERANCE) -> bool:
    """True when ``got`` has ``expected``'s shape and is within ``tolerance`` of it everywhere (NaN is close to nothing)."""
    return got.shape == expected.shape and bool(((got - expected).abs() <= tolerance).all())


def _worst(run_errors) -> float:
    """Return the largest error over every process and case; NaN counts as infinitely large."""
    values = [value for errors in run_errors for value in errors.values()]
    return max((math.inf if not math.isfinite(value) else value for value in values), default=math.inf)


# --------------------------------------------------------------------------- q1: merging softmaxes


def _tensor_pair(result, name: str, what: str, shapes) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``result`` as two float tensors of ``shapes``; raise Incorrect naming what is wrong."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise Incorrect(f"`{name}` returned {describe_value(result)}; it should return two tensors, {what}.")
    for part, label, shape in zip(result, what.split(" and "), shapes):
        if not isinstance(part, torch.Tensor):
            raise Incorrect(f"`{name}` returned {describe_value(part)} for {label}; it should be a tensor.")
        if tuple(part.shape) != tuple(shape):
            raise Incorrect(f"`{name}` returned {label} of shape {tuple(part.shape)}; it should have shape "
                            f"{tuple(shape)}, as its inputs.")
    return result[0].detach().float(), result[1].detach().float()


def _probe_parts(seed: int, scale: float = 1.0):
    """Return (the parts of a query block's attention on three key chunks, the whole attention on them) as (out, lse)."""
    q, k, v = ra.random_qkv(seed, 48)
    q = q * scale
    parts = [ra.block_attention(q, k[:, a:b], v[:, a:b]) for a, b in ((0, 20), (20, 36), (36, 48))]
    first_two = ra.block_attention(q, k[:, :36], v[:, :36])
    return parts, first_two, ra.block_attention(q, k, v)


def _merge_mistake(out, lse, a, b) -> str | None:
    """Return the diagnosis of a merge of parts ``a`` and ``b`` that gave (``out``, ``lse``), when it is a known mistake."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    weight_a, weight_b = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
    total = torch.logaddexp(lse_a, lse_b)
    if _close(out, (out_a + out_b) / 2) or _close(out, out_a + out_b):
        return ("Your `merge_softmaxes` adds or averages the two outputs as they are. Each part was normalised by "
                "its own sum of exponentials: reweight each by its share of the total, `exp(lse_part - lse)`.")
    if _close(out, weight_a * out_a + weight_b * out_b):
        return ("Your `merge_softmaxes` weights each part by `exp(lse_part)` but never divides by the total "
                "`exp(lse_a) + exp(lse_b)`: the weights must add to 1.")
    if _close(out, torch.exp(lse_b - total)[..., None] * out_a + torch.exp(lse_a - total)[..., None] * out_b):
        return "Your `merge_softmaxes` swaps the weights: `out_a` takes `exp(lse_a - lse)`, `out_b` takes `exp(lse_b - lse)`."
    return None


def _lse_mistake(lse, a, b) -> str:
    """Return the diagnosis of a merged log-sum-exp that is not logaddexp of the parts'."""
    (_, lse_a), (_, lse_b) = a, b
    if _close(lse, torch.maximum(lse_a, lse_b)):
        what = "the larger of the two log-sum-exps"
    elif _close(lse, lse_a + lse_b):
        what = "the sum of the two log-sum-exps (the log of a product)"
    elif _close(lse, lse_a) or _close(lse, lse_b):
        what = "one part's log-sum-exp unchanged"
    else:
        what = "not the log of the summed exponentials"
    return (f"The output is right, but the `lse` your `merge_softmaxes` returns is {what}. The ring merges again at "
            "the next step, and it weights with this `lse`: it must be `log(exp(lse_a) + exp(lse_b))` "
            "(`torch.logaddexp`).")


class MergeSoftmaxes(LaunchedExercise):
    title = "Exercise: merge two softmaxes"
    variables = ["merge_softmaxes"]
    time_limit_s = 120.0
    launch_cause = "Does `merge_softmaxes` return at once, the same in every process?"
    hints = [
        "A part's output is `sum(exp(s) v) / exp(lse_part)` over its keys. Over both parts the denominator is "
        "`exp(lse_a) + exp(lse_b)`.",
        "`lse = torch.logaddexp(lse_a, lse_b)`; each output is then multiplied by `torch.exp(lse_part - lse)`, with "
        "`[..., None]` to broadcast over the last dimension.",
        "```python\nlse = torch.logaddexp(lse_a, lse_b)\nout = torch.exp(lse_a - lse)[..., None] * out_a + "
        "torch.exp(lse_b - lse)[..., None] * out_b\nreturn out, lse\n```",
    ]
    solution_code = """
        def merge_softmaxes(out_a, lse_a, out_b, lse_b):
            lse = torch.logaddexp(lse_a, lse_b)
            out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
            return out, lse
    """
    correct_message = ("The ring of 3 processes, merging with your function at every step, gives full attention's "
                       "output and gradients.")

    def _merged(self, merge, a, b):
        out_shape, lse_shape = a[0].shape, a[1].shape
        result = self.call_learner(merge, *(t.clone() for t in (*a, *b)))
        return _tensor_pair(result, "merge_softmaxes", "the output and the lse", (out_shape, lse_shape))

    def check_answer(self, merge_softmaxes):
        diagnosis = _not_a_function("merge_softmaxes", "out_a, lse_a, out_b, lse_b", merge_softmaxes)
        if diagnosis:
            raise Incorrect(diagnosis)
        for seed in PROBE_SEEDS:
            (a, b, c), (out_ab, lse_ab), (out_all, lse_all) = _probe_parts(seed)
            out, lse = self._merged(merge_softmaxes, a, b)
            if not bool(torch.isfinite(out).all() and torch.isfinite(lse).all()):
                raise Incorrect("Your `merge_softmaxes` returned NaN or infinite values for ordinary scores.")
            if not _close(out, out_ab):
                raise Incorrect(_merge_mistake(out, lse, a, b) or (
                    "Your `merge_softmaxes` does not give attention over both parts' keys: the output differs from "
                    f"the softmax over all of them by {(out - out_ab).abs().max().item():.2g}."))
            if not _close(lse, lse_ab):
                raise Incorrect(_lse_mistake(lse, a, b))
            out, lse = self._merged(merge_softmaxes, (out, lse), c)
            if not (_close(out, out_all) and _close(lse, lse_all)):
                raise Incorrect("Two parts merge right, but merging that result with a third part does not: does "
                                "`merge_softmaxes` depend on something other than its four arguments?")
        (a, b, _), (out_ab, _), _ = _probe_parts(0, scale=50.0)
        out, _ = self._merged(merge_softmaxes, a, b)
        # Scores near 200: float32 rounds each lse to about 1e-5, and the outputs move by as much.
        if not bool(torch.isfinite(out).all()) or not _close(out, out_ab, tolerance=1e-4):
            raise Incorrect("With large scores (queries 50 times larger) your merge gives NaN or a wrong output: "
                            "`exp(lse)` overflows float32 once lse passes about 88. Weight by `exp(lse_part - lse)`, "
                            "with `lse = torch.logaddexp(lse_a, lse_b)`: both stay in range.")
        runs = self.launch_for_check(ra.context_parallel_run, ((0,), 96, (), merge_softmaxes), num_processes=3)
        worst = max(_worst(run.output_errors for run in runs), _worst(run.gradient_errors for run in runs))
        if not worst <= TOLERANCE:
            raise Incorrect(f"On the probes your merge is right, but the ring of 3 processes that merges with it "
                            f"differs from full attention by {worst:.2g}: does it change its arguments in place?")
        return None


# --------------------------------------------------------------------------- q2: the causal mask of a ring step

_CHUNK, _PROCESSES = 4, 3


def _probe_blocks():
    """Return (query chunk, key chunk, query positions, key positions) for every block of a 3-process ring of 4-token chunks."""
    positions = [torch.arange(r * _CHUNK, (r + 1) * _CHUNK) for r in range(_PROCESSES)]
    return [(r, s, positions[r], positions[s]) for r in range(_PROCESSES) for s in range(_PROCESSES)]


class RingMask(LaunchedExercise):
    title = "Exercise: the causal mask across ring steps"
    variables = ["ring_mask"]
    time_limit_s = 120.0
    launch_cause = "Does `ring_mask` return at once?"
    hints = [
        "A query may see a key when the key's position in the whole sequence is at most the query's. The "
        "positions you get are global: process 1's queries of 4-token chunks are at 4, 5, 6, 7.",
        "Compare every key position with every query position by broadcasting: a (queries x 1) column against a "
        "(1 x keys) row.",
        "`return key_positions[None, :] <= query_positions[:, None]`",
    ]
    solution_code = """
        def ring_mask(query_positions, key_positions):
            return key_positions[None, :] <= query_positions[:, None]
    """
    correct_message = ("With your mask, the ring of 2 processes skips the hidden block and gives causal attention's "
                       "output and gradients.")

    def check_answer(self, ring_mask):
        diagnosis = _not_a_function("ring_mask", "query_positions, key_positions", ring_mask)
        if diagnosis:
            raise Incorrect(diagnosis)
        for r, s, queries, keys in _probe_blocks():
            got = self.call_learner(ring_mask, queries.clone(), keys.clone())
            expected = ra.causal_mask(queries, keys)
            if not isinstance(got, torch.Tensor):
                raise Incorrect(f"`ring_mask` returned {describe_value(got)}; it should return a bool tensor, "
                                "queries x keys, True where a query may see a key.")
            if tuple(got.shape) != tuple(expected.shape):
                raise Incorrect(f"`ring_mask` returned a tensor of shape {tuple(got.shape)} for {len(queries)} "
                                f"queries and {len(keys)} keys; it should be (queries, keys), one row per query.")
            if got.dtype != torch.bool:
                raise Incorrect(f"`ring_mask` returned a {str(got.dtype).removeprefix('torch.')} tensor; attention "
                                "masks with `~mask` and `masked_fill`, which need a bool tensor (use a comparison).")
            if torch.equal(got, expected):
                continue
            raise Incorrect(self._diagnose(got, expected, r, s))
        runs = self.launch_for_check(ra.context_parallel_run, ((0,), 128, (), ra.merge_partial, ring_mask))
        causal = [{key: value for key, value in errors.items() if key[1]} for run in runs
                  for errors in (run.output_errors, run.gradient_errors)]
        worst = _worst(causal)
        if not worst <= TOLERANCE:
            raise Incorrect(f"On the probes your mask is right, but the ring of 2 processes that masks with it differs "
                            f"from causal attention by {worst:.2g}.")
        return None

    @staticmethod
    def _diagnose(got, expected, r, s) -> str:
        block = f"For queries of chunk {r} and keys of chunk {s}"
        local = torch.ones_like(expected).tril()
        if r != s and torch.equal(got, local):
            return (f"{block}, your mask is a lower triangle, as if every step held the diagonal block: it compares "
                    "positions inside the chunks, not in the whole sequence. Use the global positions you are given.")
        if torch.equal(got, expected & ~torch.eye(len(expected), dtype=torch.bool)):
            return (f"{block}, your mask hides each token from itself (`<` instead of `<=`): the first token then "
                    "sees no key at all, and its softmax is 0/0, NaN.")
        if torch.equal(got, ~expected | torch.eye(len(expected), dtype=torch.bool)) or torch.equal(got, ~expected):
            return f"{block}, your mask is reversed: it shows the later keys and hides the earlier ones."
        if bool((got & ~expected).any()):
            return (f"{block}, your mask lets queries see keys after their own position: a causal model must not "
                    "see the future.")
        return f"{block}, your mask hides keys at or before the query's position, which a causal model may see."


# --------------------------------------------------------------------------- q3: dispatching tokens to experts

_DISPATCH_CASES = (
    # (expert of each token, experts per process, processes): the last process of the second gets no token
    (torch.tensor([5, 0, 3, 1, 0, 2, 5, 4, 1, 3]), 2, 3),
    (torch.tensor([0, 3, 1, 2, 0, 1]), 2, 3),
    (torch.tensor([2, 2, 1, 0, 3, 0, 1, 3]), 1, 4),
)


def _order_and_counts(result, num_tokens: int) -> tuple[list[int], list[int]]:
    """Return the learner's (order, counts) as lists of ints; raise Incorrect saying what is wrong."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise Incorrect(f"`dispatch_tokens` returned {describe_value(result)}; it should return two things: the "
                        "order of the tokens and the number of tokens for each process.")
    order, counts = result
    try:
        order = torch.as_tensor(order).reshape(-1).tolist() if not isinstance(order, (str, bytes)) else None
        counts = torch.as_tensor(counts).reshape(-1).tolist() if not isinstance(counts, (str, bytes)) else None
    except Exception:
        order = counts = None
    if order is None or counts is None or not all(isinstance(i, int) for i in order + counts):
        raise Incorrect("`dispatch_tokens` should return an order (token indices, ints) and counts (ints, one per "
                        "process): lists or integer tensors.")
    if sorted(order) != list(range(num_tokens)):
        raise Incorrect(f"The order `dispatch_tokens` returned does not list each of the {num_tokens} tokens once: it "
                        "should be a permutation of the token indices (`torch.argsort` gives one).")
    return order, counts


class DispatchTokens(LaunchedExercise):
    title = "Exercise: send each token to its expert's process"
    variables = ["dispatch_tokens"]
    time_limit_s = 120.0
    launch_cause = "Does `dispatch_tokens` return at once, in every process?"
    hints = [
        "Process r holds experts r * experts_per_process to (r + 1) * experts_per_process - 1: a token's process "
        "is its expert divided by experts_per_process, rounded down.",
        "`all_to_all_single` sends the first counts[0] rows to process 0, the next counts[1] to process 1...: sort "
        "the tokens by destination (`torch.argsort`), and count them with `torch.bincount(..., minlength=world_size)`, "
        "so that a process that gets no token still has its 0.",
        "```python\ndestinations = expert_ids // experts_per_process\norder = torch.argsort(destinations)\n"
        "counts = torch.bincount(destinations, minlength=world_size).tolist()\nreturn order, counts\n```",
    ]
    solution_code = """
        def dispatch_tokens(expert_ids, experts_per_process, world_size):
            destinations = expert_ids // experts_per_process
            order = torch.argsort(destinations)
            counts = torch.bincount(destinations, minlength=world_size).tolist()
            return order, counts
    """
    correct_message = ("Every token reached the process of its expert and came back: the layer on 2 processes "
                       "equals the one-process layer, outputs and gradients.")

    def check_answer(self, dispatch_tokens):
        diagnosis = _not_a_function("dispatch_tokens", "expert_ids, experts_per_process, world_size", dispatch_tokens)
        if diagnosis:
            raise Incorrect(diagnosis)
        for expert_ids, per_process, world in _DISPATCH_CASES:
            result = self.call_learner(dispatch_tokens, expert_ids.clone(), per_process, world)
            order, counts = _order_and_counts(result, len(expert_ids))
            self._judge(expert_ids, per_process, world, order, counts)
        runs = self.launch_for_check(experts.expert_parallel_run, ((0, 1), (0.0,), 64, 4, _as_lists(dispatch_tokens)))
        worst = max(_worst(run.output_errors for run in runs), _worst(run.gradient_errors for run in runs))
        misrouted = sum(sum(run.misrouted.values()) for run in runs)
        if misrouted or not worst <= TOLERANCE:
            raise Incorrect(f"On the probes your dispatch is right, but in the launched layer {misrouted} tokens "
                            f"reached the wrong process and the outputs differ from one process's by {worst:.2g}.")
        return None

    @staticmethod
    def _judge(expert_ids, per_process, world, order, counts) -> None:
        """Raise Incorrect unless sending ``order``'s tokens in ``counts`` blocks takes every token to its expert's process."""
        tokens = len(expert_ids)
        num_experts = per_process * world
        case = f"For {tokens} tokens, {world} processes of {per_process} expert{'s' if per_process > 1 else ''} each"
        if len(counts) == num_experts != world:
            raise Incorrect(f"{case}, your counts have {len(counts)} entries, one per expert: `all_to_all_single` "
                            f"needs one per process ({world}), the tokens for all of that process's experts together.")
        if len(counts) != world:
            raise Incorrect(f"{case}, your counts have {len(counts)} entries; `all_to_all_single` needs one per "
                            f"process, {world}, zeros included (`torch.bincount(..., minlength=world_size)`): here a "
                            "process gets no token.")
        if any(count < 0 for count in counts) or sum(counts) != tokens:
            raise Incorrect(f"{case}, your counts add to {sum(counts)}, not the {tokens} tokens sent.")
        sent_to = [process for process, count in enumerate(counts) for _ in range(count)]
        destination = {token: sent_to[position] for position, token in enumerate(order)}
        wanted = (expert_ids // per_process).tolist()
        wrong = [token for token in range(tokens) if destination[token] != wanted[token]]
        if not wrong:
            return
        round_robin = (expert_ids % world).tolist()
        if all(destination[token] == round_robin[token] for token in range(tokens)):
            raise Incorrect(f"{case}, your dispatch sends each token to process `expert % world_size`, but the "
                            "experts are not dealt round-robin: process r holds experts r * experts_per_process to "
                            "(r + 1) * experts_per_process - 1. The tokens reach the wrong experts.")
        if counts == torch.bincount(torch.tensor(wanted), minlength=world).tolist():
            raise Incorrect(f"{case}, your counts are right but the tokens are not in destination order: "
                            "`all_to_all_single` sends the first counts[0] rows to process 0, the next counts[1] to "
                            "process 1, and so on. Sort the tokens by destination.")
        token = wrong[0]
        raise Incorrect(f"{case}, token {token} (expert {int(expert_ids[token])}) would go to process "
                        f"{destination[token]}, which does not hold that expert.")


def _as_lists(dispatch_tokens):
    """Return ``dispatch_tokens`` returning (a LongTensor order, a list of ints), as the layer needs them."""

    def normalised(expert_ids, experts_per_process, world_size):
        order, counts = dispatch_tokens(expert_ids, experts_per_process, world_size)
        return torch.as_tensor(order, dtype=torch.long).reshape(-1), [int(c) for c in torch.as_tensor(counts).reshape(-1)]

    return normalised


q1 = MergeSoftmaxes()
q2 = RingMask()
q3 = DispatchTokens()
