# %% [markdown]
# # Lesson 9 — When one layer is too big or activations do not divide: tensor, sequence, pipeline, context and expert parallelism, run on CPU processes

# %% [markdown]
# ## 4. Context parallelism
#
# Data parallelism and ZeRO (lessons 6 and 7) divide the training state, never the
# activations of one sequence; tensor and sequence parallelism divide them by the
# hidden dimension and the heads. A sequence of a million tokens is too long for
# any of them: *context parallelism* cuts the **sequence** itself into *N*
# contiguous chunks, one per process. Everything in a transformer block but
# attention works token by token, so it runs on a chunk as it is. Attention needs
# every query to meet every key: the key and value chunks travel round a **ring**
# of processes. At each of *N* steps a process attends its own queries to the chunk
# it holds, passes that chunk on to the next process (`send`) and takes one from the
# previous (`recv`). No process ever holds all the keys, nor a score matrix larger
# than chunk x chunk.
#
# torch has this as `torch.distributed.tensor.experimental.context_parallel`, but on
# a CPU (torch 2.13) it fails: it has no sharding strategy for the CPU's
# flash-attention kernel. So the ring here is written from scratch, in
# `course_utils/ring_attention.py`, over `isend`/`irecv` on gloo.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import inspect

import torch
from IPython.display import Markdown, display

from course_utils import launcher
from course_utils import ring_attention as ra
from course_utils.plots import ring_attention as ring_plots
from course_utils.units import format_bytes

launcher.silence_library_progress_bars()
# Every launch below takes seconds; a worker stuck in a send whose partner died would hang the cell for good:
# past this limit the launcher stops every worker and raises WorkerTimeout, saying so.
LAUNCH_TIMEOUT_S = 120
SEEDS = (0, 1, 2)

# %% [markdown]
# The norm and the MLP of a block see one token at a time: on a chunk of the
# sequence they give that chunk of what they give on the whole sequence (to rounding).
# Attention does not:

# %%
torch.manual_seed(0)
width = 32
per_token = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width))
sequence = torch.randn(2, 64, width)  # (heads, tokens, width), as ring_attention's inputs
with torch.no_grad():
    print("norm + MLP on the first half of the tokens = the first half of it on all:",
          torch.allclose(per_token(sequence[:, :32]), per_token(sequence)[:, :32], atol=1e-6))
    print("attention on the first half = the first half of attention on all (not causal):",
          torch.allclose(ra.attention(*(sequence[:, :32],) * 3, causal=False),
                         ra.attention(*(sequence,) * 3, causal=False)[:, :32], atol=1e-5))

# %% [markdown]
# ### Softmaxes over parts of the keys merge exactly
#
# At each step a process knows the softmax of its queries over *some* keys only. A
# softmax over all keys is not the average of the parts: each part divided its
# exponentials by its own sum. Keep, per query, the log of that sum (the
# *log-sum-exp*, `lse`); over both parts the sum is `exp(lse_a) + exp(lse_b)`, so each
# part's output is reweighted by its share of it:
#
# $$\text{lse} = \log\left(e^{\text{lse}_a} + e^{\text{lse}_b}\right), \qquad
# \text{out} = e^{\text{lse}_a - \text{lse}}\,\text{out}_a + e^{\text{lse}_b - \text{lse}}\,\text{out}_b .$$
#
# This is the "online softmax" that FlashAttention also runs block by block.
# `torch.logaddexp` computes the first without ever forming `exp(lse)`, which
# overflows once scores are large. Here are a query block's attention over 64 keys,
# and the same from two parts of 40 and 24 keys, merged, or naively averaged:

# %%
print(inspect.getsource(ra.merge_partial))

merge_errors, average_errors = [], []
for seed in SEEDS:
    q, k, v = ra.random_qkv(seed, 64)
    whole, _ = ra.block_attention(q, k, v)
    first, second = ra.block_attention(q, k[:, :40], v[:, :40]), ra.block_attention(q, k[:, 40:], v[:, 40:])
    merged, _ = ra.merge_partial(*first, *second)
    merge_errors.append((merged - whole).abs().max().item())
    average_errors.append(((first[0] + second[0]) / 2 - whole).abs().max().item())
print(f"merged by log-sum-exp, largest difference from the whole softmax over {len(SEEDS)} seeds: "
      f"{min(merge_errors):.1e} to {max(merge_errors):.1e}")
print(f"averaged without reweighting:                                        "
      f"{min(average_errors):.2f} to {max(average_errors):.2f}")

