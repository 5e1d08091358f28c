# %% [markdown]
# # Lesson 4 — The memory of a training step: where it goes, when it peaks, and a planner for any model
#
# Lessons 2 and 3 counted one part of training memory: the optimizer's state.
# A training step holds three more, and the question people actually ask is
# "will this fine-tuning run fit on my GPU?". That is a question about the
# **peak**: the most memory the step holds at any one moment.
#
# In this lesson you will
#
# 1. take one step apart: its four parts (weights, gradients, optimizer state,
#    activations) and the three moments where the peak can fall (end of the
#    forward pass, during the backward pass, the optimizer step), block by block;
# 2. meet the course's **planner**, which follows one training step of any model on
#    fake tensors (no memory used), and check it against a real measurement;
# 3. see what mixed precision keeps in fp32, and what pure bf16 storage halves;
# 4. plan real architectures people fine-tune, BERT-base, GPT-2 with its LM head,
#    Llama- and Mistral-shaped causal LMs, up to 70B parameters, against the GPUs you know;
# 5. explore every combination of model, optimizer, precision, batch, length,
#    checkpointing and accumulation;
# 6. hold the planner, the tracker and the allocator side by side, and watch one
#    step's memory operation by operation; and practise with two exercises.
#
# Everything runs on a laptop CPU, without internet. Full-size models are built
# on the meta device: the planner needs their shapes, not their weights.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")` and the data line
# `load_dataset("glue", "mrpc")`; the learning rate changes too, from the tiny
# model's 1e-3 to about 2e-5 to 5e-5 for `distilbert-base-cased`.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import math

import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from course_utils import data, gpus, memory, models, optimizers, plots
from course_utils.exercises import ____
from course_utils.exercises import lesson4 as ex
from course_utils.units import GB, GIB, MIB, format_bytes

# %% [markdown]
# ## 1. Four parts and three moments
#
# A training step of a model with $P$ parameters holds:
#
# - the **weights**: $P$ numbers (4 bytes each in fp32), during the whole step;
# - the **optimizer state**: for AdamW two moving averages, $2P$ numbers, also
#   during the whole step (lessons 2 and 3);
# - the **gradients**: $P$ numbers, created during the backward pass and kept
#   until the optimizer has used them;
# - the **activations**: what the forward pass saves for the backward pass to
#   use. They grow with the batch size and the sequence length, and with the
#   model's width and depth: on the same tokens, a bigger model holds more.
#
# They are never all alive at once. The peak falls at one of three moments:
#
# 1. **the end of the forward pass**: weights + state + every activation;
# 2. **during the backward pass**: the backward pass goes from the last block to
#    the first, creating each block's gradients and freeing the activations that
#    block saved; so activations go down while gradients go up;
# 3. **the optimizer step**: weights + state + every gradient, plus the step's
#    own temporaries; activations are gone.
#
# The course has an analytical model of where the bytes go, for DistilBERT,
# BERT and GPT-2 in fp32 (`memory.explain_training_memory`), block by block.
# Here is distilbert-base-cased (built on the meta device: shapes, no weights),
# AdamW, a small batch of `EXPLAINED_BATCH` sequences of `EXPLAINED_SEQ_LEN` tokens:

# %% tags=["nbval-check-output"]
architectures = models.fine_tuning_architectures()  # section 3 says what it builds
distilbert = architectures["distilbert-base-cased"]
EXPLAINED_BATCH, EXPLAINED_SEQ_LEN = 8, 64
explained = memory.explain_training_memory(distilbert, "adamw", batch_size=EXPLAINED_BATCH, seq_len=EXPLAINED_SEQ_LEN)


def print_parts(step):
    print(f"  weights {format_bytes(step.weights)}, gradients {format_bytes(step.gradients)}, "
          f"optimizer state {format_bytes(step.optimizer_state)}, activations {format_bytes(step.activations)}")


print(f"distilbert-base-cased, AdamW, batch of {EXPLAINED_BATCH} x {EXPLAINED_SEQ_LEN} tokens:")
print_parts(explained)
print(f"activations: embeddings {format_bytes(explained.embeddings)} + {explained.layers} blocks x "
      f"{format_bytes(sum(explained.per_block.values()))} + head {format_bytes(explained.head)}; each block keeps:")
for part, size in explained.per_block.items():
    print(f"  {part:>48}: {format_bytes(size)}")
assert explained.activations == explained.embeddings + explained.layers * sum(explained.per_block.values()) + explained.head

# %% [markdown]
# Each block keeps copies of its attention's inputs and outputs, the attention
# probabilities (one number per pair of tokens, per head), the feed-forward
# layer's input to its activation function, and the masks of its dropouts. How
# each part grows, by doubling the batch and then the length:

# %% tags=["nbval-check-output"]
double_batch = memory.explain_training_memory(distilbert, "adamw", batch_size=2 * EXPLAINED_BATCH, seq_len=EXPLAINED_SEQ_LEN)
double_length = memory.explain_training_memory(distilbert, "adamw", batch_size=EXPLAINED_BATCH, seq_len=2 * EXPLAINED_SEQ_LEN)
print(f"{'each block keeps':>48}  x2 batch  x2 length")
for part, size in explained.per_block.items():
    print(f"{part:>48}  {double_batch.per_block[part] / size:6.2f}x  {double_length.per_block[part] / size:7.2f}x")

# %% [markdown]
# Everything doubles with the batch. With the length, everything doubles too,
# except the attention probabilities, which grow with the *square* of the
# length: the reason long sequences are expensive. And on the same tokens, the
# activations grow with the model: each block keeps tensors as wide as the
# model, and there is one set per block. Three models of this family on the
# same batch:

# %% tags=["nbval-check-output"]
print(f"{'model':>31} {'width':>6} {'blocks':>7} {'parameters':>12} {'activations':>12}  on {EXPLAINED_BATCH} x {EXPLAINED_SEQ_LEN} tokens")
for name in ("course model (tiny DistilBERT)", "distilbert-base-cased", "BERT-base classifier"):
    model = architectures[name]
    step = memory.explain_training_memory(model, "adamw", batch_size=EXPLAINED_BATCH, seq_len=EXPLAINED_SEQ_LEN)
    config = model.config
    print(f"{name:>31} {config.hidden_size:>6} {config.num_hidden_layers:>7} {models.count_parameters(model):>12,} "
          f"{format_bytes(step.activations):>12}")

# %% [markdown]
# So a model's activations depend on both: the tokens of a batch, and the
# width and depth of the model they pass through. Now the three moments of the
# same step (`peak_by_phase`), and what each holds on top of the weights and the
# state, which are held throughout:

# %% tags=["nbval-check-output"]
def print_moments(step):
    held = step.weights + step.optimizer_state
    for phase, peak in step.peak_by_phase.items():
        marker = "  <- the peak" if phase == step.phase_of_peak else ""
        print(f"  {phase:>15}: {format_bytes(peak)} = weights and state {format_bytes(held)} "
              f"+ {format_bytes(peak - held)}{marker}")


