# %% [markdown]
# # Lesson 9 — When one layer is too big, or activations do not divide: tensor, sequence, pipeline, context and expert parallelism, and meshes
#
# Lesson 7 sharded the training state over processes and showed what sharding does
# not divide: the activations, and the block gathered whole while it runs. This
# lesson cuts the model itself. Each way is written from scratch first, then run
# with PyTorch's own API, on CPU processes that talk over *gloo*, and checked
# against the same step on one process:
#
# | section | the question |
# | --- | --- |
# | 1. tensor parallelism | split one layer's matrices over processes: what each holds, and the all-reduces it costs |
# | 2. sequence parallelism | divide the activations that tensor parallelism leaves whole, for the same bytes on the wire |
# | 3. pipeline parallelism | cut the model into stages fed with micro-batches: the bubble, and what each schedule keeps |
# | 4. context parallelism | split one long sequence over processes: attention by a ring of sends, and activations that divide by *N* |
# | 5. expert parallelism | put a mixture of experts' experts on different processes: two all-to-alls, and the load they must balance |
# | 6. meshes | two parallelisms at once on a 2 x 2 grid of processes, and Accelerate's `ParallelismConfig` |
#
# Every run below is launched under a time limit: a collective whose partner
# never comes would otherwise wait for good. The same calls run on GPUs over
# NCCL; the link speeds that decide where each parallelism belongs on a cluster
# are data-sheet figures, named with their source, never measured here.
#
# The models are small on purpose: a pre-norm transformer block of 64 dimensions
# and 4 heads (`tensor_parallel.tiny_block`), a stack of linear layers for the
# pipeline, and the course's offline stand-ins (lesson 1 introduces them): a small
# pre-trained DistilBERT from `data/tiny-distilbert/` for the `distilbert-base-cased`
# checkpoint, fed a batch of the paraphrase pairs of `data/paraphrase/`, which stand
# in for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")` and the data line
# `load_dataset("glue", "mrpc")`, as lesson 1 shows.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import inspect
import statistics

import torch
# Imported once here, so that every worker forked below finds them loaded.
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.pipelining  # noqa: F401
import torch.distributed.tensor.parallel  # noqa: F401
from IPython.display import Markdown, display
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import comm_time, experts, launcher, layouts, memory, meshes, models, parallel, pipeline, sharding
from course_utils import tensor_parallel
from course_utils import ring_attention as ra
from course_utils.exercises import ____
from course_utils.exercises import lesson9 as ex
from course_utils.plots import experts as expert_plots
from course_utils.plots import ring_attention as ring_plots
from course_utils.plots.pipeline import plot_pipeline_timeline
from course_utils.units import format_bytes

launcher.silence_library_progress_bars()
# Each launch takes seconds; past this limit the launcher stops every worker and raises WorkerTimeout, saying so.
LAUNCH_TIMEOUT_S = 120
SEEDS = (0, 1, 2)  # comparisons of sections 4 and 5 are repeated over these seeds
TOLERANCE = 1e-5  # fp32 sums taken in another order differ by about 1e-6; a wrong split differs by far more
sharding.prepare(steps=1, batch_size=4)  # the DistilBERT and its batch, loaded once for every worker

# %% [markdown]
# ## 1. Tensor parallelism
#
# A block's MLP computes `Y = GELU(X A) B`. Cut `A` into column blocks `[A₁ A₂]`
# and `B` into the matching row blocks `[B₁; B₂]`:
#
# $$Y = \mathrm{GELU}(X A_1)\,B_1 + \mathrm{GELU}(X A_2)\,B_2 .$$
#
# Process *r* holds `A_r` and `B_r`, computes its own hidden units from the whole
# input, and is left with a *partial* output; one all-reduce sums the partial
# outputs. GELU acts on each hidden unit alone, so nothing is exchanged between the
# two matrices. This is Megatron-LM's split (Shoeybi et al., 2019). Attention splits
# the same way, by heads: the query, key and value projections by columns (each
# process computes its own heads), the output projection by rows.
#
# In PyTorch a `Linear` stores its weight as (out, in), so a "column" split of `A`
# takes **rows** of `up.weight` (output features, with their biases) and a "row" split
# of `B` takes **columns** of `down.weight` (input features); the bias of `down` is
# added once, after the sum:

# %%
print(inspect.getsource(tensor_parallel.split_columns))
print(inspect.getsource(tensor_parallel.split_rows))

# %% [markdown]
# The communication lives in two autograd functions, Megatron-LM's *f* and *g*.
# *g* all-reduces the partial outputs in the forward pass and passes the gradient
# back as it is; *f* passes the input on as it is and all-reduces its gradient in
# the backward pass (each process's columns contributed part of it). One half of a
# block, split, is *f*, the local columns then rows, *g*, then the bias:

# %%
print(inspect.getsource(tensor_parallel.ReduceFromTensorParallel))
print(inspect.getsource(tensor_parallel.TensorParallel))

# %% [markdown]
# `tensor_parallel.run_split` runs in each of two processes: it builds the same
# block from the same seed, splits it, runs one forward pass, one backward pass and
# one AdamW step, and does the same on the whole block alone, in the same process,
# for the comparison. It measures what the process holds (weights, gradients,
# AdamW's state, and the activations the forward pass saved for the backward pass),
# and counts every collective it runs (`collectives.CollectiveLog`, which sees them
# in torch's dispatcher). Four runs in one launch: the split written above, the same
# split by DTensor's `parallelize_module`, with sequence parallelism (section 2),
# and the course's DistilBERT split by DTensor.

