# %% [markdown]
# # Lesson 7 — When one device is not enough: ZeRO and FSDP, run on CPU processes
#
# Lesson 4 ended with models whose training step fits on no single GPU, and lesson 6
# showed data parallelism, where every process holds a **full copy** of the
# training state: parameters, gradients, optimizer state. Adding processes then
# adds compute but not memory. *Sharded* data parallelism cuts that state into
# *N* pieces, one per process. The field's names for it are ZeRO stages 1 to 3
# (from DeepSpeed's "Zero Redundancy Optimizer") and FSDP (PyTorch's Fully Sharded
# Data Parallel).
#
# In this lesson you will
#
# 1. measure what each of two processes holds under DDP, including the gradient
#    buckets that the usual "16 bytes per parameter" rule leaves out,
# 2. run ZeRO-1 (`ZeroRedundancyOptimizer`), ZeRO-2 and ZeRO-3 (FSDP2's
#    `fully_shard`) for real on two processes, then on three, and check that each
#    trains the same model as one process,
# 3. see what sharding does **not** divide: activations, the block gathered at the
#    peak, the all-gather buffers, the optimizer's scalars,
# 4. plan one process's memory under sharding on fake tensors, part for part to the byte of
#    the real run, and draw memory per GPU for models from 1B to 405B on up to
#    512 GPUs, and search the fewest GPUs that hold 70B,
# 5. count the bytes each process hands to the collectives under each strategy,
# 6. meet the traps of doing this with Accelerate on a CPU, and the configuration
#    a GPU user writes,
# 7. train in bf16 under sharding, and meet the trap of autocast with `fully_shard`,
# 8. offload the sharded state to host memory and run the optimizer step there,
# 9. save a sharded checkpoint on two processes and resume it on three,
# 10. build a model too big for one process on the meta device, shard it, and
#     load its weights shard by shard,
# 11. turn the bytes each process communicates into seconds on named links,
# 12. practise with two exercises checked against launched runs.
#
# Everything runs on a laptop CPU, on processes that talk over *gloo*, and the
# same calls run on GPUs over NCCL; where a number is this CPU's, the lesson says
# what differs on CUDA.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset, so that every run takes seconds. With internet, the
# model line becomes `models.load_pretrained_classifier("distilbert-base-cased")`
# and the data line `load_dataset("glue", "mrpc")`, as lesson 1 shows.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import torch
from IPython.display import Markdown, display

from course_utils import command_line, launcher, models, parallel, sharding
from course_utils.exercises import ____
from course_utils.exercises import lesson7 as ex
from course_utils.plots.sharding import plot_held_per_process
from course_utils.units import format_bytes

launcher.silence_library_progress_bars()
# Every launch below takes seconds; a worker stuck (in a collective whose partner died, say) would hang
# the cell for good: past this limit the launcher stops every worker and raises WorkerTimeout, saying so.
LAUNCH_TIMEOUT_S = 120
# Loaded once here: every launch below forks this process, and its workers find the
# model and the tokenized batches already in memory.
sharding.prepare()
num_parameters = models.count_parameters(sharding.course_model())
print(f"the tiny DistilBERT has {num_parameters:,} parameters, {format_bytes(4 * num_parameters)} in fp32")

# %% [markdown]
# ## 1. What each process holds under DDP
#
# `sharding.train_with_strategy(strategy)` is the function every worker runs. It
# joins the process group over gloo, wraps the model as the strategy says, trains
# three steps of AdamW (each process on its own equal share of every batch), and
# measures, **inside the process**, the storage it holds: its parameters, its
# gradients after the backward pass, its optimizer state after the step, DDP's
# gradient buckets, and the activations the forward pass saved (torch's
# `MemTracker`). Here is how it wraps the model for each strategy: it reads the
# strategy as a `layouts.Layout` (a strategy on a number of processes) and hands
# it to `layouts.apply_layout`, the one function that lays a model out, which
# section 4's planner calls too:

# %%
import inspect

from course_utils import layouts

print(inspect.getsource(sharding.wrap_for_strategy))
print(inspect.getsource(layouts.apply_layout))

# %% [markdown]
# First the reference: the same model trained alone on the whole batches, then DDP on two processes.

# %%
one_process = parallel.launch(sharding.train_one_process, num_processes=1, quiet=True,
                              timeout=LAUNCH_TIMEOUT_S)[0]
runs = {}
runs["ddp", 2] = parallel.launch(sharding.train_with_strategy, ("ddp",), num_processes=2, timeout=LAUNCH_TIMEOUT_S)


def table(processes):
    """Print one line per process: what it held, in bytes."""
    names = list(processes[0].held())
    print(f"{'rank':>4}  " + "  ".join(f"{name:>15}" for name in names))
    for process in processes:
        print(f"{process.rank:>4}  " + "  ".join(f"{value:>15,}" for value in process.held().values()))


table(runs["ddp", 2])

# %% tags=["nbval-check-output"]
ddp = runs["ddp", 2][0]
print(f"parameters:      {ddp.parameters / num_parameters:g} bytes per parameter")
print(f"gradients:       {ddp.gradients / num_parameters:g} bytes per parameter")
print(f"optimizer state: {(ddp.optimizer_state - ddp.optimizer_scalars) / num_parameters:g} bytes per parameter "
      f"+ {ddp.optimizer_scalars} bytes of step counters")
print(f"DDP buckets:     {ddp.buckets / num_parameters:g} bytes per parameter")

# %%
state_per_parameter = (ddp.parameters + ddp.gradients + ddp.optimizer_state - ddp.optimizer_scalars) / num_parameters
display(Markdown(
    f"Every process holds the whole state: {ddp.parameters / num_parameters:g} bytes per parameter of fp32 "
    f"weights, {ddp.gradients / num_parameters:g} of gradients, "
    f"{(ddp.optimizer_state - ddp.optimizer_scalars) / num_parameters:g} of AdamW's two moments: the "
    f"\"{state_per_parameter:g} bytes per parameter\" rule. DDP adds its **gradient buckets**: to all-reduce the "
    "gradients in a few large messages instead of one per tensor, it copies them into flat buckets, allocated once "
    "when the model is wrapped and kept for the whole training: a second copy of the gradients (with "
    "`DistributedDataParallel(..., gradient_as_bucket_view=True)` the gradients are views into the buckets, and the "
    f"copy goes). The rule leaves it out: per process, DDP holds "
    f"{state_per_parameter + ddp.buckets / num_parameters:g} bytes per parameter before any activation."
))

# %% [markdown]
# ## 2. ZeRO-1, ZeRO-2 and ZeRO-3 / FSDP, on two processes
#
# - **ZeRO-1** shards the optimizer state. torch's `ZeroRedundancyOptimizer` gives each
#   process the state of some of the parameter tensors (assigned greedily, whole
#   tensors, to balance the bytes); each updates its own tensors and broadcasts
#   them. Gradients are still all-reduced by DDP, whole (the ZeRO paper and
#   DeepSpeed reduce-scatter them instead: section 5 counts both).
# - **ZeRO-2** shards the gradients too: each process keeps only the averaged
#   gradients of its own shard (a *reduce-scatter* instead of an all-reduce).
#   With FSDP2 that is `fully_shard(..., reshard_after_forward=False)`: the
#   parameters, gathered for the forward pass, stay whole until the backward pass
#   is done.
# - **ZeRO-3 / FSDP** shards the parameters as well: `fully_shard` on each block,
#   then on the root; each block's parameters are all-gathered just before it runs
#   and freed again just after, in the forward and in the backward pass.

# %%
for strategy in ("zero1", "zero2", "zero3"):
    runs[strategy, 2] = parallel.launch(sharding.train_with_strategy, (strategy,), num_processes=2, quiet=True,
                                        timeout=LAUNCH_TIMEOUT_S)
    print(sharding.STRATEGY_NAMES[strategy])
    table(runs[strategy, 2])

# %%
plot_held_per_process({sharding.STRATEGY_NAMES[s].split(" (")[0] + ", 2 processes": runs[s, 2]
                       for s in ("ddp", "zero1", "zero2", "zero3")});

# %% [markdown]
# The bars shrink stage by stage: the optimizer state halves under ZeRO-1 (not
# exactly: whole tensors are assigned to processes); under FSDP2 the gradients
# halve and DDP's buckets go. Between steps FSDP2 holds only its shard of the
# parameters under both settings: `reshard_after_forward=False` keeps them whole
# only from the forward pass to the end of the backward pass (DeepSpeed's ZeRO-2
# keeps them whole throughout), so ZeRO-2 and ZeRO-3 differ here at the peak,
# which section 3 shows, not between steps. The grey part, the activations, does
# not move.
#
# ### Each run trains the same model as one process
#
# Sharding changes where the state lives, not the arithmetic: every run must end
# with the parameters that one process reaches on the whole batches.

# %% tags=["nbval-check-output"]
def same_training(processes, tolerance=1e-5):
    """Return (the largest parameter difference from one process, whether the losses agree)."""
    gap = parallel.max_parameter_difference(one_process["final_parameters"], processes[0].final_parameters,
                                            skip=parallel.NOISE_ONLY_PARAMETERS)
    losses_agree = all(abs(a - b) <= tolerance for a, b in zip(processes[0].losses, one_process["losses"]))
    return gap, losses_agree