print_moments(explained)
forward_extra = explained.peak_by_phase["forward"] - explained.weights - explained.optimizer_state - explained.activations
step_extra = explained.peak_by_phase["optimizer step"] - explained.weights - explained.optimizer_state - explained.gradients
print(f"forward: activations {format_bytes(explained.activations)} + {format_bytes(forward_extra)} of temporaries")
print(f"optimizer step: gradients {format_bytes(explained.gradients)} + {format_bytes(step_extra)} of the step's temporaries")

# %% [markdown]
# At this small batch the peak is in the optimizer step: the activations of
# this batch weigh less than the gradients. The usual rule of thumb, 16 bytes per
# parameter for training with Adam (4 of weights, 4 of gradients, 8 of state; it
# is what `accelerate estimate-memory` reports), counts no activations and no
# temporaries. Against the batches people train with:

# %% tags=["nbval-check-output"]
rule = memory.rule_of_thumb_training_memory(distilbert)
print(f"16 bytes per parameter: {format_bytes(rule)}")
print(f"{'batch x tokens':>15} {'activations':>12} {'peak':>11}  phase of the peak   peak / rule")
for sequences, tokens in [(8, 64), (16, 128), (32, 256), (8, 512)]:
    step = memory.explain_training_memory(distilbert, "adamw", batch_size=sequences, seq_len=tokens)
    print(f"{sequences:>6} x {tokens:<6}  {format_bytes(step.activations):>12} {format_bytes(step.peak):>11}"
          f"  {step.phase_of_peak:<18} {step.peak / rule:.1f}x")

# %% [markdown]
# ## 2. The planner, checked against a measurement
#
# The analytical model explains; it covers three model families in fp32 and
# nothing else. The **planner**, `memory.estimate_training_memory`, covers any
# model: it rebuilds the model on *fake tensors* (tensors with a shape, a dtype
# and a device but no data: nothing is allocated, nothing computed), runs one
# whole training step on them under PyTorch's memory tracker `MemTracker`, and
# reads the peak. It is the same code that measures a real step
# (`memory.measure_training_step_peak`), run without memory. A deep model is a
# stack of identical blocks, so the planner runs copies with one, two and three
# blocks, checks that each block adds the same bytes (sliding to deeper copies
# when it does not), and extrapolates to the full depth: a 70B-shaped model
# plans in seconds. A shallow model is simply run whole.
#
# First, on the model section 1 explained: the planner follows the step the
# analytical model describes, and they agree:

# %% tags=["nbval-check-output"]
planned = memory.estimate_training_memory(distilbert, "adamw", batch_size=EXPLAINED_BATCH, seq_len=EXPLAINED_SEQ_LEN)
for label, step in (("explained", explained), ("planned", planned)):
    print(f"{label:>10}: peak {format_bytes(step.peak, 2)} in the {step.phase_of_peak}; by phase: "
          + ", ".join(f"{phase} {format_bytes(peak, 2)}" for phase, peak in step.peak_by_phase.items()))
print(f"largest difference between the two, over the three phases: "
      f"{max(abs(planned.peak_by_phase[p] - explained.peak_by_phase[p]) for p in memory.PHASES) / MIB:.2f} MiB")

# %% [markdown]
# Now the course model, on a real batch of the course data (sentence pairs,
# padded to the longest in the batch: its shape is printed), checked against a
# real measurement of the same step.
# The batch holds `input_ids` and `labels` only, as the planner's does: without
# the attention mask, padded positions would be attended to and the *outputs*
# would change, but the memory depends on the tensors' shapes, not on which
# positions are masked. The cell measures the step both ways to show it.

# %%
train_dataloader, _ = data.make_dataloaders(batch_size=32, seed=0)
course_batch = next(iter(train_dataloader))
batch_size, seq_len = course_batch["input_ids"].shape


def measured_step(batch):
    """Measure one AdamW step of a fresh copy of the course model on ``batch``; return its TrainingMemory."""
    model = models.load_pretrained_classifier()
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=1e-3)
    return memory.measure_training_step_peak(model, optimizer, batch)


course_model = architectures["course model (tiny DistilBERT)"]
course_planned = memory.estimate_training_memory(course_model, "adamw", batch_size, seq_len)
course_measured = measured_step({"input_ids": course_batch["input_ids"], "labels": course_batch["labels"]})
with_mask = measured_step({key: course_batch[key] for key in ("input_ids", "attention_mask", "labels")})
print(f"batch of {batch_size} x {seq_len} tokens")
for label, step in (("planned", course_planned), ("measured", course_measured)):
    print(f"{label:>9}: peak {format_bytes(step.peak, 2)} in the {step.phase_of_peak}")
    print_parts(step)
print(f"planned - measured: {(course_planned.peak - course_measured.peak) / MIB:+.3f} MiB")
print(f"measured with the attention mask too: peak {format_bytes(with_mask.peak, 2)}, "
      f"the same: {with_mask.peak == course_measured.peak}")

# %% [markdown]
# Side by side with the rule of thumb. Each bar is as tall as the **peak**,
# not the sum of the four parts: its bottom is what is held throughout (weights
# and optimizer state), its top what the peak's phase adds.

# %%
def rule_of_thumb_step(model):
    """The 16-bytes-per-parameter rule as a step: 4 weights + 8 state held, 4 of gradients on top, at the step."""
    total = memory.rule_of_thumb_training_memory(model)
    return {"weights": total // 4, "optimizer_state": total // 2, "gradients": total // 4, "activations": 0,
            "peak": total, "phase_of_peak": "optimizer step"}


figure = plots.plot_training_memory_breakdown(
    {"rule of thumb\n(16 B/param)": rule_of_thumb_step(course_model), "planned\n(fake tensors)": course_planned,
     "measured\n(real step)": course_measured},
    title=f"The course model, fp32, AdamW: one training step on {batch_size} x {seq_len} tokens",
)

# %% [markdown]
# For a small model the rule is not even close: the activations of one batch
# weigh many times the model.
#
# ### Mixed precision is not pure bf16
#
# Two different things are both called "bf16 training":
#
# - **mixed precision**, what `Accelerator(mixed_precision="bf16")` and
#   `TrainingArguments(bf16=True)` do: the weights, the gradients and the
#   optimizer state stay fp32; the forward pass runs under autocast, which
#   computes (and saves for the backward pass) in bf16 where it is safe;
# - **pure bf16 storage**: the model itself is bf16 (`from_pretrained(...,
#   dtype=torch.bfloat16)`), so the weights, the gradients and AdamW's state
#   are all bf16: half the bytes of each.
#
# The planner follows both (`mixed_precision="bf16"`, and a model built in
# bf16). On the course model's step:

# %% tags=["nbval-check-output"]
bf16_architectures = models.fine_tuning_architectures(torch.bfloat16)
course_bf16 = bf16_architectures["course model (tiny DistilBERT)"]
precisions = {
    "fp32": memory.estimate_training_memory(course_model, "adamw", batch_size, seq_len),
    "bf16 mixed precision": memory.estimate_training_memory(course_model, "adamw", batch_size, seq_len,
                                                            mixed_precision="bf16"),
    "pure bf16": memory.estimate_training_memory(course_bf16, "adamw", batch_size, seq_len),
}
for label, step in precisions.items():
    print(f"{label:>21}: peak {format_bytes(step.peak, 2)} ({step.phase_of_peak})")
    print_parts(step)
