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
#    checkpointing and accumulation, and practise with two exercises.
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

import torch
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from course_utils import data, memory, models, optimizers, plots
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
#   use. They grow with the batch size and the sequence length, not with $P$.
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
# AdamW, a batch of 8 sequences of 64 tokens:

# %% tags=["nbval-check-output"]
def fine_tuning_models(dtype=torch.float32, checkpointing=False):
    """The course's fine-tuning architectures on the meta device, in ``dtype``, with activation checkpointing or not."""
    built = {}
    for name, (model_class, config) in models.fine_tuning_configs().items():
        # A checkpointed model recomputes its forward pass, so it keeps no key/value cache (transformers would say so).
        config.use_cache = not checkpointing and getattr(config, "use_cache", False)
        with torch.device("meta"):
            model = model_class.from_config(config, dtype=dtype)
        if model_class.__name__ == "AutoModelForCausalLM" and getattr(model, "loss_type", None) is None:
            # GPT2LMHeadModel's class name does not tell transformers its loss, so it warns and picks
            # the causal-LM loss; name that loss.
            model.loss_type = "ForCausalLM"
        if checkpointing:
            model.activation_checkpointing_enable()
        built[name] = model
    return built


architectures = fine_tuning_models()
distilbert = architectures["distilbert-base-cased"]
explained = memory.explain_training_memory(distilbert, "adamw", batch_size=8, seq_len=64)


def print_parts(step):
    print(f"  weights {format_bytes(step.weights)}, gradients {format_bytes(step.gradients)}, "
          f"optimizer state {format_bytes(step.optimizer_state)}, activations {format_bytes(step.activations)}")


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
double_batch = memory.explain_training_memory(distilbert, "adamw", batch_size=16, seq_len=64)
double_length = memory.explain_training_memory(distilbert, "adamw", batch_size=8, seq_len=128)
print(f"{'each block keeps':>48}  x2 batch  x2 length")
for part, size in explained.per_block.items():
    print(f"{part:>48}  {double_batch.per_block[part] / size:6.2f}x  {double_length.per_block[part] / size:7.2f}x")

# %% [markdown]
# Everything doubles with the batch. With the length, everything doubles too,
# except the attention probabilities, which grow with the *square* of the
# length: the reason long sequences are expensive. Now the three moments of the
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
# At this small batch the peak is in the optimizer step: the activations of 8 x
# 64 tokens weigh less than the gradients. The usual rule of thumb, 16 bytes per
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
# stack of identical blocks, so the planner runs copies with 1, 2 and 3 blocks,
# checks that each block adds the same bytes, and extrapolates to the full
# depth: a 70B-shaped model plans in seconds.
#
# First, on the model section 1 explained: the planner follows the step the
# analytical model describes, and they agree:

# %% tags=["nbval-check-output"]
planned = memory.estimate_training_memory(distilbert, "adamw", batch_size=8, seq_len=64)
for label, step in (("explained", explained), ("planned", planned)):
    print(f"{label:>10}: peak {format_bytes(step.peak, 2)} in the {step.phase_of_peak}; by phase: "
          + ", ".join(f"{phase} {format_bytes(peak, 2)}" for phase, peak in step.peak_by_phase.items()))
print(f"largest difference between the two, over the three phases: "
      f"{max(abs(planned.peak_by_phase[p] - explained.peak_by_phase[p]) for p in memory.PHASES) / MIB:.2f} MiB")