# %% [markdown]
# ### The causal mask is a rule on global positions
#
# A causal model's query may see its own position and those before it. On the ring,
# the chunk a process holds at a given step came from another process: its keys sit
# elsewhere in the whole sequence. So the mask compares **global** positions, and
# the same rule masks every step. With contiguous chunks, the chunk of an earlier
# process is wholly visible, one's own chunk is lower-triangular, and the chunk of a
# later process is wholly hidden: that step is skipped (no work). Masking every step
# as if it were the diagonal block (a lower triangle on every chunk) would hide part
# of the earlier chunks, which the queries must see. Here is what process 1 of 2
# sees of an 8-token sequence, step by step:

# %%
print(inspect.getsource(ra.causal_mask))
chunk = 4
mine = torch.arange(chunk, 2 * chunk)  # process 1's queries: positions 4-7
for source in (1, 0):
    keys = torch.arange(source * chunk, (source + 1) * chunk)
    print(f"keys of process {source} (positions {keys[0]}-{keys[-1]}):")
    print(ra.causal_mask(mine, keys).int())

# %% [markdown]
# ### The ring, forward and backward
#
# Attention written out keeps its probabilities for the backward pass, seq x seq
# numbers per head (measured below). So `ring_attention(q, k, v)` is a
# `torch.autograd.Function` of its own: its forward pass is the ring below, and it
# keeps only this process's q, k, v, its output and its log-sum-exp. Its backward
# pass sends the key/value chunks round the ring a second time, recomputing each
# block's probabilities from the saved `lse`; the gradients of each key/value chunk
# travel with it, each process adding its queries' share, until after *N* passes
# every chunk is home with all of them.

# %%
print(inspect.getsource(ra.RingAttention.forward))

# %% [markdown]
# Two processes each take their chunk of the same sequences (drawn from a seed in
# both), run ring attention forward and backward, and compare their output chunk and
# their q, k, v gradient chunks with full attention on the whole sequence in one
# process, for three seeds, causal and not. The same launch measures, in each
# process, the bytes autograd keeps and the allocator's peak for longer sequences.

# %%
MEMORY_SEQ_LENS = (512, 1024, 2048)
cp_runs = launcher.launch(ra.context_parallel_run, (SEEDS, 256, MEMORY_SEQ_LENS), num_processes=2,
                          timeout=LAUNCH_TIMEOUT_S)

# %% tags=["nbval-check-output"]
for run in cp_runs:
    print(f"process {run.rank}: output within 1e-5 of full attention: {max(run.output_errors.values()) < 1e-5}; "
          f"q, k, v gradients within 1e-5: {max(run.gradient_errors.values()) < 1e-5} "
          f"({len(run.output_errors)} cases: {len(SEEDS)} seeds, causal and not)")

# %%
for run in cp_runs:
    print(f"process {run.rank}: largest output difference {max(run.output_errors.values()):.1e}, "
          f"largest gradient difference {max(run.gradient_errors.values()):.1e}")

# %% tags=["nbval-check-output"]
for run in cp_runs:
    steps = ", ".join(f"step {step}: chunk of process {source} {'computed' if computed else 'skipped (hidden)'}"
                      for step, source, computed in run.steps)
    print(f"process {run.rank}, causal: {steps}")

# %%
computed = [sum(c for *_, c in run.steps) for run in cp_runs]
display(Markdown(
    f"The ring gives full attention's output and gradients, to rounding (the order of the additions differs). "
    f"Under the causal mask the work is **unbalanced**: process 0 computed {computed[0]} block and process 1 "
    f"computed {computed[1]}; with *N* processes, process *r* computes *r* + 1 of *N*. Implementations balance it by "
    "giving each process two chunks, one from each end of the sequence (the \"zig-zag\" ring described in the "
    "Ultra-Scale Playbook, Hugging Face 2025)."
))

# %% [markdown]
# ### What one process keeps, against sequence length
#
# The same measurements in this process, on the whole sequence: full attention as
# written out (the math kernel: it keeps the seq x seq probabilities) and ring
# attention alone (a ring of one process: the same function, recomputing in the
# backward pass). Kept: the storages autograd saved in the forward pass. Peak: the
# allocator's largest rise over the forward and backward pass, every thread.

# %%
memory = {"full attention, 1 process": ([], []), "ring attention, 1 process": ([], []),
          # the larger of the two processes' figures: the one that must fit
          "ring attention, each of 2 processes": ([max(kept) for kept in zip(*(run.kept for run in cp_runs))],
                                                  [max(peak) for peak in zip(*(run.peaks for run in cp_runs))])}
for seq_len in MEMORY_SEQ_LENS:
    for label, function in (("full attention, 1 process", ra.attention), ("ring attention, 1 process", ra.ring_attention)):
        kept, peak = ra.attention_memory(function, *(t.requires_grad_() for t in ra.random_qkv(0, seq_len)))
        memory[label][0].append(kept)
        memory[label][1].append(peak)

