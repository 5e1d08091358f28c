# %% [markdown]
# # Lesson 10 — Plan your own run: from a model and a cluster to the command you launch
#
# Lessons 4-7 planned memory to the byte, lesson 8 measured speed, and the course's
# planner (`python -m course_utils.plan`) joins both with a step-time model whose
# every GPU figure is sourced. This lesson is the one you come back to with your
# own run: pick a model (a config the course ships, or your own `config.json`),
# a cluster, a sequence length and a token budget; the lesson plans every layout
# that fits, recommends one with its reasons, says what would change the choice,
# and writes what you would launch: an Accelerate config file, the `accelerate
# launch` and `torchrun` commands, and a training script on the course's loop.
# Then the same script runs here, scaled down, on two CPU processes, and each
# process's measured memory is put beside the plan of that scaled-down run.
#
# | section | the question |
# | --- | --- |
# | 1. your run | the model, the cluster, the length, the budget |
# | 2. every layout | memory per process by part, predicted step, tokens/s and days |
# | 3. the choice | the recommended layout, its reasons, what would change it |
# | 4. what you launch | the Accelerate config file, the commands, the script |
# | 5. the script, scaled down | two CPU processes; measured memory against the plan |
# | exercises | a 70B at the highest tokens/s; the days of a budget |
#
# Configs only, no weights: the models are built on the meta device, which holds
# no memory. GPU times are predictions from the cards' data sheets
# (`course_utils.hardware` names the source beside each figure), never measured here.
#
# The course's offline stand-ins of lessons 1-9 are not trained here: the
# tiny DistilBERT of `data/tiny-distilbert/` (for the `distilbert-base-cased`
# checkpoint; with internet `models.load_pretrained_classifier("distilbert-base-cased")`)
# and the paraphrase pairs of `data/paraphrase/` (for the GLUE MRPC dataset,
# `load_dataset("glue", "mrpc")`). The planner still takes that model by name
# (`python -m course_utils.plan "course DistilBERT" ...`). Here the models are
# the Hub configs, with random weights, and the batches random token ids: memory
# and time do not depend on what the weights learned or which tokens are read.

# %%
import inspect
import json
import tempfile
from pathlib import Path

from course_utils import hardware, launch_files, layout_choice, memory, parallel, plan, sharding, your_run
from course_utils.exercises import ____
from course_utils.exercises import lesson10 as ex
from course_utils.threads import use_course_threads
from course_utils.units import format_bytes

num_threads = use_course_threads()
print(f"shipped configs: {', '.join(plan.SHIPPED_CONFIGS)}")

# %% [markdown]
# ## 1. Your run
#
# Change these to yours. `MODEL` is a name of the shipped configs above
# (`data/model_configs/`, their README names each Hub source) or the path of a
# `config.json`. `CLUSTER` names a card of the course's table, the cards per
# node and the nodes (with the network between nodes when there are several).
# The precision is what the written script launches: fp32 weights with the
# forward pass under bf16 (Accelerate's `mixed_precision="bf16"`).

# %%
MODEL = "Llama 3.1 8B"
CLUSTER = {"card": "H100 SXM", "cards_per_node": 8, "nodes": 1}
SEQ_LEN = 4096
BATCH_SIZE = 1                  # sequences per process and micro-batch
CHECKPOINTING = True
TOKENS = 2e9                    # the token budget
PRECISION = "bf16-autocast"

model = plan.load_model(MODEL, PRECISION, CHECKPOINTING)
card = hardware.card(CLUSTER["card"])
print(f"{MODEL}: {sum(p.numel() for p in model.parameters()):,} parameters, {type(model).__name__}; "
      f"{CLUSTER['nodes']} x {CLUSTER['cards_per_node']} {card.name} of {format_bytes(card.memory.value)} "
      f"({card.memory.source})")

# %% [markdown]
# ## 2. Every layout
#
# `plan.plan_layouts` is the command's own call: for each layout, one process's
# step followed on fake tensors (lessons 4, 7 and 9: memory by part, to the byte on
# CPU) and the step-time model on the card's sourced figures (compute at the
# published achievable fraction of the peak, communication on the links, what
# overlaps, the optimizer step at the memory bandwidth). The search covers data
# parallelism, tensor parallelism inside a node (ZeRO over the rest) and one
# pipeline of every card; a pipeline's row shows its largest stage ("shown"),
# every stage planned, and a layout the planner does not plan keeps its time
# with the planner's reason printed under the table. The last column is the
# token budget over the predicted tokens/s.