# %% [markdown]
# Now the course model, on a real batch of the course data (32 pairs, padded to
# the longest in the batch), checked against a real measurement of the same step.
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
bf16_architectures = fine_tuning_models(torch.bfloat16)
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
for label, mixed_precision in (("fp32", "no"), ("bf16 mixed precision", "bf16")):
    full = precisions[label]
    half = memory.estimate_training_memory(course_model, "adamw", batch_size // 2, seq_len, mixed_precision=mixed_precision)
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
# The figure learners come for: the planned peak of one training step against
# the parameter count, one line per optimizer and precision, for a batch of
# 4 sequences of 128 tokens, with the memory of the GPUs you know marked
# (16 GB: T4, V100; 24 GB: RTX 4090, A10; 40 and 80 GB: A100, H100). Each point
# is one planner run, a few seconds each.

# %%
FIGURE_BATCH, FIGURE_SEQ_LEN = 4, 128
# BERT-base and Llama-2-7B are in the explorer below: each point costs a planner run.
FIGURE_MODELS = ["course model (tiny DistilBERT)", "GPT-2 with its LM head", "Mistral-7B-shaped (GQA)",
                 "Llama-2-70B-shaped (GQA)"]
# Line label: (optimizer, model in which dtype, mixed precision).
FIGURE_LINES = {
    "AdamW, fp32": ("adamw", architectures, "no"),
    "AdamW, bf16 mixed precision (fp32 weights, gradients, state)": ("adamw", architectures, "bf16"),
    "AdamW, pure bf16 storage": ("adamw", bf16_architectures, "no"),
}
figure_peaks = {label: {} for label in FIGURE_LINES}
for name in tqdm(FIGURE_MODELS, desc="planning"):
    for label, (optimizer_name, built, mixed_precision) in FIGURE_LINES.items():
        step = memory.estimate_training_memory(built[name], optimizer_name, FIGURE_BATCH, FIGURE_SEQ_LEN,
                                               mixed_precision=mixed_precision)
        figure_peaks[label][name] = step
parameter_counts = {name: models.count_parameters(architectures[name]) for name in FIGURE_MODELS}
figure = plots.plot_peak_memory_vs_parameters(
    parameter_counts, {label: {name: step.peak for name, step in by_model.items()} for label, by_model in figure_peaks.items()},
    title=f"Planned peak of one training step, {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens, against model size",
)

# %% tags=["nbval-check-output"]
def smallest_gpu(peak):
    """The smallest of the common GPU sizes (decimal GB) that holds ``peak`` bytes, or None."""
    return next((gb for gb in plots.COMMON_GPU_SIZES_GB if peak <= gb * GB), None)


print(f"{'model':>31} " + " ".join(f"{label.split(' (')[0]:>28}" for label in figure_peaks))
for name in FIGURE_MODELS:
    cells = []
    for by_model in figure_peaks.values():
        step = by_model[name]
        gpu = smallest_gpu(step.peak)
        cells.append(f"{format_bytes(step.peak):>10} {'fits ' + str(gpu) + ' GB' if gpu else 'no single GPU':>17}")
    print(f"{name:>31} " + " ".join(cells))

# %%
def bytes_per_parameter(label, name):
    return figure_peaks[label][name].peak / parameter_counts[name]


largest, seven_b = FIGURE_MODELS[-1], "Mistral-7B-shaped (GQA)"
fp32_label, mixed_label, pure_label = FIGURE_LINES
seven_b_fits = {label.split(" (")[0]: smallest_gpu(by_model[seven_b].peak) for label, by_model in figure_peaks.items()}
mixed_above_fp32 = [name for name in FIGURE_MODELS if figure_peaks[mixed_label][name].peak > figure_peaks[fp32_label][name].peak]
mixed_reading = (f"mixed precision holds more than fp32 for {', '.join(mixed_above_fp32)}: at this batch its bf16 weight "
                 "copies outweigh what its bf16 activations save" if mixed_above_fp32
                 else "mixed precision never holds more than fp32 here")
display(Markdown(f"""
Read along a line: for the big models the weights, gradients and state
dominate, and the peak is a fixed number of bytes per parameter. With AdamW in
fp32 that is {bytes_per_parameter(fp32_label, seven_b):.1f} bytes per parameter
for {seven_b} and {bytes_per_parameter(fp32_label, largest):.1f} for {largest},
against {bytes_per_parameter(fp32_label, FIGURE_MODELS[0]):,.0f} for the course model,
whose activations outweigh it. Read across lines: mixed precision lands at
{bytes_per_parameter(mixed_label, seven_b):.1f} bytes per parameter for {seven_b}
(it keeps fp32 weights, gradients and state); pure bf16 storage at
{bytes_per_parameter(pure_label, seven_b):.1f}; and {mixed_reading}.
And the GPU lines: {seven_b} fits
{"; ".join(f"with {label}, {'a GPU of ' + str(gb) + ' GB' if gb else 'no single common GPU'}" for label, gb in seven_b_fits.items())}.
Lesson 3's optimizers and lesson 5's levers are there to move these points down.
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
# seconds the first time, instantly when you come back to it). The bars show the
# peak, with the phase it falls in; the grey bar is AdamW in fp32 for the same
# model and batch. A set-up the planner cannot follow says why instead of
# giving a number.

# %%
EXPLORER_OPTIMIZERS = {"AdamW": ("adamw", {}), "AdamW, foreach": ("adamw", {"foreach": True}),
                       "SGD with momentum": ("sgd", {"momentum": 0.9}), "Adafactor": ("adafactor", {}),
                       "8-bit AdamW": ("adamw8bit", {})}
EXPLORER_PRECISIONS = {"fp32": (torch.float32, "no"), "bf16 mixed precision": (torch.float32, "bf16"),
                       "pure bf16": (torch.bfloat16, "no")}
explorer_architectures = {(torch.float32, False): architectures, (torch.bfloat16, False): bf16_architectures}


def explorer_model(name, dtype, checkpointing):
    """The architecture ``name`` on the meta device in ``dtype``, with activation checkpointing on or off (built once)."""
    if (dtype, checkpointing) not in explorer_architectures:
        explorer_architectures[dtype, checkpointing] = fine_tuning_models(dtype, checkpointing)
    return explorer_architectures[dtype, checkpointing][name]


def plan_step(model_name, optimizer_label, precision, batch_size, seq_len, checkpointing, accumulation):
    """The planner's TrainingMemory for one explorer set-up (bytes); raises ValueError with the reason if refused."""
    optimizer_name, options = EXPLORER_OPTIMIZERS[optimizer_label]
    dtype, mixed_precision = EXPLORER_PRECISIONS[precision]
    return memory.estimate_training_memory(
        explorer_model(model_name, dtype, checkpointing), optimizer_name, batch_size, seq_len,
        mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation, **options,
    )


explorer = plots.training_memory_explorer(
    list(architectures), plan_step, list(EXPLORER_OPTIMIZERS), list(EXPLORER_PRECISIONS),
    batch_sizes=(1, 2, 4, 8, 16, 32), seq_lens=(128, 256, 512, 1024, 2048), reference=("AdamW", "fp32"),
    initial={"model": "GPT-2 with its LM head", "optimizer": "AdamW", "precision": "bf16 mixed precision",
             "batch_size": FIGURE_BATCH, "seq_len": FIGURE_SEQ_LEN},
)
explorer

# %% [markdown]
# The widgets need a running kernel. In a static copy of this notebook, here
# is the explorer's figure for GPT-2 with its LM head, for the three precisions
# with AdamW, from the planner runs of the figure above:

# %%
figure = plots.plot_training_memory_breakdown(
    {label.split(" (")[0].replace(", ", "\n"): by_model["GPT-2 with its LM head"] for label, by_model in figure_peaks.items()},
    title=f"GPT-2 with its LM head: one training step on {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens (planned)",
    xlabel="optimizer and precision",
)

# %% [markdown]
# ## Exercises
#
# ### Exercise 1 — Will it fit?
#
# You want to fine-tune GPT-2 large (the base model) in fp32 on batches of 4
# sequences of 256 tokens, and you have a fixed memory budget. Here is the
# planner's answer with AdamW, and the two optimizers' states:

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
# optimizer state is held during the whole step. (8-bit AdamW's own step is
# small next to this peak: leave it out.)

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
# Does each fit the budget? And what would the rule of thumb have said?

# %% tags=["nbval-check-output"]
fit_rule = 16 * fit_numbers["parameters"]
fit_with_8bit = fit_adamw_step.peak - fit_adamw_state + fit_adamw8bit_state
for label, need in (("rule of thumb, AdamW", fit_rule), ("planner, AdamW", fit_adamw_step.peak),
                    ("planner, 8-bit AdamW", fit_with_8bit)):
    verdict = "fits" if need <= ex.Q1_BUDGET_GIB * GIB else "does not fit"
    print(f"{label:>22}: {need / GIB:5.2f} GiB -> {verdict} in {ex.Q1_BUDGET_GIB} GiB")

# %% [markdown]
# ### Exercise 2 — Predict a peak
#
# Here is one measured training step of a model shaped like BERT-mini
# (`google/bert_uncased_L-4_H-256_A-4`), fp32, AdamW, on batches of
# `ex.Q2_GIVEN_BATCH` sequences of `ex.Q2_SEQ_LEN` tokens:

# %% tags=["nbval-check-output"]
given_step = ex.q2_step(ex.Q2_GIVEN_BATCH)
print(f"measured on {ex.Q2_GIVEN_BATCH} x {ex.Q2_SEQ_LEN} tokens:")
print_parts(given_step)
print_moments(given_step)

# %% [markdown]
# Predict `predicted_peak_mib`, the peak of the same step on batches of
# `ex.Q2_BATCH` sequences (4 times as many), in MiB. The check measures that
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
gpt2_steps = {label: by_model["GPT-2 with its LM head"] for label, by_model in figure_peaks.items()}
display(Markdown(f"""
- **Four parts, three moments.** A step holds weights and optimizer state
  throughout; the forward pass adds activations, which grow with the batch and
  the length (attention's probabilities with its square); the backward pass
  trades activations for gradients; the optimizer step holds the gradients and
  its temporaries. The peak is the largest of the three moments, not the sum
  of the four parts. For distilbert-base-cased on 8 x 64 tokens it is
  {format_bytes(explained.peak)}, in the {explained.phase_of_peak}; the
  16-bytes-per-parameter rule says {format_bytes(rule)}.
- **The planner** follows one real training step on fake tensors, for any
  model, precision and lever: on the course model it said
  {format_bytes(course_planned.peak, 2)} and the measurement
  {format_bytes(course_measured.peak, 2)}.
- **Precision.** Mixed precision (`mixed_precision="bf16"`) keeps fp32 weights,
  gradients and state; its activations are mostly bf16, plus a bf16 copy of
  each weight it casts. Pure bf16 storage halves weights, gradients and state.
  GPT-2 with its LM head on {FIGURE_BATCH} x {FIGURE_SEQ_LEN} tokens:
  {"; ".join(f"{label.split(' (')[0]} {format_bytes(step.peak)}" for label, step in gpt2_steps.items())}.
- **Big models**: the peak becomes a fixed number of bytes per parameter
  ({bytes_per_parameter(fp32_label, largest):.1f} for {largest} with AdamW in fp32,
  {bytes_per_parameter(pure_label, largest):.1f} in pure bf16). Lesson 5 pulls
  the levers that make training fit: accumulation, checkpointing, mixed
  precision, training fewer parameters.
"""))