mixed, fp32 = precisions["bf16 mixed precision"], precisions["fp32"]
print("mixed precision keeps fp32 weights, gradients and state: "
      f"{(mixed.weights, mixed.gradients, mixed.optimizer_state) == (fp32.weights, fp32.gradients, fp32.optimizer_state)}")

# %% [markdown]
# Pure bf16 storage halves the weights, the gradients and the state. Mixed
# precision keeps those in fp32 and changes only the activations: most of them
# are saved in bf16, half the bytes, but autocast also keeps, for the backward
# pass, the bf16 copy of every weight it casts. That copy does not grow with
# the batch. To see it, plan the same step at half the batch: what does not
# halve is what the step keeps whatever the batch.

# %% tags=["nbval-check-output"]
linear_weights = sum(m.weight.numel() for m in course_model.modules() if isinstance(m, torch.nn.Linear))
halves = {label: memory.estimate_training_memory(course_model, "adamw", batch_size // 2, seq_len, mixed_precision=mixed_precision)
          for label, mixed_precision in (("fp32", "no"), ("bf16 mixed precision", "bf16"))}
for label, half in halves.items():
    full = precisions[label]
    fixed = 2 * half.activations - full.activations
    print(f"{label:>21}: activations {format_bytes(full.activations, 2)} at batch {batch_size}, "
          f"{format_bytes(half.activations, 2)} at {batch_size // 2}: {fixed:,} bytes do not depend on the batch")
print(f"2 bytes x the {linear_weights:,} weights of the model's Linear layers = {2 * linear_weights:,} bytes")

# %% [markdown]
# On the course model, whose activations dominate, mixed precision saves memory;
# on a big model at a small batch, the bf16 weight copies can cost more than
# the bf16 activations save (section 3 shows one). This is why the ZeRO paper's famous **16 bytes per parameter** is a
# *mixed-precision* count, and a different one from the fp32 rule above: fp16
# weights (2) and gradients (2) for the compute, plus an fp32 master copy of
# the weights (4) and Adam's two fp32 moments (4 + 4): 2 + 2 + 4 + 4 + 4 = 16.
# Accelerate's and the Trainer's mixed precision keep a single fp32 copy of the
# weights and cast on the fly, so they land on 4 + 4 + 8 = 16 by another route.
#
# ## 3. The models people fine-tune, up to 70B
#
# `models.fine_tuning_architectures()` builds, on the meta device, the models
# people fine-tune, with their heads: a BERT-base classifier, GPT-2 with its
# language-model head (tied to its embeddings), and Llama- and Mistral-shaped
# causal LMs. Mistral-7B and Llama-2-70B use **grouped-query attention**: fewer
# key/value heads than query heads, so their key and value projections are
# smaller than the query's:

# %% tags=["nbval-check-output"]
for name, model in architectures.items():
    attention = next((m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "q_proj")), None)
    shapes = (f"; attention q_proj {tuple(attention.q_proj.weight.shape)}, k_proj {tuple(attention.k_proj.weight.shape)}"
              if attention is not None else "")
    print(f"{name:>31}: {models.count_parameters(model):>14,} parameters{shapes}")

# %% [markdown]
# The explorer below and the course's benchmarks plan the models of this same
# builder. Two details of it are easy to miss when you build a causal LM
# yourself:
#
# - with `checkpointing=True` it calls `activation_checkpointing_enable()` and
#   switches off the key/value cache (`config.use_cache`): the cache is for
#   generation, not for training;
# - it names GPT-2's loss (`loss_type = "ForCausalLM"`): transformers picks a
#   model's loss from its class name, and `GPT2LMHeadModel` names none, as the
#   cell below shows for a GPT-2 built directly. Nothing breaks without it:
#   on the first loss transformers warns once (on stderr) and uses the
#   causal-LM loss anyway. The builder names it so that the warning never
#   lands in the middle of a planner run; the cell catches it to show it.

# %% tags=["nbval-check-output"]
import logging

import transformers
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.loss.loss_utils import LOSS_MAPPING

checkpointed_architectures = models.fine_tuning_architectures(checkpointing=True)
for label, built in (("as built", architectures), ("checkpointing=True", checkpointed_architectures)):
    gpt2 = built["GPT-2 with its LM head"]
    print(f"{label:>18}: activation checkpointing {gpt2.is_activation_checkpointing}, "
          f"key/value cache {gpt2.config.use_cache}, loss_type {gpt2.loss_type!r}")
with torch.device("meta"):
    plain_gpt2 = GPT2LMHeadModel(GPT2Config())
print(f"GPT2LMHeadModel built directly: loss_type {plain_gpt2.loss_type!r}")