# %%
splits = parallel.launch(tensor_parallel.run_split, num_processes=2, timeout=LAUNCH_TIMEOUT_S)
scratch = splits[0]["from scratch"]


def held_table(runs):
    """Print, for each run, what one process held beside one process alone (bytes)."""
    names = list(next(iter(runs.values())).held)
    print(f"{'run':<22}" + "".join(f"{name:>17}" for name in names))
    first = next(iter(runs.values()))
    print(f"{'one process':<22}" + "".join(f"{first.one_process[name]:>17,}" for name in names))
    for label, run in runs.items():
        print(f"{label:<22}" + "".join(f"{run.held[name]:>17,}" for name in names))


held_table({"split by hand": scratch})

# %% tags=["nbval-check-output"]
for process in splits:
    run = process["from scratch"]
    print(f"process {run.rank}: output equal to one process's within {TOLERANCE:g}: {run.forward_gap < TOLERANCE}; "
          f"gradients: {run.gradient_gap < TOLERANCE}")
print(f"collectives, forward: {scratch.forward_collectives}; backward: {scratch.backward_collectives}")
batch, seq, dim = scratch.activation_shape
per_all_reduce = scratch.forward_payload["all_reduce"] // scratch.forward_collectives["all_reduce"]
print(f"each all-reduce hands in {per_all_reduce:,} bytes: the whole activation, {batch} x {seq} x {dim} x 4 bytes: "
      f"{per_all_reduce == batch * seq * dim * 4}")
print(f"weights per process: {scratch.held['weights'] / scratch.one_process['weights']:.3f} of one process's")

# %%
display(Markdown(
    f"Each process holds {scratch.held['weights'] / scratch.one_process['weights']:.1%} of the block's weights, "
    "gradients and AdamW state: half of every split matrix, and the whole of what is not split (the two norms "
    "and the biases added after the sum). The activations saved for the backward pass shrink less, to "
    f"{scratch.held['activations'] / scratch.one_process['activations']:.1%}: the attention scores divide with "
    "the heads and the MLP's hidden units with the split, but the norms' inputs and outputs, and the block's input, are whole in every "
    "process (section 2 divides them). The price: per block, "
    f"{scratch.forward_collectives['all_reduce']} all-reduces forward and "
    f"{scratch.backward_collectives['all_reduce']} backward, each of the whole activation."
))

# %% [markdown]
# ### The same split by DTensor: `parallelize_module`
#
# PyTorch writes the same split as a *plan*: a name in the module and how to split
# it. `ColwiseParallel` splits a `Linear`'s output features, `RowwiseParallel` its
# input features and sums the partial outputs; the weights become DTensors, each
# process holding its shard. The call is
# `parallelize_module(block, init_device_mesh("cpu", (2,)), plan)`, with this plan:

# %%
for name, style in tensor_parallel.block_plan().items():
    print(f"{name:<10} {type(style).__name__}")

# %%
dtensor = splits[0]["parallelize_module"]
held_table({"split by hand": scratch, "parallelize_module": dtensor})
print(f"\nparallelize_module: collectives forward {dtensor.forward_collectives}, "
      f"backward {dtensor.backward_collectives}")

# %% tags=["nbval-check-output"]
print(f"parallelize_module equals one process (forward, gradients): "
      f"{all(p['parallelize_module'].forward_gap < TOLERANCE and p['parallelize_module'].gradient_gap < TOLERANCE for p in splits)}")
print(f"and holds what the split by hand holds: {dtensor.held == scratch.held}")
print(f"all-reduces backward: by hand {scratch.backward_collectives['all_reduce']}, "
      f"by DTensor {dtensor.backward_collectives['all_reduce']}")

# %%
display(Markdown(
    f"Same bytes, same results, but DTensor all-reduces {dtensor.backward_collectives['all_reduce']} times in the "
    f"backward pass where the hand-written split does {scratch.backward_collectives['all_reduce']}: each "
    "`ColwiseParallel` layer sums the gradient of its own input, so the query, key and value projections, which "
    "read the same input, each all-reduce it, where *f* sums it once for the three. A model whose three "
    "projections are one matrix (Megatron-LM's `linear_qkv`) has one such all-reduce."
))

# %% [markdown]
# ### The course's DistilBERT
#
# A transformers model splits the same way; only the names change
# (`tensor_parallel.distilbert_plan`: `q_lin`, `k_lin`, `v_lin`, `lin1` by columns,
# `out_lin`, `lin2` by rows, in every block). Its attention reshapes with `-1` for
# the number of heads, so each process's half of the heads passes through unchanged.

# %%
bert = splits[0]["distilbert"]
held_table({"DistilBERT, TP on 2": bert})
print(f"\nequal to one process (logits, gradients): "
      f"{all(p['distilbert'].forward_gap < TOLERANCE and p['distilbert'].gradient_gap < TOLERANCE for p in splits)}")
print(f"collectives forward {bert.forward_collectives}, backward {bert.backward_collectives}")

# %%
display(Markdown(
    f"Each process holds {bert.held['weights'] / bert.one_process['weights']:.0%} of DistilBERT's weights, not "
    "half: the embeddings (a large part of so small a model) are not in the plan and stay whole in every process. "
    "A plan can split them too (`RowwiseParallel` on an `nn.Embedding` splits the vocabulary); for a model of "
    "billions of parameters, the blocks are nearly all of it."
))