# %%
rows = plan.plan_layouts(MODEL, **CLUSTER, seq_len=SEQ_LEN, batch_size=BATCH_SIZE, checkpointing=CHECKPOINTING,
                         precision=PRECISION, progress=True)
print(plan.format_table(rows, TOKENS))

# %% [markdown]
# ## 3. The choice, and what would change it
#
# The recommendation is the layout that fits with the most predicted tokens/s;
# every reason below is computed from the rows, as is every sentence about the
# others: a faster layout that does not fit would win on a card with the memory
# it lacks; a slower one loses on the part of the step that differs most.

# %%
capacity = card.memory.value
choice = layout_choice.recommend(rows, capacity)
if choice is None:
    print("no layout fits: more cards, checkpointing, a shorter sequence or LoRA (python -m course_utils.plan --help)")
else:
    chosen = choice["row"]
    print(f"recommended: {chosen['layout']} on {chosen['world_size']} processes, "
          f"{plan.days_for(TOKENS, chosen):,.2f} days for {TOKENS:.3g} tokens")
    for reason in choice["reasons"]:
        print(f"  - {reason}")
    print("what would change the choice:")
    for sentence in layout_choice.what_would_change(rows, capacity):
        print(f"  - {sentence}")

# %% tags=["nbval-check-output"]
fitting = [row for row in rows if row["fits"]]
print("the recommendation fits, and no layout that fits is predicted faster: "
      f"{choice is not None and all(row['time'].tokens_per_second <= chosen['time'].tokens_per_second for row in fitting)}")

# %% [markdown]
# ## 4. What you launch
#
# The Accelerate config file for the chosen layout: DDP is `MULTI_GPU`; ZeRO-2
# and ZeRO-3 are FSDP2 (`fsdp_version: 2`), each block its own unit
# (`fsdp_transformer_layer_cls_to_wrap`, the model's block class), ZeRO-2 keeping
# the gathered weights after the forward pass (`fsdp_reshard_after_forward:
# false`); ZeRO-1 has no FSDP form and goes through DeepSpeed's stage 1. The keys
# are those Accelerate 1.15 reads: the file loads with its own reader, and every
# FSDP key is one of `accelerate launch`'s `--fsdp_*` flags.

# %%
run_folder = Path(tempfile.mkdtemp(prefix="your_run_"))
layout = chosen["layout"]
config = launch_files.accelerate_config(layout, CLUSTER["cards_per_node"], CLUSTER["nodes"],
                                        block_class=launch_files.block_class_of(MODEL), checkpointing=CHECKPOINTING)
config_path = launch_files.write_yaml(config, run_folder / "accelerate_config.yaml")
print(config_path.read_text())

# %% tags=["nbval-check-output"]
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser

loaded = load_config_from_file(str(config_path))
flags = {action.dest for action in launch_command_parser()._actions}
print(f"Accelerate reads the file as {loaded.distributed_type}, {loaded.num_processes} processes on "
      f"{loaded.num_machines} machine(s); every FSDP key is a launch flag: "
      f"{all(key in flags for key in loaded.fsdp_config)}")

# %% [markdown]
# The commands, on node 0 (on node *i*, `--machine_rank i` / `--node_rank i`).
# The `torchrun` one carries the variables `accelerate launch` sets from the file
# for the script's `Accelerator` (read from `accelerate/utils/launch.py`).

# %%
script_arguments = ["--model", MODEL, "--layout", layout if layout != "zero1" else "ddp",
                    "--batch-size", str(BATCH_SIZE), "--seq-len", str(SEQ_LEN)] + (["--checkpointing"] * CHECKPOINTING)
for kind, command in launch_files.launch_commands(config, config_path, script_arguments).items():
    print(f"{kind}:\n  {command}\n")

# %% [markdown]
# The script is `course_utils/your_run.py`, the course's loop (lesson 6's
# training function: the accelerator, the model, the optimizer, `prepare`, the
# loop). On GPUs `prepare` applies the config file's layout. On CPU processes
# Accelerate 1.15 does not shard (lesson 7), so there the script calls torch's
# `fully_shard` on each block and the root itself: the FSDP2 the plugin applies.

# %%
print(inspect.getsource(your_run.training_function))