class KeepMessages(logging.Handler):
    """Keep the messages transformers logs, instead of printing them on stderr."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


caught = KeepMessages()
# transformers says this once per process (warning_once remembers what it said): forget it,
# so that the cell shows the warning every time it runs, as a fresh kernel does.
transformers.utils.logging.warning_once.cache_clear()
transformers.utils.logging.disable_default_handler()
transformers.utils.logging.add_handler(caught)
try:
    chosen_loss = plain_gpt2.loss_function  # what the forward pass calls to compute the loss
finally:
    transformers.utils.logging.remove_handler(caught)
    transformers.utils.logging.enable_default_handler()
print(f"transformers warns: {caught.messages}")
print(f"and the loss it uses is the causal-LM loss: {chosen_loss is LOSS_MAPPING['ForCausalLM']}")

# %% [markdown]
# The figure learners come for: the planned peak of one training step against
# the parameter count, from the course model to 70B, on a batch of
# `FIGURE_BATCH` sequences of `FIGURE_SEQ_LEN` tokens, with the memory of
# GPUs you know marked as the cards themselves report it (the table below). One line per optimizer and precision:
# each of the course's optimizers (lessons 2 and 3) in bf16 mixed precision,
# which is what `Accelerator(mixed_precision="bf16")` and the Trainer's
# `bf16=True` do, and AdamW in fp32 and pure bf16 as well. On the log scale of
# the left panel the lines run close together; the right panel divides each
# peak by the parameter count, where they come apart. Each point is one planner
# run, a few seconds at most.

# A card sold as "24 GB" does not hold 24 GiB: vendors label memory in
# decimal units, and the driver reports it in binary ones, which is what a plan
# in bytes must be compared with. `course_utils.gpus` holds the cards as
# `nvidia-smi` reports them, each read from an output pasted in a public
# issue (the source is beside each value in the module):

# %% tags=["nbval-check-output"]
print(f"{'card':>17} {'nvidia-smi':>11} {'GiB':>6} {'GB':>6}")
for card, mib in gpus.GPU_MEMORY_MIB.items():
    print(f"{card:>17} {mib:>7,} MiB {mib * MIB / GIB:>6.2f} {mib * MIB / GB:>6.2f}")
display(Markdown(f"> {gpus.HEADROOM_NOTE}"))

# %%
# The course's optimizers as the planner names them, with their options. "AdamW, foreach" (the CUDA
# default: one more copy of the parameters during the step) is for the explorer below.
OPTIMIZERS = {"AdamW": ("adamw", {}), "AdamW, foreach": ("adamw", {"foreach": True}),
              "SGD with momentum": ("sgd", {"momentum": 0.9}), "Adafactor": ("adafactor", {}),
              "8-bit AdamW": ("adamw8bit", {})}
# Each precision: the dtype the model is built in, and Accelerate's mixed_precision.
PRECISIONS = {"fp32": (torch.float32, "no"), "bf16 mixed precision": (torch.float32, "bf16"),
              "pure bf16": (torch.bfloat16, "no")}
built_architectures = {(torch.float32, False): architectures, (torch.bfloat16, False): bf16_architectures,
                       (torch.float32, True): checkpointed_architectures}


def plan_step(model_name, dtype, checkpointing, setup):
    """The planner's TrainingMemory (bytes) of ``setup`` (a memory.TrainingSetup) on the model built in ``dtype``.

    Raises PlannerRefused (a ValueError) with the reason.
    """
    if (dtype, checkpointing) not in built_architectures:  # each combination built once, when first asked for
        built_architectures[dtype, checkpointing] = models.fine_tuning_architectures(dtype, checkpointing)
    return memory.plan(built_architectures[dtype, checkpointing][model_name], setup)


def labelled_step(model_name, optimizer_label, precision, batch_size, seq_len):
    """plan_step for the labels of OPTIMIZERS and PRECISIONS, no checkpointing, one micro-batch per step."""
    optimizer_name, options = OPTIMIZERS[optimizer_label]
    dtype, mixed_precision = PRECISIONS[precision]
    setup = memory.TrainingSetup(optimizer_name, batch_size, seq_len, mixed_precision, options=options)
    return plan_step(model_name, dtype, False, setup)


FIGURE_BATCH, FIGURE_SEQ_LEN = 4, 128
# BERT-base and Llama-2-7B are in the explorer below: each point costs a planner run.
FIGURE_MODELS = ["course model (tiny DistilBERT)", "GPT-2 with its LM head", "Mistral-7B-shaped (GQA)",
                 "Llama-2-70B-shaped (GQA)"]
# (optimizer, precision) of each line: every optimizer in mixed precision, AdamW in all three precisions.
FIGURE_LINES = [("AdamW", "fp32"), ("AdamW", "bf16 mixed precision"), ("AdamW", "pure bf16"),
                ("SGD with momentum", "bf16 mixed precision"), ("Adafactor", "bf16 mixed precision"),
                ("8-bit AdamW", "bf16 mixed precision")]
figure_steps = {line: {} for line in FIGURE_LINES}
refusals = []
with tqdm(total=len(FIGURE_MODELS) * len(FIGURE_LINES), desc="planning") as progress:
    for name in FIGURE_MODELS:
        for optimizer_label, precision in FIGURE_LINES:
            try:
                figure_steps[optimizer_label, precision][name] = labelled_step(
                    name, optimizer_label, precision, FIGURE_BATCH, FIGURE_SEQ_LEN)
            except memory.PlannerRefused as refusal:
                refusals.append(f"{optimizer_label}, {precision}, {name}: {refusal}")
            progress.update()
print(f"{progress.n - len(refusals)} of {progress.n} points planned, "
      + (f"{len(refusals)} refused by the planner:\n  " + "\n  ".join(refusals) if refusals else "none refused"))
parameter_counts = {name: models.count_parameters(architectures[name]) for name in FIGURE_MODELS}
figure = plots.plot_peak_memory_vs_parameters(
    parameter_counts,
    {f"{o}, {p}": {name: step.peak for name, step in by_model.items()} for (o, p), by_model in figure_steps.items()},
    groups={f"{o}, {p}": (o, p) for o, p in FIGURE_LINES},
    title=f"Planned peak of one training step, {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens, against model size",
)

# %% tags=["nbval-check-output"]
def smallest_gpu(peak):
    """The smallest of the marked cards whose reported memory holds ``peak`` bytes, or None (no headroom left)."""
    return gpus.smallest_card_holding(peak)


short_names = {name: name.split(" with")[0].split(" (")[0].removesuffix("-shaped") for name in FIGURE_MODELS}
print(f"peak, and the smallest of the marked GPUs that holds it ({FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens):")
print(f"{'':>39}" + "".join(f"{short_names[name]:>21}" for name in FIGURE_MODELS))
for (optimizer_label, precision), by_model in figure_steps.items():
    cells = []
    for name in FIGURE_MODELS:
        step = by_model.get(name)
        gpu = smallest_gpu(step.peak) if step else None
        cells.append(f"{format_bytes(step.peak):>10} {gpu.split(' (')[0] if gpu else 'none':>9}" if step else f"{'refused':>20}")
    print(f"{optimizer_label + ', ' + precision:>39}" + "".join(f"{cell:>21}" for cell in cells))

# %%
def bytes_per_parameter(line, name, part="peak"):
    return getattr(figure_steps[line][name], part) / parameter_counts[name]


def listed(items):
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


largest, seven_b = FIGURE_MODELS[-1], "Mistral-7B-shaped (GQA)"
fp32_line, mixed_line, pure_line = FIGURE_LINES[:3]
mixed_lines = [line for line in FIGURE_LINES if line[1] == "bf16 mixed precision" and seven_b in figure_steps[line]]
mixed_above_fp32 = [name for name in FIGURE_MODELS if figure_steps[mixed_line][name].peak > figure_steps[fp32_line][name].peak]
mixed_reading = (f"mixed precision holds more than fp32 for {listed(mixed_above_fp32)}: at this batch its bf16 weight "
                 "copies outweigh what its bf16 activations save" if mixed_above_fp32
                 else "mixed precision never holds more than fp32 here")
seven_b_gpus = {line: smallest_gpu(by_model[seven_b].peak) for line, by_model in figure_steps.items() if seven_b in by_model}
seven_b_fits = [f"{o} in {p} ({gpu})" for (o, p), gpu in seven_b_gpus.items() if gpu]
seven_b_fits_none = [f"{o} in {p}" for (o, p), gb in seven_b_gpus.items() if not gb]
largest_fits = [f"{o} in {p}" for (o, p), by_model in figure_steps.items()
                if largest in by_model and smallest_gpu(by_model[largest].peak)]
seven_b_reading = (f"{seven_b} fits on one of the marked GPUs with {listed(seven_b_fits)}" if seven_b_fits
                   else f"{seven_b} fits on none of the marked GPUs") + (
    f"; with {listed(seven_b_fits_none)}, on none of them" if seven_b_fits and seven_b_fits_none else "")
largest_reading = (f"{largest} fits on one of them with {listed(largest_fits)}" if largest_fits
                   else f"no line puts {largest} on one of them")
eight_bit_seven_b = figure_steps["8-bit AdamW", "bf16 mixed precision"].get(seven_b)
cpu_terms = ("" if eight_bit_seven_b is None else
             f" The 8-bit AdamW points include this CPU's update temporaries, "
             f"{format_bytes(eight_bit_seven_b.peak_by_phase['optimizer step'] - eight_bit_seven_b.weights - eight_bit_seven_b.optimizer_state - eight_bit_seven_b.gradients)} "
             f"for {seven_b} (its peak is in the {eight_bit_seven_b.phase_of_peak}), which bitsandbytes' CUDA kernel "
             "does not make; the other lines follow this CPU's attention and optimizer kernels too (the note below, and "
             "section 4 shows one bar both ways).")
display(Markdown(f"""
Read along a line: for the big models the weights, gradients and state
dominate, and the peak is nearly a fixed number of bytes per parameter. With AdamW in
fp32 that is {bytes_per_parameter(fp32_line, seven_b):.1f} bytes per parameter
for {seven_b} and {bytes_per_parameter(fp32_line, largest):.1f} for {largest},
against {bytes_per_parameter(fp32_line, FIGURE_MODELS[0]):,.0f} for the course model,
whose activations outweigh it.