print(f"{'':<44}" + "".join(f"{f'seq {n}':>22}" for n in MEMORY_SEQ_LENS))
for label, (kept, peaks) in memory.items():
    print(f"{label + ', kept':<44}" + "".join(f"{format_bytes(b):>22}" for b in kept))
    print(f"{label + ', peak':<44}" + "".join(f"{format_bytes(b):>22}" for b in peaks))

# %%
ring_plots.plot_attention_memory(MEMORY_SEQ_LENS, memory);

# %% tags=["nbval-check-output"]
alone_kept, alone_peak = memory["ring attention, 1 process"]
each_kept, each_peak = memory["ring attention, each of 2 processes"]
print("each of 2 processes keeps exactly half of what one keeps:",
      all(2 * mine == alone for mine, alone in zip(each_kept, alone_kept)))
print("the kept bytes double with the sequence length:",
      all(b == 2 * a for a, b in zip(alone_kept, alone_kept[1:])))

# %%
full_kept = memory["full attention, 1 process"][0]
display(Markdown(
    f"Full attention keeps {full_kept[-1] / full_kept[-2]:.1f} times more when the sequence doubles: it keeps "
    "seq x seq tensors. Ring attention keeps only q, k, v, the output and the log-sum-exp, which grow with the "
    f"sequence, and on 2 processes each keeps half: {format_bytes(each_kept[-1])} instead of "
    f"{format_bytes(alone_kept[-1])} at {MEMORY_SEQ_LENS[-1]} tokens. (That the ring keeps so little against full "
    "attention comes from recomputing, as FlashAttention does; what context parallelism adds is the division by "
    "*N*.) The peak is set by one block's scores, chunk x chunk: with 2 processes a quarter of the block of one, "
    f"{each_peak[-1] / alone_peak[-1]:.2f} times the one-process peak here at {MEMORY_SEQ_LENS[-1]} tokens (the "
    "merge and the messages add a little). On a GPU, a flash kernel computes each block in tiles too, so the peak "
    "no longer grows as the square of the chunk (FlashAttention: memory linear in the sequence length, Dao et al. "
    "2022)."
))

# %% [markdown]
# ## 5. Expert parallelism
#
# A *mixture-of-experts* (MoE) layer replaces a block's MLP by *E* smaller MLPs, the
# **experts**, and a **router**: a linear layer that scores each token against every
# expert. Each token goes to its best expert only (top-1, as the Switch Transformer
# routes, Fedus et al. 2021), and the expert's output is scaled by the router's
# probability for it, which is what gives the router a gradient. The parameters grow
# with *E*, the compute per token does not.
#
# Under *expert parallelism* each of *N* processes holds *E/N* of the experts and
# its own share of the tokens. Every token must travel to the process of its expert
# and back: two **all-to-alls**. Before the first, each process sorts its tokens by
# destination and tells every other how many it will send (a small all-to-all of
# counts), since nobody can know in advance how many tokens it will receive: the
# router decides. The layer here, `course_utils/experts.py`, has 4 experts on 2
# processes and calls `torch.distributed.all_to_all_single`, on gloo.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import inspect

from IPython.display import Markdown, display

from course_utils import experts, launcher
from course_utils.plots import experts as expert_plots

launcher.silence_library_progress_bars()
LAUNCH_TIMEOUT_S = 120  # a worker stuck in an all-to-all whose partner died is stopped past this
SEEDS = (0, 1, 2)

layer = experts.make_moe(4)
one_expert = sum(p.numel() for p in layer.experts[0].parameters())
print(f"4 experts and a router: {sum(p.numel() for p in layer.parameters()):,} parameters; each token runs the "
      f"router and one expert: {one_expert + sum(p.numel() for p in layer.router.parameters()):,} of them")

# %% [markdown]
# How each process sorts its tokens for the first all-to-all:

# %%
print(inspect.getsource(experts.dispatch))

# %% [markdown]
# The layer over the processes: route, sort by destination, exchange the counts,
# send the tokens (the first all-to-all), run the experts held here, send the
# results back (the second), put them back in the tokens' order. The backward pass
# of an all-to-all is the all-to-all the other way (the splits swapped): the
# gradients go back the way the tokens came.

# %%
print(inspect.getsource(experts.expert_parallel_moe))

# %% [markdown]
# Two processes each hold 2 of the 4 experts and 64 tokens of a 128-token batch. For
# three seeds, each compares its outputs, its own experts' gradients and the
# router's (replicated, so its gradients are summed over the processes) with the
# one-process layer on the whole batch. The same launch then routes seed 0's batch
# with routers that prefer expert 0 more and more (`skew`, added to the router's bias
# for expert 0), and each process counts the tokens its experts computed.

# %%
SKEWS = (0.0, 1.0, 2.0)
ep_runs = launcher.launch(experts.expert_parallel_run, (SEEDS, SKEWS), num_processes=2, timeout=LAUNCH_TIMEOUT_S)