gaps = {}
for strategy in sharding.STRATEGIES:
    gaps[strategy, 2], losses_agree = same_training(runs[strategy, 2])
    print(f"{sharding.STRATEGY_NAMES[strategy]:<52} on 2: same losses as one process: {losses_agree}; "
          f"parameters within 1e-5: {gaps[strategy, 2] <= 1e-5}")

# %%
for strategy in sharding.STRATEGIES:
    print(f"{sharding.STRATEGY_NAMES[strategy]}: largest parameter difference from one process {gaps[strategy, 2]:.1e}")

# %% [markdown]
# The differences are rounding: two processes add their gradients in another
# order than one process does. (As in lesson 6, the attention key biases, whose
# gradient is only rounding noise, are left out of the comparison.)
#
# ### Three processes: padding
#
# FSDP2 cuts every parameter along its first dimension into *N* equal pieces. When
# the rows do not divide by *N*, it pads the last pieces: with three processes
# (more processes than this machine may have cores: the point here is how the
# state divides, not speed), each holds a little more than a third.

# %%
for strategy in ("zero1", "zero3"):
    runs[strategy, 3] = parallel.launch(sharding.train_with_strategy, (strategy,), num_processes=3,
                                        quiet=True, oversubscribe=True, timeout=LAUNCH_TIMEOUT_S)
    gaps[strategy, 3] = same_training(runs[strategy, 3])[0]
    print(sharding.STRATEGY_NAMES[strategy])
    table(runs[strategy, 3])

# %% tags=["nbval-check-output"]
zero3 = runs["zero3", 3]
held_parameters = sum(process.parameters for process in zero3) // 4
print(f"three ZeRO-3 processes hold {held_parameters:,} parameter elements between them, "
      f"for {num_parameters:,} parameters: {held_parameters - num_parameters:,} elements of padding")
print(f"ZeRO-1 on three: optimizer state per process {[p.optimizer_state for p in runs['zero1', 3]]} bytes "
      f"(whole tensors per process, not exact thirds)")
print(f"both train the same model as one process: {gaps['zero1', 3] <= 1e-5 and gaps['zero3', 3] <= 1e-5}")

# %% [markdown]
# ## 3. What sharding does not divide
#
# Between steps, ZeRO-3 holds 1/N of everything. The **peak** of a step is another
# matter. `FSDPMemTracker`, the FSDP-aware version of the tracker, splits the peak
# of the last step into the sharded state, the parameters gathered at that moment,
# the all-gather buffers and the activations:

# %%
def peak_table(keys):
    for key in keys:
        process = runs[key][0]
        parts = ", ".join(f"{name} {format_bytes(value)}" for name, value in process.peak_by_category.items() if value)
        print(f"{sharding.STRATEGY_NAMES[key[0]].split(' (')[0]} on {key[1]}: peak {format_bytes(process.peak)} = {parts}")


