# %% [markdown]
# # Lesson 9 — When one layer is too big, or activations do not divide: tensor, sequence and pipeline parallelism, and meshes
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

from course_utils import comm_time, launcher, meshes, parallel, pipeline, sharding, tensor_parallel
from course_utils.exercises import ____
from course_utils.exercises import lesson9 as ex
from course_utils.plots.pipeline import plot_pipeline_timeline
from course_utils.units import format_bytes

launcher.silence_library_progress_bars()
# Each launch takes seconds; past this limit the launcher stops every worker and raises WorkerTimeout, saying so.
LAUNCH_TIMEOUT_S = 120
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
for link, (bandwidth, source) in comm_time.LINKS.items():
    if "PCIe" in link:
        continue
    tp_seconds[link] = comm_time.seconds_on(link, sent)
    print(f"{link}: {bandwidth / 1e9:.0f} GB/s per GPU and direction ({source}): at least {tp_seconds[link]:.3f} s")
print(f"all-reduces per GPU per step: {per_block} per block x {LAYERS} blocks, {format_bytes(sent)} sent")
print(f"the step's compute per GPU at the peak ({comm_time.GPU_PEAKS[peak_name][1]}): at least {compute_s:.3f} s")

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
# `meshes.apply_layout` is the whole of it:

# %%
print(inspect.getsource(meshes.apply_layout))

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
# - **Meshes** give each parallelism its own dimension: FSDP x TP keeps the
#   all-reduces inside a row and FSDP's traffic across rows; HSDP shards inside a row
#   and all-reduces the sharded gradients across rows, once per step. Accelerate's
#   `ParallelismConfig` builds the same mesh (`dp_replicate`, `dp_shard`, `tp`, with a
#   joint `dp`), and refuses a CPU launch: on a CPU, call torch's `parallelize_module`
#   and `fully_shard` yourself.