# %% [markdown]
# ### The planner, per process
#
# Lesson 7 planned each process of a ZeRO run with `memory.estimate_training_memory`
# and checked the plan against the run. The same call takes a layout,
# `layout=layouts.Layout(...)`, the one description of a layout that the real runs
# apply too (`layouts.apply_layout`), and `rank=r` plans process *r* on a fake
# process group. Here: tensor parallelism over 2 processes with sequence parallelism,
# on a small Llama (4 blocks of 32 dimensions, 4 heads sharing 2 of keys and values),
# one AdamW step on 2 sequences of 16 tokens. `plan_and_measure` plans every process,
# then runs the same set-up on as many launched processes
# (`sharding.measure_laid_out_step`: the model laid out by `apply_layout`, a warm-up
# step, then one step measured by torch's MemTracker) and prints both, part by part.

# %%
SMALL_LLAMA = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
PARTS = ("weights", "gradients", "optimizer_state", "activations", "peak")


def plan_and_measure(layout, batch_size, seq_len):
    """Plan every process of ``layout``, measure the same step on its processes, print both (bytes); return both."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(SMALL_LLAMA)
    plans = [memory.estimate_training_memory(model, "adamw", batch_size, seq_len, layout=layout, rank=rank)
             for rank in range(layout.world_size)]
    measured = launcher.launch(sharding.measure_laid_out_step,
                               (AutoModelForCausalLM, SMALL_LLAMA, layout, batch_size, seq_len),
                               num_processes=layout.world_size, quiet=True, timeout=LAUNCH_TIMEOUT_S)
    print(f"{'bytes':<16}" + "".join(f"{f'process {rank} planned':>20}{'measured':>12}" for rank in range(len(plans))))
    for part in PARTS:
        print(f"{part:<16}" + "".join(f"{getattr(plan, part):>20,}{getattr(real, part):>12,}"
                                      for plan, real in zip(plans, measured)))
    return plans, measured


tp_plans, tp_measured = plan_and_measure(layouts.Layout("none", 2, tp=2, sequence_parallel=True), 2, 16)

# %% tags=["nbval-check-output"]
print(f"tp=2 with sequence parallelism, every part of every process, planned against measured: "
      f"equal to the byte: {tp_plans == tp_measured}")

# %% [markdown]
# ### Why tensor parallelism stays inside a node
#
# The counts above scale to a real model without guessing: every block all-reduces
# the whole activation (tokens x dim) twice forward and twice backward. For a
# Llama-70B-shaped model (80 blocks, dim 8192) in bf16, split over 8 GPUs, with one
# sequence of 4,096 tokens per step, the all-reduces' bytes per GPU on a ring
# (`comm_time.wire_bytes`), turned into seconds at each link's data-sheet
# bandwidth (`comm_time.seconds_on`), and the step's compute at the peak of the
# GPU (`comm_time.compute_seconds_at_peak`, 6 FLOPs per parameter and token, an
# eighth of the model per GPU):

# %%
LAYERS, DIM, TOKENS, TP = 80, 8192, 4096, 8
per_block = scratch.forward_collectives["all_reduce"] + scratch.backward_collectives["all_reduce"]
payload = LAYERS * per_block * TOKENS * DIM * 2  # bf16
sent = comm_time.wire_bytes("all_reduce", payload, TP)
peak_name = "H100 SXM, bf16 dense"
compute_s = comm_time.compute_seconds_at_peak(70e9 / TP, TOKENS, peak_name)
tp_seconds = {}
for link, bandwidth in comm_time.LINKS.items():
    if "PCIe" in link:
        continue
    tp_seconds[link] = comm_time.seconds_on(link, sent)
    print(f"{link}: {bandwidth.value / 1e9:.0f} GB/s per GPU and direction ({bandwidth.source}): "
          f"at least {tp_seconds[link]:.3f} s")
print(f"all-reduces per GPU per step: {per_block} per block x {LAYERS} blocks, {format_bytes(sent)} sent")
print(f"the step's compute per GPU at the peak ({comm_time.GPU_PEAKS[peak_name].source}): at least {compute_s:.3f} s")

# %%
nvlink, infiniband = tp_seconds["NVLink 4, inside an H100 node"], tp_seconds["InfiniBand NDR, between nodes"]
display(Markdown(
    f"Inside a node, over NVLink, the all-reduces take at least {nvlink:.3f} s against {compute_s:.3f} s of "
    f"compute at the peak ({nvlink / compute_s:.0%} of it); across nodes, over InfiniBand, at least "
    f"{infiniband:.3f} s ({infiniband / compute_s:.1f} times the compute). Unlike FSDP's all-gathers (lesson 7), "
    "these all-reduces sit *on the path* of the computation: the next layer needs their result, so little of "
    "them hides behind compute. Hence the rule of the Ultra-Scale Playbook and of Megatron-LM: tensor "
    "parallelism within the GPUs of one node (at most 8 on an H100 node), other parallelisms across nodes. "
    "None of these seconds is measured here: they are sourced bandwidths applied to bytes this lesson counted."
))

# %% [markdown]
# ## 2. Sequence parallelism
#
# Between the row split of one half of a block and the column split of the next,
# every process holds the whole activation: the residual sum, the norm, its input
# and output, all computed N times over and saved N times. *Sequence parallelism*
# (Korthikanti et al., 2022) splits that stretch along the sequence instead: each
# process normalises its own tokens. The all-reduce at the end of a row split
# becomes a **reduce-scatter** (each process keeps the sum for its own tokens), and
# the column split starts with an **all-gather** of the tokens. A ring all-reduce
# *is* a reduce-scatter followed by an all-gather, so the bytes on the wire do not
# change. The plan adds `SequenceParallel` on the norms, and the layouts between:

# %%
for name, style in tensor_parallel.block_plan(sequence_parallel=True).items():
    print(f"{name:<10} {type(style).__name__}")

# %% [markdown]
# Each process feeds the block its own half of the tokens and gets its own half of
# the output back; the run above (`"sequence parallel"`) checked that half against
# the same tokens of one process's output.

# %%
sequence = splits[0]["sequence parallel"]
held_table({"TP": dtensor, "TP + SP": sequence})
print(f"\nTP + SP: collectives forward {sequence.forward_collectives}, backward {sequence.backward_collectives}")

# %% tags=["nbval-check-output"]
print(f"TP + SP equals one process on each process's tokens (output, gradients): "
      f"{all(p['sequence parallel'].forward_gap < TOLERANCE and p['sequence parallel'].gradient_gap < TOLERANCE for p in splits)}")
print(f"forward collectives: TP {dtensor.forward_collectives}, TP + SP {sequence.forward_collectives}")
# The bytes each process sends on a ring: the all-reduce of TP against SP's reduce-scatter and all-gather.
tp_wire = comm_time.wire_bytes("all_reduce", dtensor.forward_payload["all_reduce"], 2)
sp_wire = (comm_time.wire_bytes("reduce_scatter_single", sequence.forward_payload["reduce_scatter"], 2)
           + comm_time.wire_bytes("all_gather_single", sequence.forward_payload["all_gather"], 2))
print(f"bytes sent per process in the forward pass, on a ring: TP {tp_wire:,.0f}, TP + SP {sp_wire:,.0f}")
print(f"activations saved per process: TP + SP below TP: {sequence.held['activations'] < dtensor.held['activations']}")

# %%
display(Markdown(
    f"The same bytes on the wire ({sp_wire:,.0f} against {tp_wire:,.0f} per process in the forward pass), and "
    f"each process saves {sequence.held['activations']:,} bytes of activations instead of "
    f"{dtensor.held['activations']:,} ({1 - sequence.held['activations'] / dtensor.held['activations']:.0%} "
    "less): the norms' inputs and outputs and the residual stream are now split by tokens. What remains above "
    "half of one process's "
    f"({sequence.held['activations'] / sequence.one_process['activations']:.0%} of it) is what the all-gathers "
    "rebuild whole for the column splits (the gathered input of attention and of the MLP) and the attention's "
    "own tensors, divided by heads but not by tokens. Korthikanti et al. go one step further: they save only each "
    "process's shard of the gathered inputs and all-gather them again in the backward pass, so that all of the "
    "block's activations divide by N."
))

# %% [markdown]
# ## 3. Pipeline parallelism
#
# Tensor parallelism splits every layer; a *pipeline* gives each process whole
# layers instead: stage *s* of *p* holds a slice of the blocks, receives its input
# from stage *s - 1*, sends its output to stage *s + 1*, and the gradients come back
# the other way. Alone, that leaves all but one stage idle. So the batch is cut into
# *m* micro-batches, and a *schedule* says in which order each stage runs its
# forward (F) and backward (B) passes. GPipe (Huang et al., 2019) runs every forward,
# then every backward; 1F1B (PipeDream-Flush, Narayanan et al., 2021) fills the pipe
# with `p - s - 1` forwards, then alternates one forward and one backward:

# %%
print(inspect.getsource(pipeline.one_f_one_b))
for name, schedule in pipeline.SCHEDULES.items():
    for stage in range(2):
        print(f"{name:<5} stage {stage}: " + " ".join(f"{kind}{i}" for kind, i in schedule(stage, 2, 4)))

# %% [markdown]
# With every pass taking the same time, each stage waits `p - 1` slots to start and
# to finish, out of `m + p - 1`: the *bubble*, an idle share of
#
# $$\frac{p-1}{m+p-1},$$
#
# the same for both schedules. Below, two processes run both schedules written
# over send and receive (`pipeline.run_stage`: sends asynchronous, each receive
# naming its partner), on 8 layers of 512 x 512, 4 per stage, with 2 and 8
# micro-batches of 128 rows. Each stage records when it computed
# (`time.perf_counter`, one clock for all processes of the machine), over 4
# repeats after a warm-up; `pipeline.bubble_fraction` measures the idle share from
# those spans, and `pipeline.replay_schedule` replays the same orders with the
# passes' measured durations and no time for messages: the bubble the schedule
# itself leaves with these passes (with equal passes it gives the formula exactly;
# it also proves that the orders cannot wait for each other forever). Each stage also meters the activations it keeps
# (`saved_activations.ActivationMeter`, which follows each saved tensor until the
# backward pass lets it go), and checks its gradients against one process's.

# %%
CONFIGS = [(name, m) for name in pipeline.SCHEDULES for m in (2, 8)]
stage_runs = parallel.launch(pipeline.run_pipeline, (CONFIGS, 4), num_processes=2, timeout=LAUNCH_TIMEOUT_S)
bubbles, replayed = {}, {}
for index, (name, m) in enumerate(CONFIGS):
    stages = [runs[index] for runs in stage_runs]
    orders = [pipeline.SCHEDULES[name](stage, 2, m) for stage in range(2)]
    bubbles[name, m], replayed[name, m] = [], []
    for k in range(len(stages[0].spans)):
        spans = [stage.spans[k] for stage in stages]
        bubbles[name, m].append(pipeline.bubble_fraction(spans))
        durations = [[end - start for start, end in stage_spans] for stage_spans in spans]
        replayed[name, m].append(pipeline.bubble_fraction(pipeline.replay_schedule(orders, durations)))
    print(f"{name:<5} m = {m}: bubble measured median {statistics.median(bubbles[name, m]):.2f} "
          f"(from {min(bubbles[name, m]):.2f} to {max(bubbles[name, m]):.2f} over {len(bubbles[name, m])} repeats); "
          f"replayed without messages {statistics.median(replayed[name, m]):.2f}; "
          f"formula {pipeline.bubble_formula(2, m):.2f}")

# %% [markdown]
# The first measured repeat of each schedule with 8 micro-batches, drawn: the white
# space in each row is that stage's share of the bubble.

# %%
timelines = {}
for name in pipeline.SCHEDULES:
    index = CONFIGS.index((name, 8))
    timelines[f"{name}, p = 2, m = 8"] = [
        [(start, end, kind, i) for (start, end), (kind, i) in zip(runs[index].spans[0],
                                                                  pipeline.SCHEDULES[name](stage, 2, 8))]
        for stage, runs in enumerate(stage_runs)]
plot_pipeline_timeline(timelines, "Two stages, 8 micro-batches: when each stage computed (one repeat)");

# %% tags=["nbval-check-output"]
for index, (name, m) in enumerate(CONFIGS):
    stages = [runs[index] for runs in stage_runs]
    kept = ", ".join(f"stage {s.stage} {s.activation_peak / s.microbatch_activations:g}" for s in stages)
    print(f"{name:<5} m = {m}: micro-batches of activations kept at the peak: {kept}; "
          f"gradients equal one process's: {all(s.gradient_gap < TOLERANCE for s in stages)}")
whole_stack = 4 * sum(p.numel() for p in pipeline.layer_stack(8, 512).parameters())
print(f"weights per stage: {[runs[0].weights for runs in stage_runs]} bytes, of {whole_stack:,} for the whole stack")

# %%
gpipe_kept = stage_runs[0][CONFIGS.index(("GPipe", 8))]
one_kept = stage_runs[0][CONFIGS.index(("1F1B", 8))]
low = {name: statistics.median(bubbles[name, 8]) for name in pipeline.SCHEDULES}
high = {name: statistics.median(bubbles[name, 2]) for name in pipeline.SCHEDULES}
display(Markdown(
    f"The formula says: more micro-batches, a smaller bubble. Measured, from m = 2 to m = 8 the median goes from "
    f"{high['GPipe']:.2f} to "
    f"{low['GPipe']:.2f} under GPipe and from {high['1F1B']:.2f} to {low['1F1B']:.2f} under 1F1B, against "
    f"{pipeline.bubble_formula(2, 2):.2f} and {pipeline.bubble_formula(2, 8):.2f} by the formula. Of the "
    f"{len(bubbles)} measured medians, {sum(statistics.median(b) > pipeline.bubble_formula(2, m) for (_, m), b in bubbles.items())} "
    "are above the formula's value. The formula takes every pass to last the same time; replayed with the passes' "
    "measured times (unequal: the backward passes are longer, the last stage also computes the loss, and other "
    "programs take the cores now and then), the schedule alone leaves a median of "
    f"{statistics.median(replayed['GPipe', 8]):.2f} (GPipe) and {statistics.median(replayed['1F1B', 8]):.2f} (1F1B) "
    "at m = 8; the rest of the measured bubble is waiting for messages and for a core. What the two schedules "
    "differ in is memory: at m = 8, stage 0 keeps "
    f"{format_bytes(gpipe_kept.activation_peak)} of activations under GPipe (all {gpipe_kept.num_microbatches} "
    f"micro-batches, waiting for their backward passes) and {format_bytes(one_kept.activation_peak)} under 1F1B, "
    "where each micro-batch's backward pass follows soon after its forward pass."
))

# %% [markdown]
# ### torch's schedules: `torch.distributed.pipelining`
#
# PyTorch runs the same thing: a `PipelineStage` wraps each process's slice, a
# schedule drives it (`ScheduleGPipe`, `Schedule1F1B`), and `schedule.step(x)` on the
# first stage, `schedule.step(target=y, losses=losses)` on the last, runs one
# training step (with `scale_grads=True`, the gradients of the mean over
# micro-batches). `ScheduleInterleaved1F1B` gives each process two stages, 0 and 2
# on process 0, 1 and 3 on process 1: the micro-batches go round the processes
# twice, and the bubble shrinks by the number of stages per process, for twice the
# messages (Narayanan et al., 2021). Gloo runs a batch of sends and receives as separate sends and
# receives; the three run here without hanging, under the launch's time limit:

# %%
torch_runs = parallel.launch(pipeline.run_torch_schedule, num_processes=2, quiet=True, timeout=LAUNCH_TIMEOUT_S)
for name in pipeline.TORCH_SCHEDULES:
    print(f"{name:<24} stages per process {[process[name]['stages'] for process in torch_runs]}, "
          f"loss {torch_runs[1][name]['loss']:.4f}")

# %% tags=["nbval-check-output"]
for name in pipeline.TORCH_SCHEDULES:
    print(f"{name}: gradients equal one process's on every stage: "
          f"{all(process[name]['gradient_gap'] < TOLERANCE for process in torch_runs)}")

# %% [markdown]
# The planner follows torch's schedules stage by stage:
# `layouts.Layout("none", 2, pp=2, schedule="1f1b", microbatches=4)` cuts the small
# Llama above into 2 stages (`layouts.pipeline_stage`: the embeddings and 2 blocks,
# then 2 blocks, the norm and the head), and torch's `Schedule1F1B` runs 8 sequences
# of 16 tokens in 4 micro-batches. Each stage planned, and measured on its process:

# %%
pp_plans, pp_measured = plan_and_measure(layouts.Layout("none", 2, pp=2, schedule="1f1b", microbatches=4), 8, 16)

# %% tags=["nbval-check-output"]
print(f"pp=2 under 1F1B, every part of every stage, planned against measured: "
      f"equal to the byte: {pp_plans == pp_measured}")

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
attention_bytes = {"full attention, 1 process": ([], []), "ring attention, 1 process": ([], []),
          # the larger of the two processes' figures: the one that must fit
          "ring attention, each of 2 processes": ([max(kept) for kept in zip(*(run.kept for run in cp_runs))],
                                                  [max(peak) for peak in zip(*(run.peaks for run in cp_runs))])}
for seq_len in MEMORY_SEQ_LENS:
    for label, function in (("full attention, 1 process", ra.attention), ("ring attention, 1 process", ra.ring_attention)):
        kept, peak = ra.attention_memory(function, *(t.requires_grad_() for t in ra.random_qkv(0, seq_len)))
        attention_bytes[label][0].append(kept)
        attention_bytes[label][1].append(peak)

print(f"{'':<44}" + "".join(f"{f'seq {n}':>22}" for n in MEMORY_SEQ_LENS))
for label, (kept, peaks) in attention_bytes.items():
    print(f"{label + ', kept':<44}" + "".join(f"{format_bytes(b):>22}" for b in kept))
    print(f"{label + ', peak':<44}" + "".join(f"{format_bytes(b):>22}" for b in peaks))

# %%
ring_plots.plot_attention_memory(MEMORY_SEQ_LENS, attention_bytes);

# %% tags=["nbval-check-output"]
alone_kept, alone_peak = attention_bytes["ring attention, 1 process"]
each_kept, each_peak = attention_bytes["ring attention, each of 2 processes"]
print("each of 2 processes keeps exactly half of what one keeps:",
      all(2 * mine == alone for mine, alone in zip(each_kept, alone_kept)))
print("the kept bytes double with the sequence length:",
      all(b == 2 * a for a, b in zip(alone_kept, alone_kept[1:])))

# %%
full_kept = attention_bytes["full attention, 1 process"][0]
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
# ### The planner, per process
#
# In a whole model the ring replaces attention in every block
# (`layouts.Layout("none", 2, cp=2)`: `layouts.apply_layout` puts the ring into the
# model, `layouts.context_batch` gives each process its half of every sequence, with
# its positions and labels); everything else runs on each process's tokens. The small
# Llama, 2 sequences of 64 tokens, each process planned and measured:

# %%
cp_plans, cp_measured = plan_and_measure(layouts.Layout("none", 2, cp=2), 2, 64)

# %% tags=["nbval-check-output"]
print(f"cp=2, every part of every process, planned against measured: equal to the byte: {cp_plans == cp_measured}")

# %% [markdown]
# ### Planned at the size of a 70B
#
# What was checked to the byte on small models is what the planner computes for
# models no laptop holds, on fake tensors: a Llama-2-70B-shaped model (80 blocks of
# 8192 dimensions, grouped-query attention, bf16 weights, AdamW:
# `models.fine_tuning_configs`), the same step of 8 sequences of 512 tokens, under
# tensor parallelism over 8 processes and under a pipeline of 8 stages (1F1B, 8
# micro-batches of one sequence). Each process is a plan of its own, so this cell
# plans the first and the last process of the tensor-parallel group, and four of the
# eight stages: the first, the second (it holds 11 blocks, the most:
# `layouts.stage_blocks`), a middle one, the last.

# %%
big = models.build_for_training(*models.fine_tuning_configs()["Llama-2-70B-shaped (GQA)"], dtype=torch.bfloat16)
big_plans = {}
for rank in (0, 7):
    big_plans["tp=8", rank] = memory.estimate_training_memory(big, "adamw", 8, 512, layout=layouts.Layout("none", 8, tp=8),
                                                               rank=rank)
for stage in (0, 1, 4, 7):
    big_plans["pp=8 1F1B", stage] = memory.estimate_training_memory(
        big, "adamw", 8, 512, layout=layouts.Layout("none", 8, pp=8, schedule="1f1b", microbatches=8), rank=stage)
print(f"{'GiB':<22}" + "".join(f"{part:>17}" for part in PARTS))
for (name, rank), plan in big_plans.items():
    print(f"{f'{name}, process {rank}':<22}" + "".join(f"{getattr(plan, part) / 2**30:>17.2f}" for part in PARTS))

# %%
tp_peak = big_plans["tp=8", 0].peak
stages = {stage: plan for (name, stage), plan in big_plans.items() if name == "pp=8 1F1B"}
fullest = max(stages, key=lambda stage: stages[stage].peak)
heaviest = max(stages, key=lambda stage: stages[stage].weights)
display(Markdown(
    f"Under tp=8 the first and the last process plan {'the same' if big_plans['tp=8', 7] == big_plans['tp=8', 0] else 'a different'} "
    f"step (process 0: a peak of {tp_peak / 2**30:.1f} GiB). Under the pipeline the stages differ: stage {fullest} peaks "
    f"highest, at {stages[fullest].peak / 2**30:.1f} GiB ({stages[fullest].peak / tp_peak:.2f} times tp=8's), the "
    f"last stage at {stages[7].peak / 2**30:.1f} GiB. Stage 0 keeps {stages[0].activations / 2**30:.1f} GiB of "
    f"activations and stage 7 {stages[7].activations / 2**30:.1f} GiB: 1F1B keeps pp - s micro-batches in flight on "
    f"stage s (exercise 2 below). Stage {heaviest} holds the most weights ({stages[heaviest].weights / 2**30:.1f} GiB) and "
    "so the most gradients and AdamW state. A layout is judged by its fullest process: that one must fit."
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
# ## 6. Meshes: 2-D and HSDP
#
# A cluster is two-level: fast links inside a node, slower ones between nodes. A
# *device mesh* puts the processes on a grid and gives each dimension its own
# process groups, so that each parallelism talks only along its own dimension. Four
# processes on a 2 x 2 mesh, two layouts:
#
# - **FSDP x TP (2-D)**: tensor parallelism along `"tp"` (the processes of a row,
#   inside a node on a cluster), and FSDP along `"dp"` over what each holds, across
#   the rows;
# - **HSDP** (hybrid sharding): FSDP shards inside each row (`"shard"`) and keeps
#   one replica per row (`"replicate"`): the parameters are gathered inside a row
#   only, and the gradients, once reduce-scattered, are all-reduced across rows.
#
# `meshes.lay_out_on_mesh` is the whole of it (its FSDP part is the course's one way
# of sharding, `layouts.apply_layout`, which lesson 7 printed, given the mesh
# dimension to shard over):

# %%
print(inspect.getsource(meshes.lay_out_on_mesh))

# %% [markdown]
# `meshes.run_mesh` trains two tiny blocks one AdamW step under each layout on four
# processes (each data-parallel replica on its share of the batch), checks against
# one process, and splits the collectives by the mesh dimension they ran on.

# %%
mesh_runs = parallel.launch(meshes.run_mesh, num_processes=4, oversubscribe=True, timeout=LAUNCH_TIMEOUT_S)
for layout, run in mesh_runs[0].items():
    print(f"{layout}: process 0 holds weights {run.held['weights']:,} B of {run.one_process['weights']:,}, "
          f"AdamW state {run.held['optimizer_state']:,} B of {run.one_process['optimizer_state']:,}")
    for dimension, kinds in run.traffic.items():
        print(f"    on '{dimension}': " + ", ".join(f"{kind} {value:,} B" for kind, value in kinds.items()))

# %% tags=["nbval-check-output"]
for layout in meshes.LAYOUTS:
    print(f"{layout}: equal to one process on all 4 processes: "
          f"{all(p[layout].forward_gap < TOLERANCE and p[layout].gradient_gap < TOLERANCE for p in mesh_runs)}; "
          f"collectives by dimension: "
          + "; ".join(f"{dim} {sorted(kinds)}" for dim, kinds in mesh_runs[0][layout].traffic.items()))

# %%
two_d, hsdp = mesh_runs[0]["FSDP x TP"], mesh_runs[0]["HSDP"]
display(Markdown(
    f"Under FSDP x TP each process holds {two_d.held['weights'] / two_d.one_process['weights']:.0%} of the "
    "weights (a quarter of every split matrix, half of the norms and row biases, which only FSDP shards); the "
    "tensor-parallel all-reduces run only on `tp`, FSDP's all-gathers and reduce-scatters only on `dp`. Under "
    f"HSDP each holds {hsdp.held['weights'] / hsdp.one_process['weights']:.0%}: the model is sharded over the 2 "
    "processes of a row, not over 4, and in exchange the parameters are gathered inside a row only; across the "
    f"rows goes one all-reduce of the sharded gradients ({hsdp.traffic['replicate']['all_reduce']:,} bytes "
    "handed in, exactly the gradients the process holds). On a cluster the row is a node: the traffic that "
    "follows every layer stays on its fast links, and what crosses the network is once per step."
))

# %% [markdown]
# ### Accelerate's way in: `ParallelismConfig`
#
# Accelerate 1.15 describes the mesh with `ParallelismConfig(dp_replicate_size,
# dp_shard_size, tp_size, cp_size)` and builds it in `Accelerator(...,
# parallelism_config=...)`. Run in four processes, on this CPU:

# %%
accelerate_runs = parallel.launch(meshes.accelerate_parallelism_config, (2, 2), num_processes=4, quiet=True,
                                  oversubscribe=True, timeout=LAUNCH_TIMEOUT_S)
first = accelerate_runs[0]
print(f"ParallelismConfig(dp_shard_size=2, tp_size=2) builds a mesh {first['mesh_dims']} of shape {first['mesh_shape']}, "
      f"with the joint dimensions {first['flattened']}")
print("each process's place on it:", [run["coordinate"] for run in accelerate_runs])
print(f"Accelerator(cpu=True) here is {first['distributed_type']}, and with the config it raises:\n  {first['refusal']}")

# %% [markdown]
# The mapping is the one above: `dp_shard` is FSDP's dimension, `tp` tensor
# parallelism's, `dp_replicate` HSDP's replicas, and Accelerate flattens the
# data-parallel ones into a joint `dp` for the data loaders. On a CPU it stops there:
# a launch of CPU processes is `MULTI_CPU`, which the config does not accept. So on
# a CPU, call torch's `parallelize_module` and `fully_shard` on a mesh yourself, as
# above; on GPUs, the configuration a user writes is
# `Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
# fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))`, with a model loaded
# by transformers with `tp_plan="auto"` (Accelerate checks that the model is already
# split: it does not split it itself).

# %% [markdown]
# ## Exercises
#
# `ex.qN.check()` checks your answer, `ex.qN.hint()` gives a hint (call it again
# for the next one), `ex.qN.solution()` shows the solution. Each check launches
# processes (a few seconds).
#
# ### Exercise 1: split an MLP column- then row-wise
#
# Write `split_mlp(mlp, rank, world_size)`: it returns process `rank`'s share of
# a block's MLP (`mlp.up`, then GELU, then `mlp.down`, both `nn.Linear`) as three
# tensors `(up_weight, up_bias, down_weight)`. The check launches two processes;
# each computes `GELU(x @ up_weight.T + up_bias) @ down_weight.T`, the all-reduce
# sums the two, `mlp.down.bias` is added once, and the output and the gradients
# must be one process's.

# %%
def split_mlp(mlp, rank, world_size):
    # BEGIN SOLUTION
    n = mlp.up.out_features // world_size
    mine = slice(rank * n, (rank + 1) * n)
    return mlp.up.weight[mine], mlp.up.bias[mine], mlp.down.weight[:, mine]
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2: a pipeline stage's activation peak
#
# Write `activation_peak(schedule, stage, num_stages, num_microbatches,
# microbatch_bytes)`: the most bytes of activations stage `stage` keeps at once
# under `schedule` (`"GPipe"` or `"1F1B"`), when each micro-batch leaves
# `microbatch_bytes` on it until its backward pass. The check compares it with what
# each stage of a launched 4-stage pipeline kept, with 2 and with 6 micro-batches.

# %%
def activation_peak(schedule, stage, num_stages, num_microbatches, microbatch_bytes):
    # BEGIN SOLUTION
    if schedule == "GPipe":
        return num_microbatches * microbatch_bytes
    return min(num_stages - stage, num_microbatches) * microbatch_bytes
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ### Exercise 3: FSDP x TP on a 2 x 2 mesh
#
# Complete `fsdp_by_tp(model, mesh)`: `model` is two of the tiny blocks in an
# `nn.Sequential`, `mesh` a 2 x 2 `DeviceMesh` with dimensions `("dp", "tp")`. Split
# each block by tensor parallelism along one dimension and shard it with FSDP along
# the other, as section 6 did. The check launches four processes and looks at the
# dimension each collective ran on, what each process held, and the step against one process's.

# %%
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module


def fsdp_by_tp(model, mesh):
    # BEGIN SOLUTION
    for block in model:
        parallelize_module(block, mesh["tp"], tensor_parallel.block_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    # END SOLUTION
    # BEGIN STARTER
    # ____
    # END STARTER
    return model


ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]

# %% [markdown]
# ### Exercise 4: merge two softmaxes
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


ex.q4.check()

# %%
# ex.q4.hint()
# ex.q4.solution()

# %% [markdown]
# ### Exercise 5: the causal mask across ring steps
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


ex.q5.check()

# %%
# ex.q5.hint()
# ex.q5.solution()

# %% [markdown]
# ### Exercise 6: send each token to its expert's process
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


ex.q6.check()

# %%
# ex.q6.hint()
# ex.q6.solution()

# ## Summary
#
# - **Tensor parallelism** splits a layer's matrices: the first of a pair by output
#   features (columns of `A`, rows of a PyTorch weight), the second by input features,
#   so that one all-reduce per half-block sums the partial outputs; the backward pass
#   all-reduces the input's gradient. Per block: two all-reduces forward, two backward
#   (DTensor's `ColwiseParallel` adds one per projection that reads the same input),
#   each of the whole activation. Weights, gradients and optimizer state divide by *N*
#   but for the norms and the biases added after the sum; it equals one process.
# - Those all-reduces sit on the computation's path, and their bytes grow with tokens x
#   dim per layer: at data-sheet bandwidths they fit under the compute on NVLink, not
#   across nodes. Tensor parallelism stays inside a node.
# - **Sequence parallelism** splits the norms and the residual stream along the
#   sequence: the all-reduces become reduce-scatters and all-gathers, the same bytes
#   on a ring, and the activations that tensor parallelism left whole divide.
# - **Pipeline parallelism** gives each process whole layers and feeds them
#   micro-batches. The bubble, (*p*-1)/(*m*+*p*-1) at best, is measured here above the
#   formula (messages, the loss, the machine's load); GPipe and 1F1B have the same
#   bubble, but GPipe keeps all *m* micro-batches' activations on each stage, 1F1B at
#   most *p* - *s*. torch's `ScheduleGPipe`, `Schedule1F1B` and
#   `ScheduleInterleaved1F1B` run on gloo and equal one process.
# - **Context parallelism** splits one sequence into chunks: a ring of sends brings
#   every key/value chunk to every process, the partial softmaxes merge exactly by
#   their log-sum-exp, and the causal mask is a rule on global positions, which
#   leaves the later processes more work (the zig-zag ring balances it). Each
#   process keeps its chunk's share of the activations: they divide by *N*.
# - **Expert parallelism** places a mixture's experts on different processes: one
#   all-to-all sends each token to its expert's process, another brings the outputs
#   back, and the result is one process's. The busiest process sets the step, so the
#   router's balance (the Switch Transformer's balancing loss) decides the speed.
# - **The planner** plans every process of these layouts,
#   `memory.estimate_training_memory(..., layout=layouts.Layout(...), rank=r)`, equal
#   to the byte to the real runs of tensor (with sequence), pipeline and context
#   parallelism above, and plans a 70B-shaped model's processes on fake tensors: a
#   layout is judged by its fullest process.
# - **Meshes** give each parallelism its own dimension: FSDP x TP keeps the
#   all-reduces inside a row and FSDP's traffic across rows; HSDP shards inside a row
#   and all-reduces the sharded gradients across rows, once per step. Accelerate's
#   `ParallelismConfig` builds the same mesh (`dp_replicate`, `dp_shard`, `tp`, with a
#   joint `dp`), and refuses a CPU launch: on a CPU, call torch's `parallelize_module`
#   and `fully_shard` yourself.