# %% tags=["nbval-check-output"]
for run in ep_runs:
    print(f"process {run.rank} holds experts {list(run.experts)}: outputs within 1e-5 of one process: "
          f"{max(run.output_errors.values()) < 1e-5}; gradients within 1e-5: {max(run.gradient_errors.values()) < 1e-5}; "
          f"tokens that reached the wrong process: {sum(run.misrouted.values())}")

# %%
for run in ep_runs:
    print(f"process {run.rank}: largest output difference {max(run.output_errors.values()):.1e}, "
          f"largest gradient difference {max(run.gradient_errors.values()):.1e}")

# %% [markdown]
# ### Load imbalance
#
# The router decides how many tokens each expert, and so each process, computes.
# A process whose experts are popular computes more while the others wait at the
# second all-to-all; its memory for the received tokens grows too.

# %% tags=["nbval-check-output"]
print(f"{'router':<10}" + "".join(f"{f'process {run.rank} (experts {list(run.experts)})':>30}" for run in ep_runs)
      + f"{'busiest / mean':>16}{'balance loss':>14}")
imbalance = {}
for skew in SKEWS:
    loads = [sum(run.received[skew]) for run in ep_runs]
    imbalance[skew] = max(loads) / (sum(loads) / len(loads))
    print(f"{f'skew {skew:g}':<10}" + "".join(f"{str(run.received[skew]):>30}" for run in ep_runs)
          + f"{imbalance[skew]:>16.2f}{ep_runs[0].balance_loss[skew]:>14.3f}")

# %%
expert_plots.plot_tokens_per_expert({f"skew {skew:g}": [run.received[skew] for run in ep_runs] for skew in SKEWS});

# %%
display(Markdown(
    f"Even with the router as drawn, the tokens do not split evenly: the busiest process computes "
    f"{imbalance[SKEWS[0]]:.2f} times the mean; with a router that prefers expert 0 (skew {SKEWS[-1]:g}), "
    f"{imbalance[SKEWS[-1]]:.2f} times: the other process mostly waits. Training counters it with an auxiliary "
    "loss (the Switch Transformer's *E* x sum of *f<sub>i</sub> P<sub>i</sub>*, the share of tokens times the mean "
    f"router probability per expert: 1 when both are even; here {ep_runs[0].balance_loss[SKEWS[0]]:.3f} and "
    f"{ep_runs[0].balance_loss[SKEWS[-1]]:.3f}), and with a *capacity*: each expert computes at most a fixed number "
    "of tokens per batch and the rest skip it (Fedus et al. 2021), so that every process's buffers and time are "
    "bounded."
))

# %% [markdown]
# ## Exercises: context and expert parallelism
#
# `ex.qN.check()` checks your answer, `ex.qN.hint()` gives a hint (call it again
# for the next one), `ex.qN.solution()` shows the solution. Each check first tries
# your function on small cases here, then launches the ring or the expert-parallel
# layer with it and compares with one process.

# %%
import torch

from course_utils.exercises import ____
from course_utils.exercises import lesson9_cp_ep as ex

# %% [markdown]
# ### Exercise 1: merge two softmaxes
#
# `merge_softmaxes(out_a, lse_a, out_b, lse_b)` gets two parts of one query block's
# attention, each over its own keys: `out_x` shaped (heads, queries, d), normalised
# over that part's keys, and `lse_x` shaped (heads, queries), the log-sum-exp of its
# scores. Return `(out, lse)` over the keys of both parts. The check runs the ring
# of 3 processes with your function at every step.

# %%
def merge_softmaxes(out_a, lse_a, out_b, lse_b):
    # BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
    return out, lse
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2: the causal mask across ring steps
#
# `ring_mask(query_positions, key_positions)` gets the positions, in the whole
# sequence, of a process's queries and of the keys of the chunk it holds at one
# ring step (1-D int tensors). Return the (queries x keys) bool tensor that is True
# where a causal model's query may see the key. The check runs the causal ring of 2
# processes with it.

# %%
def ring_mask(query_positions, key_positions):
    # BEGIN SOLUTION
    return key_positions[None, :] <= query_positions[:, None]
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ### Exercise 3: send each token to its expert's process
#
# `dispatch_tokens(expert_ids, experts_per_process, world_size)` gets each token's
# expert (a 1-D int tensor). Process *r* holds experts *r* x `experts_per_process`
# to (*r* + 1) x `experts_per_process` - 1. Return `(order, counts)`: the token
# indices in the order `all_to_all_single` must send them, and how many tokens go to
# each process, one int per process. The check runs the expert-parallel layer on 2
# processes with it.

# %%
def dispatch_tokens(expert_ids, experts_per_process, world_size):
    # BEGIN SOLUTION
    destinations = expert_ids // experts_per_process
    order = torch.argsort(destinations)
    counts = torch.bincount(destinations, minlength=world_size).tolist()
    return order, counts
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()