Read across precisions: mixed precision lands at
{bytes_per_parameter(mixed_line, seven_b):.1f} bytes per parameter for {seven_b}
(it keeps fp32 weights, gradients and state); pure bf16 storage at
{bytes_per_parameter(pure_line, seven_b):.1f}; and {mixed_reading}.

Read across optimizers, all in mixed precision, for {seven_b}:
{listed([f"{o} at {bytes_per_parameter((o, p), seven_b):.1f} bytes per parameter (peak in the {figure_steps[o, p][seven_b].phase_of_peak})" for o, p in mixed_lines])}.
The optimizer's state makes the difference: per parameter, it holds
{listed([f"{bytes_per_parameter((o, p), seven_b, 'optimizer_state'):.3g} bytes with {o}" for o, p in mixed_lines])}.

And the GPU lines, on these {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens, counting each card's whole reported
memory (leave the headroom said above): {seven_b_reading};
{largest_reading}.{cpu_terms} Lesson 5 pulls the levers that move these points down.
"""))

# %% [markdown]
# **What changes on a GPU.** The planner follows this machine's CPU kernels,
# and says so:

# %%
display(Markdown(f"> {memory.DEVICE_NOTE}"))

# %% [markdown]
# ## 4. Explore
#
# Every combination of model, optimizer, precision, batch, length, activation
# checkpointing and gradient accumulation, planned when you choose it (a few
# seconds the first time, with a progress bar counting the copies of the model
# the planner has followed; instantly when you come back to it). The chart shows
# the peak, with the phase it falls in, and beside it, for comparison, AdamW on the
# same set-up: what the optimizer you chose saves. A set-up the planner cannot
# follow says why instead of giving a number.

# %%
explorer = plots.training_memory_explorer(
    list(architectures), plan_step, OPTIMIZERS, PRECISIONS,
    batch_sizes=(1, 2, 4, 8, 16, 32), seq_lens=(128, 256, 512, 1024, 2048), reference_optimizer="AdamW",
    initial={"model": "GPT-2 with its LM head", "optimizer": "AdamW", "precision": "bf16 mixed precision",
             "batch_size": FIGURE_BATCH, "seq_len": FIGURE_SEQ_LEN},
)
explorer

# %% [markdown]
# The widgets need a running kernel. In a static copy of this notebook, here
# is the explorer's figure for GPT-2 with its LM head, for every line of the
# figure above, from its planner runs:

# %%
figure = plots.plot_training_memory_breakdown(
    {f"{o}\n{p}": by_model["GPT-2 with its LM head"] for (o, p), by_model in figure_steps.items()
     if "GPT-2 with its LM head" in by_model},
    title=f"GPT-2 with its LM head: one training step on {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens (planned)",
    xlabel="optimizer and precision",
)

# %% [markdown]
# **Which terms are this CPU's.** The 8-bit AdamW bar peaks in the optimizer
# step because of this machine's bitsandbytes: its CPU update is written in
# torch operations, which make fp32 working copies of each parameter's states
# while they update it, and the planner follows them (it runs that CPU code on
# fake tensors). bitsandbytes' CUDA kernel updates the weights and the 8-bit
# states in place, without those copies. The step's temporaries are what the
# optimizer step holds beyond weights, state and gradients; the same bar
# without them is what a GPU would see, everything else unchanged. AdamW is
# planned beside it with `foreach=True`, the CUDA default (one more copy of the
# parameters during its step):

# %% tags=["nbval-check-output"]
def without_step_temporaries(step):
    """``step`` (a TrainingMemory) as a dict of bytes with the optimizer step's temporaries taken out."""
    phases = dict(step.peak_by_phase)
    phases["optimizer step"] = step.weights + step.optimizer_state + step.gradients
    phase = max(phases, key=phases.get)
    return {"weights": step.weights, "gradients": step.gradients, "optimizer_state": step.optimizer_state,
            "activations": step.activations, "peak": phases[phase], "phase_of_peak": phase}


def step_temporaries(step):
    return step.peak_by_phase["optimizer step"] - step.weights - step.optimizer_state - step.gradients


gpt2 = "GPT-2 with its LM head"
eight_bit_gpt2 = figure_steps["8-bit AdamW", "bf16 mixed precision"][gpt2]
eight_bit_on_cuda = without_step_temporaries(eight_bit_gpt2)
adamw_gpt2 = figure_steps["AdamW", "bf16 mixed precision"][gpt2]
adamw_foreach_gpt2 = labelled_step(gpt2, "AdamW, foreach", "bf16 mixed precision", FIGURE_BATCH, FIGURE_SEQ_LEN)
largest_parameter = max(p.numel() for p in architectures[gpt2].parameters())
print(f"8-bit AdamW's CPU update: {format_bytes(step_temporaries(eight_bit_gpt2))} of temporaries in the step, "
      f"{step_temporaries(eight_bit_gpt2) / (4 * largest_parameter):.1f} fp32 copies of the largest parameter "
      f"({largest_parameter:,} numbers)")
print(f"8-bit AdamW, peak with them:    {format_bytes(eight_bit_gpt2.peak)} ({eight_bit_gpt2.phase_of_peak})")
print(f"8-bit AdamW, peak without them: {format_bytes(eight_bit_on_cuda['peak'])} ({eight_bit_on_cuda['phase_of_peak']}), "
      f"{1 - eight_bit_on_cuda['peak'] / eight_bit_gpt2.peak:.0%} lower")
print(f"saving over AdamW as planned here (one parameter at a time): {format_bytes(adamw_gpt2.peak - eight_bit_gpt2.peak)}")
print(f"saving over AdamW with foreach (the CUDA default), 8-bit AdamW without this CPU's temporaries: "
      f"{format_bytes(adamw_foreach_gpt2.peak - eight_bit_on_cuda['peak'])}")
figure = plots.plot_training_memory_breakdown(
    {"AdamW\n(planned here)": adamw_gpt2, "AdamW, foreach\n(the CUDA default)": adamw_foreach_gpt2,
     "8-bit AdamW\nwith the CPU update's\ntemporaries (here)": eight_bit_gpt2,
     "8-bit AdamW\nwithout them\n(as the CUDA kernel)": eight_bit_on_cuda},
    title=f"GPT-2 with its LM head, bf16 mixed precision, {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens: "
          "this CPU's 8-bit update and a GPU's",
    xlabel="optimizer, and whose kernels",
)

# %% [markdown]
# ## 5. Three instruments, and the step over time
#
# The course has three ways to know a step's memory. The **tracker**
# (`memory.measure_training_step_peak`, on PyTorch's `MemTracker`) runs the
# step for real and sees every tensor a torch operation makes. The
# **planner** runs the same step, under the same tracker, on fake tensors.
# The third is the machine's own: the CPU **allocator**, which hands out every
# byte whoever asks, and whose running total `torch.profiler.profile(profile_memory=True)`
# records. `memory.measure_allocator_rise` runs the same step with
# no tracker installed under the profiler and returns the allocator's largest
# rise over what the step started with (the weights, the optimizer state, the
# batch). Added to the weights and state, that is the allocator's peak.
#
# Side by side, on the course model's step of section 2, and on the same
# model with three levers of lesson 5 combined: LoRA adapters (most weights
# frozen), activation checkpointing, and 4 accumulated micro-batches:

# %%
import warnings

import matplotlib.pyplot as plt

from course_utils import fine_tuning_variants

course_inputs = {"input_ids": course_batch["input_ids"], "labels": course_batch["labels"]}
INSTRUMENT_SETUPS = {"as in section 2": (False, 1), "LoRA + checkpointing + 4 accumulated": (True, 4)}


def course_setup(levers):
    """A fresh course model, with LoRA and activation checkpointing when ``levers``, and AdamW on what it trains."""
    model = models.load_pretrained_classifier()
    if levers:
        model.activation_checkpointing_enable()
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
            warnings.simplefilter("ignore", FutureWarning)
            model = fine_tuning_variants.make_variant("LoRA (r=16)", model)
    optimizer = optimizers.make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, optimizer


instruments = {}
for label, (levers, steps) in INSTRUMENT_SETUPS.items():
    model, optimizer = course_setup(levers)
    planned_step = memory.estimate_training_memory(model, "adamw", batch_size, seq_len, gradient_accumulation_steps=steps)
    measured_step = memory.measure_training_step_peak(model, optimizer, course_inputs, gradient_accumulation_steps=steps)
    model, optimizer = course_setup(levers)
    allocator = memory.measure_allocator_rise(model, optimizer, course_inputs, gradient_accumulation_steps=steps)
    held_throughout = measured_step.weights + measured_step.optimizer_state
    instruments[label] = {"planned": planned_step.peak, "measured": measured_step.peak,
                          "allocator": held_throughout + allocator.rise, "record": allocator}
print(f"one AdamW step of the course model on {batch_size} x {seq_len} tokens, peak in bytes:")
print(f"{'':>38} {'planner':>11} {'tracker':>11} {'allocator':>11} {'tracker - planner':>18} {'allocator - tracker':>20}")
for label, seen in instruments.items():
    print(f"{label:>38} {seen['planned']:>11,} {seen['measured']:>11,} {seen['allocator']:>11,} "
          f"{seen['measured'] - seen['planned']:>+18,} {seen['allocator'] - seen['measured']:>+20,}")

# %% [markdown]
# Where the allocator holds more than the tracker, here is what it held at
# its peak that was smaller than 9 bytes, with the operation that made it:

# %%
for label, seen in instruments.items():
    tiny = [(size, maker or "no operation") for size, maker in seen["record"].live_at_peak if size <= 8]
    print(f"{label}: {sum(size for size, _ in tiny)} bytes in {len(tiny)} tensors of at most 8 bytes: "
          + ", ".join(f"{size} B ({maker})" for size, maker in tiny))
rng_bytes = torch.get_rng_state().nbytes
checkpointed_model, _ = course_setup(True)
checkpointed_timeline = memory.plan_step_timeline(checkpointed_model, "adamw", batch_size, seq_len,
                                                  gradient_accumulation_steps=4)
saved_states = sum(1 for phase, operation in zip(checkpointed_timeline.phases, checkpointed_timeline.operations)
                   if operation == "get_rng_state" and phase.startswith("forward"))
print(f"random-number states saved in the forward passes of the checkpointed step: {saved_states} "
      f"({checkpointed_model.config.n_layers} blocks x 4 micro-batches), {rng_bytes:,} bytes each")

# %%
gaps = {label: seen["allocator"] - seen["measured"] for label, seen in instruments.items()}
same = all(seen["planned"] == seen["measured"] for seen in instruments.values())
display(Markdown(f"""
**Planner and tracker** {"agree to the byte in both set-ups" if same else "differ (see the table)"}: the
planner *is* the tracker, run on fake tensors. **Tracker and allocator**
differ by {listed([f"{gap:,} bytes ({label})" for label, gap in gaps.items()])}: 0-dim tensors that torch makes
inside an operation (a Python number turned into a tensor, a scalar cast to another dtype, 8 bytes at most
each), below any tracker's view; no tracker sees them, and nothing else is missing.

That agreement is not free. PyTorch's `MemTracker` on its own misses, and changes, what this step holds:

- activation checkpointing saves the random-number generator's state with each checkpointed block, so that
  the recomputed forward pass draws the same dropout masks: {rng_bytes:,} bytes on CPU, made by
  `torch.get_rng_state()` without a torch operation, so no dispatch mode sees it. The course's tracker
  counts it ({saved_states} saved states above, one per block per micro-batch);
- `MemTracker` follows modules through the backward pass with hooks on the gradients of each module's
  inputs, and such a hook holds every gradient until the module's other inputs have theirs: a tracked step
  could hold more than the same step untracked. The course's tracker does not install those hooks;
- a view of a tensor made before the step (the batch's labels) was counted as memory the step allocated.

The tests in `tests/memory/test_step_tracker.py` hold all three instruments together on small models with
checkpointing, LoRA, accumulation, bf16 autocast and 8-bit AdamW combined.
"""))

# %% [markdown]
# ### One step, operation by operation
#
# The peak is one number; the step is a story. With its record switched on,
# the tracker also writes down how many bytes each part holds after every
# operation that changes them, and the planner's fake step gives that
# record for any model: `memory.plan_step_timeline` (the planner's
# arguments; `memory.plan_timeline` takes a `TrainingSetup`). A deep model is planned from copies with a few blocks, and so
# is its timeline: two copies one block apart line up operation by operation
# but for one block's operations, which are repeated for the blocks the
# model has more, each repetition shifted by the bytes one more block adds.
# Before it is used, that rule must give the next copy's timeline exactly,
# point for point.
#
# Here is GPT-2 with its LM head, bf16 mixed precision, AdamW, on the batch of
# section 3, coloured as the bars above:

# %%
def timeline_of(model_name, dtype, checkpointing, setup, whole=False):
    """The planner's StepTimeline (bytes) of ``setup`` on the model, as plan_step plans it; raises PlannerRefused."""
    if (dtype, checkpointing) not in built_architectures:
        built_architectures[dtype, checkpointing] = models.fine_tuning_architectures(dtype, checkpointing)
    return memory.plan_timeline(built_architectures[dtype, checkpointing][model_name], setup, whole=whole)


def labelled_timeline(model_name, optimizer_label, precision, checkpointing=False, whole=False):
    """timeline_of for the labels of OPTIMIZERS and PRECISIONS, on section 3's batch, one micro-batch per step."""
    optimizer_name, options = OPTIMIZERS[optimizer_label]
    dtype, mixed_precision = PRECISIONS[precision]
    setup = memory.TrainingSetup(optimizer_name, FIGURE_BATCH, FIGURE_SEQ_LEN, mixed_precision, options=options)
    return timeline_of(model_name, dtype, checkpointing, setup, whole)


gpt2_timeline = labelled_timeline(gpt2, "AdamW", "bf16 mixed precision")
figure = plots.plot_step_timeline(
    gpt2_timeline, title=f"GPT-2 with its LM head, AdamW, bf16 mixed precision, {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens")
print(f"{len(gpt2_timeline.phases):,} points; {plots.describe_depth(gpt2_timeline)}")
print(f"peak {format_bytes(gpt2_timeline.peak, 2)} at {gpt2_timeline.operations[gpt2_timeline.peak_index]} "
      f"in the {gpt2_timeline.phases[gpt2_timeline.peak_index]}")

# %% [markdown]
# The forward pass climbs as each block saves its activations (red); the
# backward pass walks back down, block by block, each block's activations
# freed and its gradients (orange) made, a tooth of temporaries (purple) at
# every operation; the optimizer step holds the gradients and its own
# temporaries, and `zero_grad` frees the gradients at the end. Is the
# extrapolated timeline the whole model's? Followed whole, no copies (a few
# seconds more), and against the planner's peak of section 3:

# %%
gpt2_whole = labelled_timeline(gpt2, "AdamW", "bf16 mixed precision", whole=True)
print(f"followed whole: the same {len(gpt2_whole.phases):,} points, part for part: "
      f"{gpt2_whole.phases == gpt2_timeline.phases and bool((gpt2_whole.held == gpt2_timeline.held).all())}")
planned_gpt2 = figure_steps["AdamW", "bf16 mixed precision"][gpt2]
print(f"the planner's peak: {format_bytes(planned_gpt2.peak, 2)} in the {planned_gpt2.phase_of_peak}; "
      f"the timeline's: {format_bytes(gpt2_timeline.peak, 2)}, {gpt2_timeline.peak - planned_gpt2.peak:+,} bytes")

# %%
timeline_phase = gpt2_timeline.phases[gpt2_timeline.peak_index].split(" ")[0]
display(Markdown(
    "The planner's peak is the timeline's highest point." if planned_gpt2.peak == gpt2_timeline.peak else
    f"The planner's number is {abs(gpt2_timeline.peak - planned_gpt2.peak) / gpt2_timeline.peak:.2%} "
    f"{'below' if planned_gpt2.peak < gpt2_timeline.peak else 'above'} the whole step's: it extrapolates each "
    f"phase's highest point from its copies, and here the {timeline_phase} pass's highest point moves, as blocks "
    f"are added, to another operation ({gpt2_timeline.operations[gpt2_timeline.peak_index]}) that grows faster "
    "per block. The timeline extrapolates every operation, so it finds it."
))

# %% [markdown]
# **Why checkpointing flattens the ramp.** A checkpointed block keeps only its
# input (and the random-number state, above) and recomputes the rest during
# the backward pass, right before it needs it. The same step, without and with
# checkpointing:

# %%
ramps = {checkpointing: labelled_timeline(gpt2, "AdamW", "bf16 mixed precision", checkpointing)
         for checkpointing in (False, True)}
figure, axes = plt.subplots(2, 1, figsize=(9, 8.4), sharex=False)
for ax, (checkpointing, timeline) in zip(axes, ramps.items()):
    plots.plot_step_timeline(timeline, ax=ax, title=f"GPT-2, AdamW, bf16 mixed precision, {FIGURE_BATCH} x "
                             f"{FIGURE_SEQ_LEN} tokens, {'with' if checkpointing else 'without'} checkpointing")
figure.tight_layout()


def most_activations(timeline, phase):
    """The most bytes of activations held at any point of ``phase``."""
    return max(int(held[DRAWN_ACTIVATIONS]) for held, at in zip(timeline.held, timeline.phases) if at == phase)


DRAWN_ACTIVATIONS = memory.DRAWN_PARTS.index("activations")
for checkpointing, timeline in ramps.items():
    print(f"{'with' if checkpointing else 'without':>7} checkpointing: activations at the top of the ramp "
          f"{format_bytes(most_activations(timeline, 'forward 1'), 2)}, peak {format_bytes(timeline.peak, 2)} "
          f"in the {timeline.phases[timeline.peak_index]}")

# %%
without, with_checkpointing = (most_activations(ramps[c], "forward 1") for c in (False, True))
display(Markdown(f"""
With checkpointing the blocks keep only their inputs through the forward pass: the ramp of
activations rises {1 - with_checkpointing / without:.0%} less high ({format_bytes(with_checkpointing, 2)} instead of
{format_bytes(without, 2)}). The backward pass then rebuilds one block's activations at a time, right
before it needs them: each tooth of the saw is one block's activations and temporaries, never all the blocks'
at once, and the peak drops by {format_bytes(ramps[False].peak - ramps[True].peak, 2)}. The price is the
forward pass run twice per block (lesson 5), and a longer step: {len(ramps[True].phases):,} operations that
change memory instead of {len(ramps[False].phases):,}.
"""))

# %% [markdown]
# **Where 8-bit AdamW's CPU temporaries sit.** The same step with 8-bit AdamW:

# %%
eight_bit_timeline = labelled_timeline(gpt2, "8-bit AdamW", "bf16 mixed precision")
figure = plots.plot_step_timeline(eight_bit_timeline, title=f"GPT-2, 8-bit AdamW, bf16 mixed precision, "
                                  f"{FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens")
temporaries = eight_bit_timeline.held[:, memory.DRAWN_PARTS.index("temporaries")]
most = int(temporaries.argmax())
step_starts = eight_bit_timeline.phases.index("optimizer step")
first_name, first_parameter = next(iter(architectures[gpt2].named_parameters()))
state_column = memory.DRAWN_PARTS.index("optimizer state")
state_ratio = eight_bit_timeline.held[:, state_column].max() / gpt2_timeline.held[:, state_column].max()
print(f"the most temporaries: {format_bytes(int(temporaries[most]), 2)}, in the {eight_bit_timeline.phases[most]} "
      f"({eight_bit_timeline.operations[most]}, {most - step_starts} operations after it began), "
      f"{int(temporaries[most]) / (4 * largest_parameter):.1f} fp32 copies of the largest parameter")
print(f"the first parameter the optimizer updates: {first_name}, {first_parameter.numel():,} numbers, "
      f"the largest: {first_parameter.numel() == largest_parameter}")
print(f"8-bit AdamW's state: {state_ratio:.0%} of AdamW's")

# %% [markdown]
# The spike where the optimizer step begins is bitsandbytes' CPU update
# making fp32 working copies of one parameter's states at a time (section 4):
# the first parameter it updates is GPT-2's largest, the embedding matrix,
# and the small teeth after it are the other parameters'. On a GPU its CUDA
# kernel makes none, and the step would end on the flat gradients.
#
# The explorer's choices, over the timeline (a set-up planned before redraws
# at once, from a cache):

# %%
timeline_explorer = plots.step_timeline_explorer(
    list(architectures), timeline_of, OPTIMIZERS, PRECISIONS,
    batch_sizes=(1, 2, 4, 8, 16, 32), seq_lens=(128, 256, 512, 1024, 2048),
    initial={"model": gpt2, "optimizer": "AdamW", "precision": "bf16 mixed precision",
             "batch_size": FIGURE_BATCH, "seq_len": FIGURE_SEQ_LEN},
)
timeline_explorer

# %% [markdown]
# ## Exercises
#
# ### Exercise 1 — Will it fit?
#
# You want to fine-tune GPT-2 large (the base model) in fp32 on batches of
# `ex.Q1_BATCH_SIZE` sequences of `ex.Q1_SEQ_LEN` tokens, and you have a fixed
# memory budget. Here are the budget, the planner's answer with AdamW, and the
# two optimizers' states:

# %% tags=["nbval-check-output"]
fit_numbers = ex.q1_numbers()
fit_adamw_step = fit_numbers["adamw_step"]
fit_adamw_state = fit_numbers["adamw_state"]
fit_adamw8bit_state = fit_numbers["adamw8bit_state"]
print(f"budget: {ex.Q1_BUDGET_GIB} GiB; batches of {ex.Q1_BATCH_SIZE} x {ex.Q1_SEQ_LEN} tokens")
print(f"AdamW: peak {fit_adamw_step.peak / GIB:.2f} GiB, during the {fit_adamw_step.phase_of_peak}")
print(f"optimizer state: AdamW {fit_adamw_state / GIB:.2f} GiB, 8-bit AdamW {fit_adamw8bit_state / GIB:.2f} GiB")

# %% [markdown]
# Compute `peak_8bit_gib`, the peak of the same step with 8-bit AdamW, in GiB.
# The weights, gradients and activations do not change with the optimizer; the
# optimizer state is held during the whole step. (8-bit AdamW's own step, its
# temporaries included, stays below this peak: leave it out.)

# %%
# BEGIN SOLUTION
peak_8bit_gib = (fit_adamw_step.peak - fit_adamw_state + fit_adamw8bit_state) / 1024**3
# END SOLUTION
# BEGIN STARTER
# peak_8bit_gib = ____
# END STARTER
ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# Does each fit the budget? And what would the rule of thumb have said? The
# 8-bit line is your answer to exercise 1 (until you give one, it says so):

# %% tags=["nbval-check-output"]
fit_rule = 16 * fit_numbers["parameters"]
your_8bit_gib = peak_8bit_gib if isinstance(peak_8bit_gib, (int, float)) and math.isfinite(peak_8bit_gib) else None
for label, need_gib in (("rule of thumb, AdamW", fit_rule / GIB), ("planner, AdamW", fit_adamw_step.peak / GIB),
                        ("your answer, 8-bit AdamW", your_8bit_gib)):
    if need_gib is None:
        print(f"{label:>24}: answer exercise 1 first")
        continue
    verdict = "fits" if need_gib <= ex.Q1_BUDGET_GIB else "does not fit"
    print(f"{label:>24}: {need_gib:5.2f} GiB -> {verdict} in {ex.Q1_BUDGET_GIB} GiB")

# %% [markdown]
# ### Exercise 2 — Predict a peak
#
# Here is one measured training step of a model shaped like BERT-mini
# (`google/bert_uncased_L-4_H-256_A-4`), fp32, AdamW, on batches of
# `ex.Q2_GIVEN_BATCH` sequences of `ex.Q2_SEQ_LEN` tokens:

# %% tags=["nbval-check-output"]
given_step = ex.q2_step(ex.Q2_GIVEN_BATCH)
print(f"measured on {ex.Q2_GIVEN_BATCH} x {ex.Q2_SEQ_LEN} tokens:")
if "print_parts" not in globals() or "print_moments" not in globals():
    print("  (to see its parts and moments here, run section 1's first two code cells, which define print_parts "
          f"and print_moments, then this one)\n  peak {given_step.peak / 1024**2:.2f} MiB in the "
          f"{given_step.phase_of_peak}")
else:
    print_parts(given_step)
    print_moments(given_step)
print(f"to predict: the peak on {ex.Q2_BATCH} x {ex.Q2_SEQ_LEN} tokens ({ex.Q2_BATCH / ex.Q2_GIVEN_BATCH:g} times the batch), "
      f"within {ex.Q2_TOLERANCE:.0%} of its measurement")

# %% [markdown]
# Predict `predicted_peak_mib`, the peak of the same step on batches of
# `ex.Q2_BATCH` sequences (printed above), in MiB. The check measures that
# step for real and asks the planner too: a prediction within
# `ex.Q2_TOLERANCE` of the measurement is right. Think about which phase the
# peak will be in.

# %%
# BEGIN SOLUTION
held = given_step.weights + given_step.optimizer_state  # held throughout, whatever the batch
backward = held + ex.Q2_BATCH / ex.Q2_GIVEN_BATCH * (given_step.peak_by_phase["backward"] - held)
predicted_peak_mib = max(backward, given_step.peak_by_phase["optimizer step"]) / 1024**2
# END SOLUTION
# BEGIN STARTER
# predicted_peak_mib = ____
# END STARTER
ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ## Summary

# %%
gpt2_adamw = {p: by_model["GPT-2 with its LM head"] for (o, p), by_model in figure_steps.items()
              if o == "AdamW" and "GPT-2 with its LM head" in by_model}
largest_mixed = [(o, p) for o, p in mixed_lines if largest in figure_steps[o, p]]
display(Markdown(f"""
- **Four parts, three moments.** A step holds weights and optimizer state
  throughout; the forward pass adds activations, which grow with the batch and
  the length (attention's probabilities with its square); the backward pass
  trades activations for gradients; the optimizer step holds the gradients and
  its temporaries. The peak is the largest of the three moments, not the sum
  of the four parts. For distilbert-base-cased on {EXPLAINED_BATCH} x {EXPLAINED_SEQ_LEN} tokens it is
  {format_bytes(explained.peak)}, in the {explained.phase_of_peak}; the
  16-bytes-per-parameter rule says {format_bytes(rule)}.
- **The planner** follows one real training step on fake tensors, for any
  model, precision and lever: on the course model it said
  {format_bytes(course_planned.peak, 2)} and the measurement
  {format_bytes(course_measured.peak, 2)}.
- **Precision.** Mixed precision (`mixed_precision="bf16"`) keeps fp32 weights,
  gradients and state; its activations are mostly bf16, plus a bf16 copy of
  each weight it casts. Pure bf16 storage halves weights, gradients and state.
  GPT-2 with its LM head on {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens, with AdamW:
  {"; ".join(f"{precision} {format_bytes(step.peak)}" for precision, step in gpt2_adamw.items())}.
- **Big models**: the peak becomes nearly a fixed number of bytes per
  parameter, set by the precision and the optimizer's state: for {largest},
  {bytes_per_parameter(fp32_line, largest):.1f} with AdamW in fp32,
  {bytes_per_parameter(pure_line, largest):.1f} in pure bf16, and in mixed precision
  {listed([f"{bytes_per_parameter((o, p), largest):.1f} with {o}" for o, p in largest_mixed])}.
  Lesson 5 pulls the levers that make training fit: accumulation,
  checkpointing, mixed precision, training fewer parameters.
"""))