# %% [markdown]
# ## 5. The same script, scaled down, on two CPU processes
#
# The model's family with 2 blocks 64 wide and a 512-token vocabulary
# (`launch_files.scaled_down_config`: the same config.json, its sizes changed,
# the same transformers class), the chosen layout on 2 processes (ZeRO-1, which
# the script runs only on GPUs through DeepSpeed, becomes DDP here), 2 sequences
# of 32 tokens, in fp32. The script measures two steps under torch's trackers
# before it trains; the planner plans the same scaled-down set-up.

# %%
small_path = launch_files.scaled_down_config(MODEL, run_folder / "scaled_down")
small_layout = layout if layout in ("ddp", *your_run.SHARDED) else "ddp"
small_model = plan.load_model(str(small_path), "fp32")
print(f"scaled down: {type(small_model).__name__}, {sum(p.numel() for p in small_model.parameters()):,} parameters, "
      f"layout {small_layout}")
results = parallel.launch(your_run.training_function,
                          (your_run.RunConfig(str(small_path), small_layout, batch_size=2, seq_len=32, steps=2,
                                              cpu=True, measure=True),), num_processes=2, quiet=True, timeout=300)
plans = [memory.estimate_training_memory(small_model, "adamw", 2, 32, world_size=2, sharding=small_layout, rank=rank)
         for rank in (0, 1)]
for rank, (planned, result) in enumerate(zip(plans, results)):
    measured = result["memory"]
    for part in ("weights", "gradients", "optimizer_state", "activations", "peak"):
        print(f"process {rank} {part:>16}: planned {getattr(planned, part):>10,} B, measured {getattr(measured, part):>10,} B")
    print(f"process {rank} losses: {', '.join(f'{loss:.4f}' for loss in result['losses'])}")

# %% tags=["nbval-check-output"]
slack = sharding.largest_unit_bytes(small_model, world_size=2) if small_layout in your_run.SHARDED else 0
agree = [sharding.agrees_with_plan(planned, result["memory"], slack) for planned, result in zip(plans, results)]
print(f"every part equal to the plan on both processes, each peak at most {slack:,} B above it: {all(agree)}")

# %% [markdown]
# Every part equals the plan to the byte, and the peak too in most runs. Under
# FSDP a real process can hold one more gathered unit at its peak when gloo's
# thread finishes an all-gather early (lesson 7, section 4): the fake process
# group the planner runs in never has that timing, hence the slack above. What
# the scaled-down run does not check: the GPU's bf16 mixed-precision policy,
# NCCL's own buffers (outside PyTorch's allocator), and the step times, which
# are the data sheets' predictions (lesson 8 checks the time model on this CPU).

# %% [markdown]
# ## Exercises
#
# ### Exercise 1 — A 70B at the highest tokens/s
#
# Llama 3.1 70B on 4 nodes of 8 H100 SXM (`ex.q1_cluster`), one sequence of
# 4,096 tokens per process, checkpointing, bf16 (`ex.q1_run`). Set `my_layout`
# to the layout that fits and is predicted to train the most tokens per second.
# The check plans your layout with the planner and the time model; any layout as
# fast is accepted, and a layout that does not fit is told which part of its memory it needs.

# %%
# BEGIN SOLUTION
q1_rows = plan.plan_layouts(ex.q1_run["model"], **ex.q1_cluster, seq_len=ex.q1_run["seq_len"],
                            batch_size=ex.q1_run["batch_size"], checkpointing=ex.q1_run["checkpointing"],
                            precision=ex.q1_run["precision"])
my_layout = max((row for row in q1_rows if row["fits"]), key=lambda row: row["time"].tokens_per_second)["layout"]
# END SOLUTION
# BEGIN STARTER
# my_layout = ____
# END STARTER

ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2 — The days of a token budget
#
# Write `days_for_budget(tokens, row)`: the days a run of `tokens` training
# tokens takes at the predicted throughput of `row` (one of `plan_layouts`'
# rows). The check runs it on rows of its own (one process and many).

# %%
# BEGIN SOLUTION
def days_for_budget(tokens, row):
    return tokens / row["time"].tokens_per_second / 86400
# END SOLUTION
# BEGIN STARTER
# def days_for_budget(tokens, row):
#     ____
# END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ## Summary
#
# - The planner you keep: `python -m course_utils.plan MODEL --card CARD --cards-per-node N --nodes M --tokens T`
#   prints the table of section 2 (`--json` for scripts).
# - The choice is the layout that fits with the most predicted tokens/s; what
#   would change it is the memory a faster layout lacks, or the part of the step a slower one loses on.
# - What you launch is a config file, one command per node, and the course's loop;
#   the same script, scaled down, holds the memory the planner promised, part by part.