peak_table([("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("zero3", 3)])

# %%
activations = {key: processes[0].activations for key, processes in runs.items() if key[1] == 2}
print(f"activations saved by one process's forward pass, same under every strategy: {len(set(activations.values())) == 1}")
zero2_gathered = runs["zero2", 2][0].peak_by_category["Unsharded Param"]
zero3_gathered = runs["zero3", 2][0].peak_by_category["Unsharded Param"]
print(f"at the peak, ZeRO-2 holds gathered parameters for {zero2_gathered / 4 / num_parameters:.0%} of the model, "
      f"ZeRO-3 for {zero3_gathered / 4 / num_parameters:.0%}")
print(f"AdamW's step counters per process (not sharded): "
      f"{sorted({p.optimizer_scalars for processes in runs.values() for p in processes})} bytes")

# %% [markdown]
# Why does the table show only a few bytes of activations at DDP's and ZeRO-1's
# peak, and about a megabyte at ZeRO-2's and ZeRO-3's, when the forward pass saved
# the same activations under every strategy? Each process also recorded the peak
# of its forward and backward passes alone, before the optimizer step:

# %%
for key in [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2)]:
    process = runs[key][0]
    where = "the optimizer step" if process.peak > process.passes_peak else "the forward or backward pass"
    print(f"{sharding.STRATEGY_NAMES[key[0]].split(' (')[0]:<14}: peak in {where:<28} "
          f"(step {process.peak:,} B, passes {process.passes_peak:,} B); activations at the "
          f"peak {format_bytes(process.peak_by_category.get('Activation', 0))}, "
          f"after the forward pass {format_bytes(process.activations)}")

# %% tags=["nbval-check-output"]
in_the_step = {strategy: runs[strategy, 2][0].peak > runs[strategy, 2][0].passes_peak for strategy in sharding.STRATEGIES}
print(f"DDP and ZeRO-1 peak in the optimizer step: {in_the_step['ddp'] and in_the_step['zero1']}; "
      f"ZeRO-2 and ZeRO-3 in the forward or backward pass: {not in_the_step['zero2'] and not in_the_step['zero3']}")

# %%
ddp_peak, zero3_peak = runs["ddp", 2][0], runs["zero3", 2][0]
display(Markdown(
    "Not a tracker's artefact: both trackers filed the same activations after the forward pass "
    f"({format_bytes(ddp_peak.activations)}). The peaks fall in different phases. Under DDP and ZeRO-1 every "
    "process holds the whole parameters and gradients, so the optimizer step, where those meet the optimizer state "
    f"and AdamW's temporaries, is the highest moment ({ddp_peak.peak - ddp_peak.passes_peak:,} B above the "
    f"passes' peak under DDP); by then the backward pass has freed the activations it "
    f"used, and {format_bytes(ddp_peak.peak_by_category.get('Activation', 0))} are left. Under ZeRO-2 and ZeRO-3 "
    f"the state is halved, the optimizer step falls below the backward pass, and the peak "
    f"({format_bytes(zero3_peak.peak)} for ZeRO-3) is taken while the activations are alive."
))

# %% [markdown]
# - **Activations** belong to each process's share of the batch, not to the
#   model: sharding the state does not touch them (activation checkpointing and
#   smaller micro-batches do, lesson 5; tensor, sequence and context
#   parallelism divide them between processes, lesson 9).
# - **The unit gathered at the peak.** With `reshard_after_forward=False`
#   (ZeRO-2), the gathered parameters stay whole from the forward pass to the end
#   of the backward pass; with `True` (ZeRO-3), only the blocks being computed
#   are whole at any moment, plus the root's own parameters (here the embeddings
#   and the classifier, the largest unit of this tiny model). The finer the
#   units, the smaller this part, but it never shrinks with *N*.
# - **All-gather and reduce-scatter buffers**: the flat messages FSDP gathers
#   into; one unit's size, again independent of *N*.
# - **Optimizer scalars**: AdamW keeps a 0-d `step` counter per parameter tensor
#   it updates. FSDP2 keeps one per tensor on every process (every process holds
#   a piece of every tensor), ZeRO-1 only for the tensors a process owns.
#
# On this tiny model the activations dominate and the per-unit parts are large
# next to the shards, so ZeRO-3's peak falls much less than its state. On a model
# of billions of parameters the state is far larger than one block, and the
# division pays off, until *N* is so large that what does not divide dominates again.
#
# **Which instrument?** torch's `MemTracker` and `FSDPMemTracker` are dispatch
# modes: they see every tensor that torch operations create *in the thread that
# runs the step*. On CPU, gloo runs its collectives on worker threads of its own,
# and what it allocates there is outside their view;
# `torch.profiler.profile(profile_memory=True)` records the allocator's total on
# every thread (section 4 measures the three instruments side by side). On CUDA,
# `torch.cuda.max_memory_allocated()` counts every tensor on the device whatever
# thread made it, and NCCL's own buffers are outside
# the caching allocator altogether: that is the instrument that carries over to GPUs.

# %% [markdown]
# ## 4. The planner per process
#
# Lesson 4's planner runs a training step on fake tensors. Given
# `world_size=N` and `sharding="zero2"` or `"zero3"` (also `"fsdp"`), it plans
# **one** of *N* processes, `rank=` (0 unless you say): it creates a *fake*
# process group of *N* processes inside this one (every collective returns at
# once, nothing is sent), joins it as that process, lays a meta copy of the
# model out with `layouts.apply_layout`, the function the workers above call
# (`fully_shard` on each block, then the root), and runs the step on
# fake tensors under `FSDPMemTracker`. This is the recipe of torchtitan's
# `scripts/estimate/estimation.py`. With `sharding="zero1"` every process runs
# one process's forward and backward passes under DDP, and only the optimizer
# differs: the planner builds a real `ZeroRedundancyOptimizer` on fake copies of
# the parameters, in the fake group, so that torch itself decides which tensors'
# state the process holds, and follows its step (the broadcasts write into the
# parameters in place). `batch_size` is per process. Planned here, then measured
# in two launched processes running the same step (3 sequences of 32 tokens each,
# AdamW); under ZeRO-1 the two processes hold different tensors' state, so both
# are planned and compared:

# %%
from course_utils import memory

plans, measured = {}, {}
for strategy in ("ddp", "zero1", "zero2", "zero3"):
    ranks = (0, 1) if strategy == "zero1" else (0,)
    plans[strategy] = [memory.estimate_training_memory(sharding.course_model(), "adamw", 3, 32, world_size=2,
                                                       sharding=strategy, rank=rank) for rank in ranks]
    measured[strategy] = parallel.launch(sharding.measure_planned_step, (strategy, 3, 32), num_processes=2,
                                         quiet=True, timeout=LAUNCH_TIMEOUT_S)
    for name in ("weights", "gradients", "optimizer_state", "activations", "peak"):
        for rank, plan in zip(ranks, plans[strategy]):
            print(f"{strategy} {name:>16}: process {rank} planned {getattr(plan, name):>10,} B, "
                  f"measured {getattr(measured[strategy][rank], name):>10,} B")

# %% tags=["nbval-check-output"]
unit = sharding.largest_unit_bytes(sharding.course_model(), world_size=2)
for strategy in plans:
    slack = unit if strategy in ("zero2", "zero3") else 0  # FSDP's all-gathers run on gloo's thread
    agree = [sharding.agrees_with_plan(plan, measured[strategy][rank], slack) for rank, plan in enumerate(plans[strategy])]
    which = "processes 0 and 1" if len(agree) > 1 else "process 0"
    print(f"{strategy}: every part equal to the measurement of {which}, each peak at most {slack:,} B above the plan: "
          f"{all(agree)}")
zero1_states = [plan.optimizer_state for plan in plans["zero1"]]
print(f"ZeRO-1: the two processes hold different optimizer state ({zero1_states[0]:,} B and {zero1_states[1]:,} B), "
      f"together DDP's: {sum(zero1_states) == plans['ddp'][0].optimizer_state}")

# %% [markdown]
# The plan matches the tracker to the byte in every part, and so does the peak
# under DDP and ZeRO-1. Under FSDP (ZeRO-2, ZeRO-3) the peak too, in most runs; but when
# gloo's thread finishes an all-gather early, a real process can hold that
# unit's gathered parameters at the peak as well (at most the largest unit,
# printed above): a timing the fake process group, whose collectives return at
# once, never has.
# (Process 1 can hold a few bytes less: the padding of dim 0 falls on the last
# processes.) DDP needs no fake process
# group: every process runs one process's step, plus the gradient buckets of
# section 1, held at every moment of the step. ZeRO-1 is that step with the
# optimizer state of the process's own tensors only, and the optimizer step's
# working memory for those tensors: its broadcasts write into the parameters in
# place and allocate nothing in the step's thread (what gloo allocates on its own
# threads, the next part measures), so its peak is exact too.

# %% [markdown]
# ### The third instrument: the allocator's total
#
# The plan equals the tracker, and both see only the tensors that torch operations
# create in the thread running the step. The allocator sees every allocation,
# whichever thread makes it: `torch.profiler.profile(profile_memory=True)` records
# each one with the allocator's running total. `sharding.measure_planned_step_rise`
# runs the same ZeRO-3 step under the tracker and the profiler at once, in two
# launched processes, and returns how far each saw memory rise during the step:

# %%
rises = parallel.launch(sharding.measure_planned_step_rise, ("zero3", 3, 32), num_processes=2, quiet=True,
                        timeout=LAUNCH_TIMEOUT_S)
for rank, rise in enumerate(rises):
    print(f"process {rank}: tracker {rise['tracker_rise']:>9,} B, allocator {rise['allocator_rise']:>9,} B "
          f"(+{rise['allocator_rise'] - rise['tracker_rise']:,} B, "
          f"{(rise['allocator_rise'] - rise['tracker_rise']) / rise['tracker_rise']:+.1%}), "
          f"allocations on {rise['allocating_threads']} threads")

# %% tags=["nbval-check-output"]
print("the allocator rose at least as far as the tracker saw (to within 1 %), on every process: "
      f"{all(rise['allocator_rise'] >= 0.99 * rise['tracker_rise'] for rise in rises)}; "
      f"allocations came from more than the step's own thread: {all(r['allocating_threads'] > 1 for r in rises)}")

# %% [markdown]
# The difference is gloo's: its threads allocate the buffers of the collectives,
# and by how much depends on when they run, so it changes from run to run (that is
# why the planner, which follows one thread, cannot plan it). The two instruments
# also start counting at slightly different moments, so a run where gloo's
# buffers happen to be freed before the peak can show the allocator a few bytes
# *below* the tracker: hence "to within 1 %". On CUDA the
# instrument of this kind is `torch.cuda.max_memory_allocated()`: the caching
# allocator's total, whatever thread allocated, and the one that carries over to
# GPUs. NCCL's own buffers are outside even that, and the caching allocator
# reserves more than it hands out (`torch.cuda.memory_reserved()`).

# %% [markdown]
# ### Memory per GPU, from 1B to 405B parameters
#
# The question you came with: how much memory does **one** GPU need to train a
# model of a given size on *N* GPUs, and where does a 70B model fit? The same call
# answers it for full-size models built on the meta device (no weights):
# Llama-shaped causal LMs from their published configs, each alone on one process,
# under DDP, then under ZeRO-1, ZeRO-2 and ZeRO-3 on 8, 64 and 512 processes (process 0
# of each). One plan per
# model and set-up, a few seconds each, is more than this lesson's time, so they are **cached**:
# `tools/lesson7_sharding_plans.py` made them with `memory.estimate_training_memory`
# and wrote `lessons/cached/07_sharding_plans.json`. This notebook reads that file,
# and plans one of its points again, live, to show that the file is what the
# planner gives.

# %%
from course_utils import gpus, sharding_plans
from course_utils.plots.sharding import plot_memory_per_gpu

cached = sharding_plans.load_cached_plans()
figure_plans = cached["plans"]
live_point = ("TinyLlama-1.1B-shaped (GQA)", 8, "zero3")
live_plan = sharding_plans.replan(*live_point)
cached_plan = next(p for p in figure_plans if (p["model"], p["world_size"], p["sharding"]) == live_point)
for name in live_plan:
    print(f"{name:>16}: planned now {live_plan[name]!s:>15}, cached {cached_plan[name]!s:>15}")
print(f"the cache: {len(figure_plans)} plans made on torch {cached['torch']}; each step: {cached['step']} per process")

# %% tags=["nbval-check-output"]
print(f"{live_point[0]}, ZeRO-3 on {live_point[1]} processes, planned now equal to the cache in every field: "
      f"{all(live_plan[name] == cached_plan[name] for name in live_plan)}")

# %%
step_text = (f"fp32 weights, AdamW, {cached['step']['batch_size']} sequence of {cached['step']['seq_len']} tokens "
             "per GPU, no activation checkpointing")
plot_memory_per_gpu(figure_plans, gpus.figure_cards(), sharding_plans.rule_describes, step=step_text);

# %% [markdown]
# Each solid line is ZeRO-3 / FSDP on *N* GPUs, each dashed one ZeRO-2, each
# dash-dotted one with triangles ZeRO-1, the black
# one a single process, the purple one DDP (on any number of GPUs: each holds the
# whole state and the buckets); the dotted lines are the rule of thumb "16 bytes x P / N"
# (fp32 weights, gradients and AdamW's two moments, divided by *N*), and a red ring
# marks a ZeRO-3 point whose peak is more than twice the rule. The cards are drawn at
# the memory `nvidia-smi` reports for them. Where does 70B fit, and with what?

# %%
STRATEGY_LABELS = {"none": "one process", "ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3 / FSDP"}
SEVENTY_B = sharding_plans.SEVENTY_B
fits = sharding_plans.where_it_fits(figure_plans, SEVENTY_B)
for row in fits:
    print(f"{STRATEGY_LABELS[row['sharding']]:>14} on {row['world_size']:>3} GPU(s): {format_bytes(row['peak']):>11} "
          f"per GPU -> {row['card'] or 'none of the cards'}")

# %% [markdown]
# The figure's grid (8, 64, 512) answers "on which of these", not "on how few". What
# each process holds falls as *N* grows, so the fewest GPUs that hold 70B can be
# *searched*: `sharding_plans.fewest_processes` bisects over *N*, planning one
# process at each *N* it tries, until the largest *N* that does not fit and the
# smallest that does are neighbours. The script that wrote the cache ran it under
# ZeRO-3 for the lesson's step and three variants of it (activation checkpointing,
# lesson 5; the forward pass under bf16 autocast, as Accelerate's
# `mixed_precision="bf16"` runs it; the model built in bf16, weights, gradients and
# AdamW's moments all bf16):

# %%
fewest = cached["fewest"]
card_bytes = gpus.gpu_memory_bytes(fewest["card"])
for label, found in fewest["searches"].items():
    tried = ", ".join(f"{n}: {format_bytes(peak)}" for n, peak in found["tried"])
    answer = (f"{found['world_size']} GPUs ({format_bytes(found['peak'])} each)" if found["world_size"] else
              f"more than {max(n for n, _ in found['tried'])} GPUs")
    print(f"{label:<31} fewest {fewest['card']}s: {answer}\n{'':<33}planned per GPU on N = {tried}")

# %% [markdown]
# Planned again now, the fp32 search's answer and one GPU fewer, to check its last step:

# %% tags=["nbval-check-output"]
found = fewest["searches"]["fp32"]
at_fewest, one_fewer = (sharding_plans.replan(fewest["model"], n, "zero3")["peak"]
                        for n in (found["world_size"], found["world_size"] - 1))
print(f"{fewest['model']} in fp32, ZeRO-3: on the fewest GPUs the search found, the plan fits the "
      f"{fewest['card']}: {at_fewest <= card_bytes}; on one fewer it does not: {one_fewer > card_bytes}; "
      f"both equal to the cache: {dict(found['tried']).get(found['world_size'] - 1) in (None, one_fewer)} "
      f"and {at_fewest == found['peak']}")

# %%
answers = []
for strategy, label in STRATEGY_LABELS.items():
    holding = [row for row in fits if row["sharding"] == strategy and row["card"]]
    answers.append(f"{label}: on none of the cards, on any number of GPUs planned" if not holding else
                   f"{label}: on {', '.join(str(row['world_size']) for row in holding)} of the grid's GPUs")
searched = fewest["searches"]
seventy = {(p["world_size"], p["sharding"]): p for p in figure_plans if p["model"] == SEVENTY_B}
grid = sorted(n for n, s in seventy if s == "zero3")
largest = grid[-1]
top = seventy[largest, "zero3"]
describes = {n: [p["model"] for p in figure_plans if p["world_size"] == n and p["sharding"] == "zero3"
                 and sharding_plans.rule_describes(p)] for n in grid}


def fewest_text(label):
    found = searched[label]
    if found["world_size"] is None:
        return f"no number of GPUs up to {max(n for n, _ in found['tried'])}"
    return f"{found['world_size']} GPUs ({format_bytes(found['peak'])} each)"


display(Markdown(
    f"Where 70B ({seventy[1, 'none']['parameters'] / 1e9:.1f} billion parameters) fits, of the cards marked and the "
    f"{', '.join(str(n) for n in grid)} GPUs of the figure: " + "; ".join(answers) + ". "
    f"Searched, the fewest {fewest['card']}s that hold it under ZeRO-3 are {fewest_text('fp32')} in fp32; "
    f"{fewest_text('fp32, activation checkpointing')} with activation checkpointing; "
    f"{fewest_text('bf16 weights')} with the model built in bf16; and under bf16 autocast, "
    f"{fewest_text('bf16 autocast')}: autocast keeps a bf16 copy of every Linear weight, which does not divide "
    "by *N*, "
    "the trap section 7 measures. "
    f"ZeRO-1 and ZeRO-2 keep the whole fp32 weights on every GPU ({format_bytes(4 * top['parameters'])}; ZeRO-1 the "
    "whole gradients and DDP's buckets too), so no number of GPUs brings them down to a card. Under ZeRO-3 the rule "
    "\"16 bytes x P / N\" describes the peak only while the state is the largest part: it does on "
    + "; ".join(f"{n} GPUs for {', '.join(m.split('-shaped')[0] for m in models) or 'no model'}"
                for n, models in describes.items()) + ". "
    f"On {largest} GPUs, 70B's state is {format_bytes(top['weights'] + top['gradients'] + top['optimizer_state'])} "
    f"per GPU, but its peak is {format_bytes(top['peak'])} (in the {top['phase_of_peak']}): the activations of one "
    f"sequence ({format_bytes(top['activations'])}) do not divide, nor does the backward's working memory (the other "
    f"{format_bytes(top['peak'] - top['activations'] - top['weights'] - top['gradients'] - top['optimizer_state'])}: "
    "the block gathered while it runs, its gradients before they are reduce-scattered, temporaries, as section 3 "
    f"measured on the small model). So {largest // grid[1]}x more GPUs ({grid[1]} to {largest}) cut the "
    f"peak only from {format_bytes(seventy[grid[1], 'zero3']['peak'])} to {format_bytes(top['peak'])}; what "
    "cuts it further is what divides the activations: activation checkpointing (lesson 5), a shorter sequence, or "
    "tensor, sequence and context parallelism, which split each sequence's activations between GPUs (lesson 9)."
))

# %% [markdown]
# Which of these numbers are this CPU's? The plans follow the CPU's kernels in fp32
# (lesson 4's planner, whose note follows). On a GPU the attention kernel and the
# precision you choose change the activations, so the peaks where activations
# dominate (the ringed points) differ there, while the sharded state (the dotted
# lines) is the same bytes for the same dtype: plan your own set-up with the call
# above. And a card's total is not all free for tensors:

# %%
display(Markdown(f"> {memory.DEVICE_NOTE}\n>\n> {gpus.HEADROOM_NOTE}"))

# %% [markdown]
# ## 5. What each process communicates
#
# Sharding trades memory for messages. During the last step of every run above,
# each process counted the bytes it handed to each collective operation
# (`sharding.CollectiveCounter` wraps `torch.distributed`'s functions; DDP's
# buckets are sent through its default communication hook so that they pass
# through Python too). What is counted is the tensor each process hands in: for
# an all-gather, its own shard; for a reduce-scatter, its whole gradient.

# %% tags=["nbval-check-output"]
for key in [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("zero3", 3)]:
    counted = runs[key][0].communicated
    parts = ", ".join(f"{name} {value / (4 * num_parameters):.2f} x P" for name, value in sorted(counted.items()))
    print(f"{sharding.STRATEGY_NAMES[key[0]].split(' (')[0]:<14} on {key[1]}: {parts}")

# %% [markdown]
# In units of the model's fp32 size (*P* bytes, written `x P`):
#
# - DDP all-reduces every gradient once per step.
# - torch's `ZeroRedundancyOptimizer` (ZeRO-1 here) runs over DDP: the gradients
#   are all-reduced whole, as DDP does, then each process broadcasts the tensors it
#   updated to the others: one more model's worth of payload.
# - ZeRO-2 reduce-scatters the gradients (each process sends its whole gradient
#   in, gets back its averaged shard) and all-gathers the parameters once per step.
# - ZeRO-3 all-gathers them twice, once in the forward pass and again in the
#   backward pass (they were freed in between): the price of holding only a shard.
#
# These are the payloads handed to the collectives. What goes over the wire
# depends on the algorithm: with a ring (the ZeRO paper's count, Rajbhandari et
# al., 2020, section 7; one of NCCL's algorithms), an all-reduce of *S* bytes sends
# 2(*N*-1)/*N* x *S* per process, which is a reduce-scatter plus an all-gather,
# each (*N*-1)/*N* x *S*, and a broadcast of *S* bytes passes *N*-1 times between *N*
# processes. `sharding.ring_wire_bytes` turns each run's counted payloads into the
# bytes one process sends:

# %% tags=["nbval-check-output"]
wire = {key: sharding.ring_wire_bytes(runs[key][0].communicated, key[1])
        for key in [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("zero3", 3)]}
for key, sent in wire.items():
    print(f"{sharding.STRATEGY_NAMES[key[0]].split(' (')[0]:<14} on {key[1]}: {sent / (4 * num_parameters):.2f} x P "
          f"sent per process per step, {sent / wire['ddp', 2]:.2f} x DDP's")

# %%
display(Markdown(
    f"On two processes, ZeRO-2 sends {wire['zero2', 2] / wire['ddp', 2]:.2f} x what DDP sends and ZeRO-3 "
    f"{wire['zero3', 2] / wire['ddp', 2]:.2f} x, as the ZeRO paper computes (the same, and half as much again). torch's "
    f"`ZeroRedundancyOptimizer` sends {wire['zero1', 2] / wire['ddp', 2]:.2f} x DDP's: its all-reduce gives every "
    "process every averaged gradient, of which it uses only its own tensors', and the broadcasts come on top. "
    "That is torch's design, not ZeRO-1's: the paper and DeepSpeed's stage 1 reduce-scatter the gradients (each "
    "process receives the average of its own part only) and all-gather the updated parameters, the two collectives "
    "the ZeRO-2 run above counted, so ZeRO-1 as they run it sends what DDP sends "
    f"({wire['zero2', 2] / wire['ddp', 2]:.2f} x here); ZeRO-1 and ZeRO-2 differ in what each process *keeps* "
    "(under ZeRO-1 every process keeps its whole gradient until the step, under ZeRO-2 only its shard), not in what "
    "they send. On GPUs NCCL "
    "picks rings or trees, and gloo on CPUs has its own algorithms: these are the ring's counts, not gloo's."
))

# ### Synchronising less often: Accelerate's `LocalSGD`
#
# Another way to send less: skip the gradient all-reduce, let each process take
# its own steps, and average the *parameters* every *K* steps. Accelerate's
# `LocalSGD(accelerator=..., model=..., local_sgd_steps=K)` does that around the
# usual loop (one `local_sgd.step()` after each optimizer step; it averages once
# more when its block ends). `sharding.train_with_local_sgd` trains a fresh model
# for one epoch of the course data (batches of 16 per process, each process its
# own share) with DDP and with `LocalSGD` every 8 steps, over three shuffles of the
# data, and returns each final model's parameters and its loss on the whole
# validation set. The yardstick is the loss of a model that learnt nothing from
# the text: always predicting the training labels' frequencies.

# %%
LOCAL_SGD_STEPS, EPOCH_BATCHES, SEEDS = 8, 188, (0, 1, 2)
prior_loss = sharding.class_prior_loss()
local_sgd_runs = {
    label: parallel.launch(sharding.train_with_local_sgd, (k, EPOCH_BATCHES, 16, SEEDS), num_processes=2, quiet=True,
                           timeout=LAUNCH_TIMEOUT_S)[0]
    for label, k in (("DDP, gradients every step", None),
                     (f"LocalSGD, parameters every {LOCAL_SGD_STEPS} steps", LOCAL_SGD_STEPS))
}
print(f"always predicting the training labels' frequencies: validation loss {prior_loss:.4f}")
for label, results in local_sgd_runs.items():
    sent = results[0]["sent_per_step"]
    losses = [result["validation_loss"] for result in results]
    print(f"{label:<36}: {sent / (4 * num_parameters):.2f} x P sent per step per process; validation loss "
          f"{min(losses):.4f} to {max(losses):.4f} over {len(SEEDS)} shuffles (mean {sum(losses) / len(losses):.4f})")

# %% [markdown]
# Fewer messages, and a different training: between two averages the processes
# drift apart, each following its own batches. DDP trains the model one process
# trains (section 2); how far is LocalSGD's from it? Below, for each shuffle, the
# distance between the two final models, as a share of how far DDP's training moved
# the parameters from the pre-trained ones (0 % would be the same training; section
# 2's rounding differences are about a millionth of a parameter):

# %%
ddp_results, local_results = local_sgd_runs.values()
start = parallel.parameters_of(sharding.course_model())
drifts = [sharding.drift(local["final_parameters"], ddp["final_parameters"], start)
          for ddp, local in zip(ddp_results, local_results)]
largest = [parallel.max_parameter_difference(ddp["final_parameters"], local["final_parameters"],
                                             skip=parallel.NOISE_ONLY_PARAMETERS)
           for ddp, local in zip(ddp_results, local_results)]
print(f"LocalSGD's final model lies {min(drifts):.0%} to {max(drifts):.0%} of DDP's training away from DDP's "
      f"(largest parameter difference {min(largest):.1e} to {max(largest):.1e}), over {len(SEEDS)} shuffles")

# %% tags=["nbval-check-output"]
print(f"LocalSGD hands the collectives less per step than DDP: "
      f"{local_results[0]['sent_per_step'] < ddp_results[0]['sent_per_step']}")
print(f"every DDP run beat the labels' frequencies: {all(r['validation_loss'] < prior_loss for r in ddp_results)}")
print(f"on every shuffle LocalSGD ended more than 1 % of DDP's training away from DDP: {min(drifts) > 0.01}")

# %%
ddp_losses = [r["validation_loss"] for r in ddp_results]
local_losses = [r["validation_loss"] for r in local_results]
overlap = min(local_losses) <= max(ddp_losses) and min(ddp_losses) <= max(local_losses)
display(Markdown(
    f"The drift is no rounding: LocalSGD ends {min(drifts):.0%} to {max(drifts):.0%} of a whole training's "
    "distance away from the model DDP (and one process) trains. Whether that costs accuracy is what the losses "
    f"say, and after one epoch, where DDP's runs score {min(ddp_losses):.3f} to {max(ddp_losses):.3f} against the "
    f"labels' frequencies' {prior_loss:.3f}, LocalSGD's score {min(local_losses):.3f} to {max(local_losses):.3f}: "
    + ("the ranges of the shuffles overlap, so three shuffles of this short run cannot tell the two apart by "
       "their loss, though they train different models. " if overlap else
       f"the ranges of the shuffles do not overlap: {'LocalSGD' if max(local_losses) < min(ddp_losses) else 'DDP'} "
       "trains the better model here. ")
    + "On long runs, how far the copies drift, and what that does to the loss, decides whether the savings are "
    "worth it."
))

# ## 6. Accelerate on a CPU: three traps, reproduced
#
# With GPUs, you would not write `fully_shard` yourself: Accelerate's FSDP plugin
# (or DeepSpeed) does it inside `accelerator.prepare`. On a CPU it does not, and
# says nothing.
#
# **Trap 1: the FSDP plugin silently gives DDP.** Two workers create
# `Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))`
# and prepare the model:

# %% tags=["nbval-check-output"]
def prepare_with_fsdp_plugin():
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = accelerator.prepare(sharding.fresh_course_model())
    return accelerator.distributed_type.value, type(model).__name__, sharding.held_bytes(model.parameters())


for rank, (mode, wrapper, held) in enumerate(parallel.launch(prepare_with_fsdp_plugin, num_processes=2, quiet=True,
                                                             timeout=LAUNCH_TIMEOUT_S)):
    print(f"process {rank}: mode {mode}, model wrapped in {wrapper}, "
          f"holds {held / (4 * num_parameters):.0%} of the parameters")

# %% [markdown]
# Mode `MULTI_CPU`, a `DistributedDataParallel` wrapper, every parameter in every
# process: plain DDP. (Accelerate 1.15's `state.py` chooses `FSDP` only in its
# GPU branch.)
#
# **Trap 2: `accelerate launch --use_fsdp --cpu` is refused.**

# %% tags=["nbval-check-output"]
try:
    command_line.run_command("accelerate launch --use_fsdp --cpu --num_processes 2 -m course_utils.train --cpu")
except RuntimeError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# **Trap 3: a plain `Accelerator()` on a CPU gives independent processes.** As
# lesson 6 showed, each launched worker that creates `Accelerator()` without
# `cpu=True` finds no GPU and trains alone (and `--use_fsdp` without `--cpu`
# starts exactly that):

# %% tags=["nbval-check-output"]
def group_size_of_plain_accelerator():
    from accelerate import Accelerator

    accelerator = Accelerator()
    return accelerator.num_processes, accelerator.distributed_type.value


print(parallel.launch(group_size_of_plain_accelerator, num_processes=2, quiet=True, timeout=LAUNCH_TIMEOUT_S))

# %% [markdown]
# On a CPU, call torch directly, as this lesson does. On GPUs, the configuration
# that asks Accelerate for the same ZeRO-3 sharding (`accelerate config` writes
# it; Accelerate's FSDP guide documents every key) is:
#
# ```yaml
# distributed_type: FSDP
# num_processes: 8
# fsdp_config:
#   fsdp_version: 2
#   fsdp_reshard_after_forward: true          # false: ZeRO-2-like
#   fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP   # one unit per block, as fully_shard per block
#   fsdp_state_dict_type: SHARDED_STATE_DICT
# ```
#
# and with DeepSpeed (`distributed_type: DEEPSPEED`), the ZeRO stage is one key of
# its JSON configuration:
#
# ```json
# {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 8}
# ```
#
# Beside them, the torch calls this lesson ran, which are what the FSDP plugin
# makes on GPUs:
#
# ```python
# mesh = init_device_mesh("cuda", (world_size,))
# for block in model.model.layers:
#     fully_shard(block, mesh=mesh)
# fully_shard(model, mesh=mesh)
# ```

# %% [markdown]
# ## 7. Mixed precision under sharding
#
# The ZeRO paper counts mixed-precision training with Adam at 2 + 2 + 12 bytes per
# parameter: fp16 weights and gradients, and fp32 master weights with Adam's two
# moments, all of it divided by *N* under stage 3. With FSDP2 there are two ways
# to get bf16 arithmetic, and they hold different things:
#
# - **autocast** around the forward pass (what Accelerate's `mixed_precision="bf16"`
#   does, and what the planner follows): the parameters stay fp32, shards and
#   gathered units alike, and each operation casts its inputs to bf16 as it runs;
# - **`MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`**,
#   passed to every `fully_shard`: each shard stays fp32 (the master copy the
#   optimizer updates), each unit is *gathered* in bf16, and the gradients are
#   reduce-scattered in fp32.
#
# `train_with_strategy("zero3", ..., precision=...)` runs ZeRO-3 on two processes
# under autocast (with its weight cast cache, torch's default, and without it:
# `torch.autocast(..., cache_enabled=False)`) and under the policy; the fp32 run is
# section 2's. Besides what the earlier runs measured, each process counts the bf16
# copies of its parameters still alive when the forward pass ends:

# %%
precision_runs = {"fp32": runs["zero3", 2][0]}
for precision in ("autocast", "autocast, no cache", "policy"):
    precision_runs[precision] = parallel.launch(sharding.train_with_strategy, ("zero3", 3, 6, None, None, precision),
                                                num_processes=2, quiet=True, timeout=LAUNCH_TIMEOUT_S)[0]
print(f"{'ZeRO-3, 2 processes':<20}" + "".join(f"{name:>20}" for name in precision_runs))
rows = {
    "dtype gathered": lambda r: r.dtypes["gathered"],
    "shard + grad + Adam": lambda r: format_bytes(r.parameters + r.gradients + r.optimizer_state),
    "gathered at peak": lambda r: format_bytes(r.peak_by_category.get("Unsharded Param", 0)),
    "all-gathered": lambda r: format_bytes(r.communicated["all_gather_single"]),
    "reduce-scattered": lambda r: format_bytes(r.communicated["reduce_scatter_single"]),
    "activations": lambda r: format_bytes(r.activations),
    "param. casts alive": lambda r: format_bytes(r.parameter_casts),
    "peak": lambda r: format_bytes(r.peak),
}
for name, value in rows.items():
    print(f"{name:<20}" + "".join(f"{value(run):>20}" for run in precision_runs.values()))

# %% tags=["nbval-check-output"]
linear_weights = sum(module.weight.numel() for module in sharding.course_model().modules()
                     if isinstance(module, torch.nn.Linear))
fp32_run, autocast_run, uncached_run, policy_run = precision_runs.values()
print(f"under autocast, the bf16 casts alive after the forward pass are 2 bytes x every Linear weight of the model "
      f"({linear_weights:,} elements): {autocast_run.parameter_casts == 2 * linear_weights}; "
      f"without the cast cache too: {uncached_run.parameter_casts == 2 * linear_weights}")
print(f"under the policy: no cast alive: {policy_run.parameter_casts == 0}; units gathered in "
      f"{policy_run.dtypes['gathered']}, the all-gathers half of fp32's: "
      f"{2 * policy_run.communicated['all_gather_single'] == fp32_run.communicated['all_gather_single']}; "
      f"the reduce-scatters fp32's: "
      f"{policy_run.communicated['reduce_scatter_single'] == fp32_run.communicated['reduce_scatter_single']}")
print(f"shards, gradients and AdamW's moments stay fp32 under both: "
      f"{all(set(run.dtypes[k] for k in ('parameters', 'gradients', 'optimizer state')) == {'float32'} for run in (autocast_run, policy_run))}"
      f", the same bytes as in fp32: {len({(r.parameters, r.gradients, r.optimizer_state) for r in precision_runs.values()}) == 1}")

# %%
per_parameter = {name: policy_run.world_size * getattr(policy_run, name) / num_parameters
                 for name in ("parameters", "gradients", "optimizer_state")}
display(Markdown(
    "**The trap.** FSDP2 frees each unit's gathered parameters after its forward pass, and under autocast that "
    "frees the fp32 weights, not their bf16 casts: a matrix product saves its bf16 inputs for the backward pass, "
    f"so when the forward pass ends each process holds a bf16 copy of every Linear weight of the whole model "
    f"({format_bytes(autocast_run.parameter_casts)} here, 2 bytes x {linear_weights:,}), gathered, never divided "
    "by *N*. The weight cast cache is not what keeps them: with `cache_enabled=False` the same "
    f"{format_bytes(uncached_run.parameter_casts)} are alive; autograd holds them. The policy gathers each unit in "
    "bf16 and runs the blocks on those gathered parameters themselves, which FSDP frees after the unit and gathers "
    f"again in the backward pass: no cast is left, the all-gathers are half of fp32's (and the gathered unit at "
    f"the peak {format_bytes(policy_run.peak_by_category.get('Unsharded Param', 0))} against "
    f"{format_bytes(fp32_run.peak_by_category.get('Unsharded Param', 0))}), the "
    f"activations {format_bytes(policy_run.activations)} against autocast's {format_bytes(autocast_run.activations)}, "
    f"the peak {format_bytes(policy_run.peak)} against {format_bytes(autocast_run.peak)}. "
    "What each process holds between steps is the same under both: "
    f"{per_parameter['parameters']:.2f} + {per_parameter['gradients']:.2f} + {per_parameter['optimizer_state']:.2f} "
    "bytes per parameter x 1/*N* (fp32 shard, fp32 gradient shard, AdamW's two moments, measured here on *N* = 2), "
    "the paper's 16 bytes, split differently: FSDP2's fp32 shard *is* the master copy, so the bf16 weights and "
    "gradients the paper counts at 2 + 2 exist only for the unit being computed or reduced."
))

# %% [markdown]
# The planner follows the autocast step (as Accelerate runs it, on fake tensors); here
# it is planned for one of two processes and measured in a launched run of the same
# step, as in section 4:

# %% tags=["nbval-check-output"]
autocast_plan = memory.estimate_training_memory(sharding.course_model(), "adamw", 3, 32, world_size=2,
                                                sharding="zero3", mixed_precision="bf16")
autocast_measured = parallel.launch(sharding.measure_planned_step, ("zero3", 3, 32, "adamw", "bf16"),
                                    num_processes=2, quiet=True, timeout=LAUNCH_TIMEOUT_S)[0]
print(f"ZeRO-3 under bf16 autocast: every part planned equal to the measurement, the peak at most "
      f"{unit:,} B above: {sharding.agrees_with_plan(autocast_plan, autocast_measured, unit)}")

# %%
seventy_b_model = sharding_plans.build_model(SEVENTY_B)
seventy_linear = sum(module.weight.numel() for module in seventy_b_model.modules()
                     if isinstance(module, torch.nn.Linear))
autocast_most = searched["bf16 autocast"]["tried"][-1]
fp32_most = seventy[autocast_most[0], "zero3"]["peak"]
display(Markdown(
    f"For 70B the casts are 2 bytes x {seventy_linear / 1e9:.1f} billion Linear weights, "
    f"{format_bytes(2 * seventy_linear)} on every GPU whatever *N*: on {autocast_most[0]} GPUs the planner gives "
    f"{format_bytes(autocast_most[1])} per GPU under autocast against {format_bytes(fp32_most)} in fp32, which is "
    "why no number of GPUs holds it (section 4). Under the policy the gathered units are bf16 and the casts go."
))

# %% [markdown]
# On GPUs, Accelerate's FSDP plugin builds the policy from its `mixed_precision`
# (asked here in a launched process, so that this one holds no Accelerate state):

# %% tags=["nbval-check-output"]
def accelerate_fsdp_policy():
    from accelerate import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    return str(plugin.mixed_precision_policy)


print(parallel.launch(accelerate_fsdp_policy, num_processes=1, quiet=True, timeout=LAUNCH_TIMEOUT_S)[0])

# %% [markdown]
# Its default reduces the gradients in bf16; `reduce_dtype=torch.float32`, as above,
# keeps the reduction in fp32 (the policy's run reduce-scattered as many bytes as
# the fp32 run). Writing
# `fully_shard` yourself, pass the policy; wrapping the forward pass in
# `torch.autocast` alone is the trap.

# %% [markdown]
# ## 8. CPU offload: the state in host memory, the optimizer step on the CPU
#
# When even 1/N of the state does not fit on a GPU, FSDP2 can keep it in the
# host's memory: `fully_shard(..., offload_policy=CPUOffloadPolicy())` leaves each
# process's **sharded** parameters, their gradients and AdamW's state on the CPU,
# and `optimizer.step()` runs there. What then crosses between host and GPU each
# step (torch's `_fsdp_param.py` and `_fsdp_collectives.py`): before every
# all-gather, the unit's shard goes up; after every reduce-scatter, the process's
# gradient shard comes down. `offload.planned_offload_bytes` plans those bytes from
# the model's shapes; `offload.OffloadCopyCounter` counts the copies FSDP asks for
# in a real run, and the bytes they actually moved.
#
# One launch of two processes does two jobs: it trains with offload (this
# section) and trains and saves the checkpoints of section 9.

# %%
import tempfile
from pathlib import Path

from course_utils import comm_time, meta_init, offload, sharded_checkpoints

scratch = Path(tempfile.mkdtemp(prefix="lesson7-"))
checkpoint_dir, safetensors_file = scratch / "checkpoint", scratch / "model.safetensors"


def offload_then_save(directory, path):
    """In each of the launched processes: train with CPU offload, then train again and save checkpoints."""
    with sharding.gloo_group():
        return offload.train_with_offload(), sharded_checkpoints.train_and_save(directory, path)


two_jobs = parallel.launch(offload_then_save, (checkpoint_dir, safetensors_file), num_processes=2, quiet=True,
                           timeout=LAUNCH_TIMEOUT_S)
offloaded, saved = [job[0] for job in two_jobs], [job[1] for job in two_jobs]
offload_plans = [offload.planned_offload_bytes(sharding.course_model(), 2, rank) for rank in range(2)]
for rank, (run, plan) in enumerate(zip(offloaded, offload_plans)):
    print(f"process {rank}: host to device planned {plan['host_to_device']:,} B, counted "
          f"{run['counted']['host_to_device']:,} B; device to host planned {plan['device_to_host']:,} B, counted "
          f"{run['counted']['device_to_host']:,} B; bytes that really moved {run['moved']:,}; shards on {run['devices']}")

# %% tags=["nbval-check-output"]
print(f"every count equal to its plan, on both processes: "
      f"{all(run['counted'] == plan for run, plan in zip(offloaded, offload_plans))}")
offload_gap = parallel.max_parameter_difference(runs["zero3", 2][0].final_parameters, offloaded[0]["final_parameters"])
print(f"same parameters after 3 steps as ZeRO-3 without offload, to the bit: {offload_gap == 0}")
print(f"bytes the copies moved on this CPU: {sum(run['moved'] for run in offloaded)}")

# %%
shard_bytes_0 = 4 * num_parameters / 2
blocks_up = sum(meta_init.shard_bytes(p.shape, 4, 2, 0)[0] for block in sharding.sharded_blocks(sharding.course_model())
                for p in block.parameters())
display(Markdown(
    f"Per step, process 0 copies {offloaded[0]['counted']['host_to_device'] / shard_bytes_0:.2f} x its parameter shard up "
    f"(every unit's shard once for the forward pass, and the blocks' shards, {blocks_up / shard_bytes_0:.2f} x of it, once "
    "more for the backward pass: the root's shard is not copied up again) and "
    f"{offloaded[0]['counted']['device_to_host'] / shard_bytes_0:.2f} x down (its gradient rows). The plan equals the count, "
    "and the training is the one without offload, to the bit: offload moves where the state lives, not the "
    "arithmetic. What this run **cannot** show: on a CPU-only machine the \"device\" is the host, so every copy FSDP "
    f"asks for returns the tensor itself ({sum(run['moved'] for run in offloaded)} bytes moved) and takes no time. "
    "On a GPU the same copies cross PCIe, and the optimizer step runs at the CPU's speed; pinned host memory "
    "(`CPUOffloadPolicy(pin_memory=True)`, the default, which needs CUDA) lets the copies overlap with compute. "
    "ZeRO-Offload (Ren et al., 2021) moves less: it keeps the fp16 parameters on the GPU and sends only the fp16 "
    "gradients down and the updated parameters up."
))

# %% [markdown]
# On a GPU, for 70B in fp32 on 8 GPUs (the model of section 4), the same rule gives
# each GPU's traffic per step over its PCIe link (its bandwidth from NVIDIA's data
# sheet, beside it). This is arithmetic on sourced figures, not a measurement:

# %%
seventy_parameters = seventy[1, "none"]["parameters"]
pcie = "PCIe Gen5 x16, GPU to host"
up_70b, down_70b = 2 * 4 * seventy_parameters / 8, 4 * seventy_parameters / 8  # every unit gathered twice: an upper bound
offload_seconds = max(comm_time.seconds_on(pcie, up_70b), comm_time.seconds_on(pcie, down_70b))
step_tokens = cached["step"]["batch_size"] * cached["step"]["seq_len"]
peak_name = "H100 SXM, bf16 dense"
compute_70b = comm_time.compute_seconds_at_peak(seventy_parameters, step_tokens, peak_name)
print(f"70B on 8 GPUs with offload: {format_bytes(up_70b)} up and {format_bytes(down_70b)} down per GPU per step, "
      f"at least {offload_seconds:.2f} s on {pcie} ({comm_time.LINKS[pcie].value / 1e9:.0f} GB/s each way: "
      f"{comm_time.LINKS[pcie].source})")
print(f"the step's compute ({step_tokens} tokens per GPU) at the peak of an {peak_name}: at least {compute_70b:.3f} s "
      f"({comm_time.GPU_PEAKS[peak_name].source})")
print(f"tokens per GPU per step for that compute to last as long as the copies: "
      f"{offload_seconds / compute_70b * step_tokens:,.0f}")

# %% [markdown]
# ## 9. Sharded checkpoints: save on 2 processes, resume on 3
#
# A sharded model is saved sharded: `torch.distributed.checkpoint` (DCP) writes one
# file per process and a `.metadata` file that maps which slice of which tensor each
# file holds. The state dicts come from `torch.distributed.checkpoint.state_dict`:
# `get_model_state_dict(model)` and `get_optimizer_state_dict(model, optimizer)`
# (the optimizer's state keyed by parameter names, so that it survives a new
# sharding). The launch above trained 2 of the 3 steps of section 2 under ZeRO-3 on
# two processes and saved both:

# %%
print(inspect.getsource(sharded_checkpoints.save_sharded))
files = sharded_checkpoints.checkpoint_files(checkpoint_dir)
for name, size in files.items():
    print(f"{name:>14}: {size:>10,} B")

# %% [markdown]
# Loading reads the map: each process asks for the slices its own shards cover,
# whatever the number of processes that saved them. Three processes now build the
# model (section 10 says how), load the checkpoint, and take the third step. Two
# controls: the parameters right after loading, and a second model that loads the
# weights but not the optimizer state (a fresh AdamW):

# %%
def resume(directory):
    """In each of the launched processes: build the model sharded, load the checkpoint, take the remaining step."""
    with sharding.gloo_group():
        return sharded_checkpoints.resume_from(directory)


resumed = parallel.launch(resume, (checkpoint_dir,), num_processes=3, quiet=True, oversubscribe=True,
                          timeout=LAUNCH_TIMEOUT_S)
after_loading = resumed[0]["loaded_parameters"]
loaded_exactly = all(torch.equal(after_loading[name], tensor) for name, tensor in saved[0]["saved_parameters"].items())
print(f"saved on 2 processes, loaded on 3: every parameter equal to the bit: {loaded_exactly}")
resumed_gap = parallel.max_parameter_difference(one_process["final_parameters"], resumed[0]["final_parameters"],
                                                skip=parallel.NOISE_ONLY_PARAMETERS)
stateless_gap = parallel.max_parameter_difference(one_process["final_parameters"],
                                                  resumed[0]["final_without_optimizer_state"],
                                                  skip=parallel.NOISE_ONLY_PARAMETERS)
print(f"after the third step, largest difference from one process that ran the 3 steps straight through: "
      f"{resumed_gap:.1e}; without the optimizer state: {stateless_gap:.1e}")
print(f"losses: saved run {[round(x, 6) for x in saved[0]['losses']]}, resumed "
      f"{[round(x, 6) for x in resumed[0]['losses']]}, straight through {[round(x, 6) for x in one_process['losses']]}")

# %% tags=["nbval-check-output"]
print(f"loaded on 3 processes exactly as saved on 2: {loaded_exactly}")
print(f"resumed on 3 processes, the run goes on as if it never stopped (parameters within 1e-5): {resumed_gap <= 1e-5}")
print(f"without the optimizer state it does not (more than 100x further off): {stateless_gap > 100 * resumed_gap}")

# %% [markdown]
# Loading is exact: the same bits on 3 processes as were saved on 2. The next step
# lands within 1e-5 of the run that never stopped, not bitwise on it, for the reason
# of section 2: three processes add their gradients in another order than one
# process does (the straight-through reference is the one-process run of section
# 2). Resuming with the weights alone lands much further off: a checkpoint to resume
# from must hold AdamW's moments too.
#
# **Accelerate's `fsdp_state_dict_type`.** The GPU configuration of section 6 sets
# `fsdp_state_dict_type: SHARDED_STATE_DICT`. What `accelerator.save_state` then does
# to the model is Accelerate's `save_fsdp_model`; the lines of its branches, printed
# from the installed Accelerate:

# %%
from accelerate.utils import fsdp_utils

for line in inspect.getsource(fsdp_utils.save_fsdp_model).splitlines():
    if any(key in line for key in ("== StateDictType.", "torch.save(state_dict", "dist_cp.save(", "rank0_only =")):
        print(line.strip())
print(f"accelerate.utils.merge_fsdp_weights (a sharded checkpoint into one file) exists: "
      f"{hasattr(fsdp_utils, 'merge_fsdp_weights')}")

# %% [markdown]
# With `FULL_STATE_DICT` the whole model is gathered and process 0 alone writes it
# (`torch.save`, one file): the whole model in one process's memory, one process's
# disk bandwidth. With `SHARDED_STATE_DICT` every process writes its own shards
# through DCP (`dist_cp.save`), as above, and the checkpoint loads on another
# number of processes. `accelerate merge-weights` (`merge_fsdp_weights`) turns a
# sharded checkpoint into one file afterwards.
#
# **One file for sharing.** A checkpoint to resume from is not a file to publish.
# `sharded_checkpoints.save_full_safetensors` gathers the whole state dict
# (`StateDictOptions(full_state_dict=True, cpu_offload=True)`: whole tensors, in
# host memory, on process 0 only) and process 0 writes one safetensors file. The
# launch above wrote it; here it is loaded into an ordinary one-process model:

# %%
from safetensors.torch import load_file

shared_model = sharding.fresh_course_model()
keys = shared_model.load_state_dict(load_file(safetensors_file))
print(f"{safetensors_file.name}: {saved[0]['safetensors_bytes']:,} B for {num_parameters:,} fp32 parameters "
      f"({4 * num_parameters:,} B) and a header; keys missing {keys.missing_keys}, unexpected {keys.unexpected_keys}")

# %% tags=["nbval-check-output"]
print("the one-process model holds exactly the saved parameters: "
      f"{all(torch.equal(p, saved[0]['saved_parameters'][name]) for name, p in shared_model.named_parameters())}")

# %% [markdown]
# ## 10. A model too big for one process: build on meta, shard, then load by shards
#
# `from_pretrained` followed by `fully_shard`, or `model.to("cuda")` first, makes
# the **whole** model in every process before cutting it: each process's peak is
# the full model, whatever *N*. The three processes above built theirs without ever
# holding it: `meta_init.build_sharded_on_meta` builds on the meta device (shapes,
# no storage), applies `fully_shard` there, and calls `to_empty(device="cpu")`,
# which allocates each process's shards only; then `load_sharded` reads each
# process's slices from the checkpoint. (The other way: one process reads a full
# file and `set_model_state_dict(..., StateDictOptions(full_state_dict=True,
# broadcast_from_rank0=True))` sends each process its shards.)

# %%
print(inspect.getsource(meta_init.build_sharded_on_meta).split('"""')[-1].strip())

# %% [markdown]
# Each process recorded the allocator (`memory.recording_allocator`) while it built
# and loaded its model, and again while it built a whole copy and sharded that. The
# plan for the first: its padded shards (`meta_init.planned_parameter_bytes`), plus,
# for a moment, what DCP reads at once, bounded by the largest whole tensor:

# %%
whole_model = 4 * num_parameters
largest_tensor = max(p.numel() * 4 for p in sharding.course_model().parameters())
for rank, result in enumerate(resumed):
    print(f"process {rank} of 3: shards planned {result['planned_parameters']:,} B, held "
          f"{result['held_parameters']:,} B; rise building on meta and loading {result['build_rise']:,} B; "
          f"building whole then sharding {result['whole_first_rise']:,} B (the whole model: {whole_model:,} B)")

# %% tags=["nbval-check-output"]
print(f"every process holds exactly its planned shards: "
      f"{all(r['held_parameters'] == r['planned_parameters'] for r in resumed)}")
print(f"built on meta, each peak is at least the shards and at most the shards plus the largest tensor: "
      f"{all(r['planned_parameters'] <= r['build_rise'] <= r['planned_parameters'] + largest_tensor for r in resumed)}")
print(f"built whole first, each peak is at least the whole model: "
      f"{all(r['whole_first_rise'] >= whole_model for r in resumed)}")

# %% [markdown]
# Why not load the whole 70B in every process and shard it afterwards? Each of a
# node's 8 processes would hold a whole copy, in host memory first:

# %%
for bytes_per_parameter, precision in ((4, "fp32"), (2, "bf16")):
    need = meta_init.full_copies_per_node(seventy_parameters, bytes_per_parameter, 8)
    one_copy = seventy_parameters * bytes_per_parameter
    print(f"{precision}: 8 x {format_bytes(one_copy, 2)} = {format_bytes(need, 3)} per node; one copy fits on an "
          f"A100 80GB: {one_copy <= gpus.gpu_memory_bytes('A100 80GB')}")
    for node, (host, source) in meta_init.NODE_HOST_MEMORY.items():
        print(f"    {node}, host memory {format_bytes(host, 3)} ({source}): fits {need <= host}")

# %% [markdown]
# ## 11. Communication time: from bytes to seconds
#
# Section 5 counted the bytes each process hands to the collectives per step. A ring
# turns a payload into bytes sent per process (`comm_time.wire_bytes`, with the
# factors of the NCCL tests' `doc/PERFORMANCE.md`: 2(*N*-1)/*N* for an all-reduce,
# (*N*-1)/*N* of the whole for a reduce-scatter or an all-gather), and a link's
# bandwidth per GPU turns those into seconds (`comm_time.seconds_on`: no latency,
# no contention: the least it can take). Scaled to 70B in fp32 (section 4's
# model), on one node of 8 GPUs over NVLink, and on 8 nodes (64 GPUs) where the
# ring's slowest hop is the network, each bandwidth with its source:

# %%
for link, bandwidth in comm_time.LINKS.items():
    print(f"{link}: {bandwidth.value / 1e9:.0f} GB/s per GPU and direction ({bandwidth.source})")
scale = seventy_parameters / num_parameters
network = {8: "NVLink 4, inside an H100 node", 64: "InfiniBand NDR, between nodes"}
comm_seconds = {}
for strategy in sharding.STRATEGIES:
    parts = []
    for world_size, link in network.items():
        sent = comm_time.scaled_step_wire_bytes(runs[strategy, 2][0].communicated, 2, scale, world_size)
        comm_seconds[strategy, world_size] = comm_time.seconds_on(link, sent)
        parts.append(f"{world_size} GPUs {format_bytes(sent)} sent, at least {comm_seconds[strategy, world_size]:.2f} s")
    print(f"{sharding.STRATEGY_NAMES[strategy].split(' (')[0]:<14}: 70B, per GPU per step: " + "; ".join(parts))
print(f"the step's compute ({step_tokens} tokens per GPU) at the peak of an {peak_name}: at least {compute_70b:.3f} s")

# %%
zero3_hide = comm_seconds["zero3", 64] / compute_70b * step_tokens
display(Markdown(
    "None of these seconds is measured here: they are sourced bandwidths applied to the bytes this lesson counted. "
    f"At {step_tokens} tokens per GPU the step's compute lasts at least {compute_70b:.3f} s, and ZeRO-3's messages "
    f"at least {comm_seconds['zero3', 8]:.2f} s on one node and {comm_seconds['zero3', 64]:.2f} s across 8 nodes. "
    "Run one after the other, the messages would leave the GPUs idle most of the step: they must run **while** the "
    "GPU computes, the all-gather of the next unit during the compute of the current one, the reduce-scatter of a "
    "unit's gradients during the backward pass of the unit before it, DDP's all-reduce of each bucket as soon as its "
    "gradients are ready. That hides them only when the compute lasts as long: across 8 nodes, ZeRO-3's messages "
    f"need about {zero3_hide:,.0f} tokens per GPU per step at the data sheet's peak (more at a real utilisation) to "
    "fit under the compute, which is why large runs keep ZeRO-3 within a node and combine it with other parallelisms "
    "across nodes (lesson 9)."
))

# %% [markdown]
# **What `reshard_after_forward` trades.** ZeRO-2 (`False`) keeps each unit gathered
# from its forward pass to its backward pass; ZeRO-3 (`True`) frees it and gathers
# it again in the backward pass. The runs of section 2 measured both sides:

# %%
gathered_bytes = {s: runs[s, 2][0].communicated.get("all_gather_single", 0) for s in ("zero2", "zero3")}
held_at_peak = {s: runs[s, 2][0].peak_by_category["Unsharded Param"] for s in ("zero2", "zero3")}
print(f"all-gather payload per step: ZeRO-2 {gathered_bytes['zero2']:,} B, ZeRO-3 {gathered_bytes['zero3']:,} B "
      f"(+{gathered_bytes['zero3'] - gathered_bytes['zero2']:,} B)")
print(f"gathered parameters at the peak: ZeRO-2 {held_at_peak['zero2']:,} B, ZeRO-3 {held_at_peak['zero3']:,} B "
      f"({held_at_peak['zero2'] - held_at_peak['zero3']:,} B less)")

# %% tags=["nbval-check-output"]
print(f"ZeRO-3 hands the all-gathers exactly twice ZeRO-2's payload (every unit gathered again in the backward pass): "
      f"{gathered_bytes['zero3'] == 2 * gathered_bytes['zero2']}")
print(f"and it holds less gathered at its peak: {held_at_peak['zero3'] < held_at_peak['zero2']}")

# %% [markdown]
# `reshard_after_forward=True` pays one more all-gather per step to hold only the
# units being computed; `False` holds the whole model gathered through the step and
# sends less. FSDP2 also lets you ask for a unit's all-gather earlier than it would
# by itself (`FSDPModule.set_modules_to_forward_prefetch` and
# `set_modules_to_backward_prefetch`, in torch's FSDP2 documentation): a trade of the
# same kind, made one unit at a time, that this lesson does not measure, since on
# gloo over one CPU there is no compute for a message to hide behind.

# %% [markdown]
# ## Exercises
#
# `ex.qN.check()` checks your answer, `ex.qN.hint()` gives a hint (call it again
# for the next one), `ex.qN.solution()` shows the solution.
#
# ### Exercise 1: one process's optimizer state under ZeRO-1
#
# `ZeroRedundancyOptimizer` on three processes gives each process whole parameter
# tensors, and AdamW keeps for each of them two fp32 moments shaped like it and a
# 4-byte `step` counter. `ex.zero1_assignment(3)` returns, for each of the three
# processes, the shapes of the parameters it owns (computed by the optimizer
# itself). Write `optimizer_bytes(shapes)`: the bytes of AdamW state a process
# holds for those shapes (fp32). The check compares it with the state each
# process of a launched ZeRO-1 run held.

# %%
import math


def optimizer_bytes(shapes):
    # BEGIN SOLUTION
    return sum(2 * 4 * math.prod(shape) + 4 for shape in shapes)
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2: shard a model with `fully_shard`
#
# Complete `shard(model, mesh)` so that it applies ZeRO-3 to a DistilBERT: one
# FSDP unit per transformer block (`model.distilbert.transformer.layer`), then
# the root. The check launches it on two processes, trains three steps, and
# checks what each process held and that it trained the model one process trains.

# %%
from torch.distributed.fsdp import fully_shard


def shard(model, mesh):
    # BEGIN SOLUTION
    for block in model.distilbert.transformer.layer:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # END SOLUTION
    # BEGIN STARTER
    # ____
    # END STARTER
    return model


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ## Summary
#
# - Under DDP every process holds the whole state: 16 bytes per fp32 parameter
#   with AdamW, plus DDP's gradient buckets (4 more), plus activations.
# - ZeRO-1 (`ZeroRedundancyOptimizer`) divides the optimizer state by tensors.
#   FSDP2 (`fully_shard` per block, then the root) divides the optimizer state,
#   the gradients and, between steps, the parameters, padded to a multiple of *N*
#   rows; `reshard_after_forward=False` (ZeRO-2-like) keeps the parameters whole
#   from the forward pass to the end of the backward pass, `True` (ZeRO-3) gathers
#   each block only while it runs. Each trains the same model as one process.
# - What does not divide: activations, the unit gathered at the peak, the
#   collective buffers, the optimizer's scalar counters.
# - `memory.estimate_training_memory(..., world_size=N, sharding="zero3", rank=r)`
#   plans process *r*'s step on a fake process group, equal to the byte to the
#   tracker of a real run in every part (DDP, ZeRO-1, ZeRO-2 and ZeRO-3), its
#   peaks too (under FSDP, but for one gathered unit gloo's timing can add). For
#   full-size models, "16 bytes x P / N" holds only while the sharded state is the
#   largest part of the peak; with many GPUs the activations and the gathered
#   block, which do not divide, set it.
# - Per step, DDP all-reduces the gradients; torch's `ZeroRedundancyOptimizer`
#   adds a broadcast of the parameters (more bytes on the wire than DDP);
#   ZeRO-1 as the paper and DeepSpeed run it, and ZeRO-2, reduce-scatter and
#   all-gather once (DDP's bytes); ZeRO-3 all-gathers twice (half as much
#   again). Accelerate's `LocalSGD` sends less by averaging parameters every few
#   steps instead of gradients every step, and so trains a different model: its
#   copies drift apart from the one-process training.
# - Under ZeRO-3, bf16 autocast keeps a gathered bf16 copy of every Linear weight
#   from the forward pass to the backward pass (autograd saves it; the cast cache
#   is not the cause), which no *N* divides; FSDP2's `MixedPrecisionPolicy`
#   gathers the units in bf16 instead (half the all-gathers' bytes, no casts
#   left), while the fp32 shard stays the master copy.
# - On a CPU, Accelerate's FSDP plugin silently gives DDP, `--use_fsdp --cpu` is
#   refused and a plain `Accelerator()` trains alone: call torch directly, and keep
#   the Accelerate or DeepSpeed configuration for the GPUs.
