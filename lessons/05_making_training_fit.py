# %% [markdown]
# # Lesson 5 — Making training fit: accumulation, checkpointing, mixed precision, fewer trained parameters
#
# Lesson 4 taught you what the memory of a training step is made of: weights,
# gradients, optimizer state and activations, with a planner that predicts
# each. This lesson is about what to do when the sum is larger than your GPU.
# Four levers, each switched on with a line or two of Accelerate or transformers:
#
# | lever | what it shrinks | what it costs |
# | --- | --- | --- |
# | **gradient accumulation** | activations: k micro-batches instead of one big batch | k smaller passes per optimizer step |
# | **activation checkpointing** | activations: each block keeps only its input | one more forward pass during backward |
# | **mixed precision (bf16)** | activations (bf16); pure bf16 storage halves everything else too | small updates can vanish in bf16 storage |
# | **training fewer parameters** (frozen encoder, LoRA) | gradients and optimizer state | the model may learn less |
#
# Each gets the same treatment: the idea, the lines that turn it on, the memory
# of a step (the planner of lesson 4 and a measurement, side by side), its cost
# in time (measured), and whether the model still learns the same. Then the
# features every real training job needs: gradient clipping, saving the model,
# and resuming an interrupted training exactly. Last, you combine the levers
# until a 7B-parameter model fits a 24 GB GPU, and practise in four exercises.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")` and the data line
# `load_dataset("glue", "mrpc")`. Full-size models (a 7B-shaped Llama, BERT-large)
# are built on the meta device: the planner needs their shapes, not their weights.

# %%
import contextlib
import copy
import inspect
import io
import math
import statistics
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import accelerate
import torch
import transformers
from accelerate.utils import DataLoaderConfiguration, set_seed
from IPython.display import HTML, Markdown, display
from peft import LoraConfig, get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm
from transformers import (
    AutoModelForSequenceClassification, LlamaConfig, Trainer, TrainingArguments, default_data_collator,
)
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from course_utils import accelerate_state, cpu_features, data, feature_loops, fine_tuning_variants, gpus, levers, loop_diff, loops, memory, models
from course_utils import optimizers, parallel, plots, schedules, speed
from course_utils.exercises import ____
from course_utils.exercises import lesson5 as ex
from course_utils.plots import levers as lever_plots
from course_utils.threads import use_course_threads
from course_utils.units import format_bytes

use_course_threads()
transformers.utils.logging.disable_progress_bar()  # the "Loading weights" bar of every from_pretrained: noise here
# peft 0.21 asks transformers 5 for `is_gradient_checkpointing`, a name transformers 5 deprecated
# in favour of `is_activation_checkpointing` (FutureWarning); both give the same answer.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

BATCH_SIZE = 32
SEQ_LEN = 64  # the course's longest pair; the memory figures use full-length batches
LEARNING_RATE = 1e-3

dataset = data.load_paraphrase_dataset()
labels = dataset["validation"]["label"]
majority_share = max(labels.count(0), labels.count(1)) / len(labels)
print(f"{len(dataset['train']):,} training pairs; always answering the most common label "
      f"scores {majority_share:.3f} on the {len(labels)} validation pairs")

# %% [markdown]
# Every training run below starts from a fresh model, optimizer and
# `Accelerator`. Accelerate keeps one state per process, and refuses a second
# `Accelerator` with another mixed precision; a script never meets that, a
# notebook that compares settings does, so the lesson builds each one with
# `accelerate_state.fresh_accelerator(...)`, which forgets the previous one first and
# then calls `Accelerator(...)` with the same arguments.
#
# ## 1. Gradient accumulation
#
# **The idea.** The gradient of a batch is the mean of its examples' gradients.
# So the gradient of a batch of 32 is also the mean of the gradients of four
# micro-batches of 8: run forward and backward on each micro-batch, let the
# gradients add up in `.grad`, and take one optimizer step after the fourth.
# Only one micro-batch's activations exist at a time.
#
# **The Accelerate lines.** `Accelerator(gradient_accumulation_steps=4)`, and
# the step inside `with accelerator.accumulate(model):`. That is the whole
# change to lesson 1's loop (a test of the course holds the two to exactly these lines):

# %%
display(HTML(loop_diff.loop_diff_html(loops.train_accelerate, feature_loops.train_accumulating)))

# %% [markdown]
# Inside `accumulate`, `optimizer.step()`, `lr_scheduler.step()` and
# `optimizer.zero_grad()` act on every fourth micro-batch only (and at the end
# of the data), and `accelerator.backward` divides each micro-batch's loss by 4.
#
# **Same steps as the big batch.** Two runs from the same seed over the same
# 256 training pairs: batches of 32, and micro-batches of 8 accumulated 4 at a
# time. Dropout is switched off, so the two differ only in how they batch. The
# batch order is the same: a shuffled dataloader draws one permutation of the
# examples, whatever its batch size.

# %%
ACCUMULATION_EXAMPLES = 256


def dropout_free_classifier():
    """The course checkpoint with every dropout at 0: two runs then differ only by how they batch."""
    return parallel.without_dropout(models.load_pretrained_classifier())


def accumulation_run(micro_batch_size, accumulation_steps):
    set_seed(0)
    model = dropout_free_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=micro_batch_size, seed=0, limit=ACCUMULATION_EXAMPLES)
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
    # The scheduler counts optimizer steps: one per `accumulation_steps` micro-batches.
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, len(train_dataloader) // accumulation_steps)
    accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=accumulation_steps)
    losses = feature_loops.train_accumulating(model, optimizer, lr_scheduler, train_dataloader, 1, accelerator)
    return model, losses


big_model, big_losses = accumulation_run(micro_batch_size=32, accumulation_steps=1)
micro_model, micro_losses = accumulation_run(micro_batch_size=8, accumulation_steps=4)
parameter_gap = max((a - b).abs().max().item() for a, b in zip(big_model.parameters(), micro_model.parameters()))
print(f"{len(big_losses)} steps of 32, and {len(micro_losses)} micro-batches of 8 in {len(micro_losses) // 4} steps")
print(f"largest difference between the two models' parameters after training: {parameter_gap:.1e}")

# %%
micro_means = [sum(micro_losses[i:i + 4]) / 4 for i in range(0, len(micro_losses), 4)]
figure = plots.plot_loss_curves(
    {"batches of 32": big_losses, "4 micro-batches of 8, mean loss per step": micro_means},
    title="Accumulating 4 micro-batches of 8 retraces the batches of 32 (dropout off)",
)
print(f"largest gap between the two loss curves: {max(abs(a - b) for a, b in zip(big_losses, micro_means)):.1e}")

# %% [markdown]
# The differences are rounding: float32 sums the same numbers in another order.
#
# **Why `accelerator.backward` divides the loss.** Each micro-batch's loss is
# the mean over its 8 examples. Four backward passes *add* four such gradients,
# which is 4 times the gradient of the mean over 32. Below, one batch of 32 is
# split into four micro-batches, and the summed gradient is compared with the
# big batch's, with `accelerator.backward` inside `accumulate` and with a plain
# `loss.backward()`:

# %%
set_seed(0)
gradient_model = dropout_free_classifier()
gradient_batch = next(iter(data.make_dataloader("train", batch_size=32, seed=0)))
gradient_micro_batches = [{name: tensor[i:i + 8] for name, tensor in gradient_batch.items()} for i in range(0, 32, 8)]


def flat_gradient(model):
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters()])


gradient_model(**gradient_batch).loss.backward()
big_gradient = flat_gradient(gradient_model)

accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=4)
prepared_model = accelerator.prepare(gradient_model)
for backward_name, backward in [("accelerator.backward(loss)", accelerator.backward), ("loss.backward()", torch.Tensor.backward)]:
    prepared_model.zero_grad()
    for micro_batch in gradient_micro_batches:
        with accelerator.accumulate(prepared_model):
            backward(prepared_model(**micro_batch).loss)
    ratio = flat_gradient(prepared_model).norm() / big_gradient.norm()
    print(f"{backward_name:>27}: summed gradient / big-batch gradient = {ratio:.4f}")

# %% [markdown]
# **The effective batch.** What the optimizer sees per step is the
# *effective* batch: per-process batch x processes x accumulation steps. On
# this machine there is one process (lesson 6 runs two):

# %%
print(f"per-process batch 8 x {accelerator.num_processes} process{'es' if accelerator.num_processes != 1 else ''} x "
      f"{accelerator.gradient_accumulation_steps} accumulation steps = "
      f"an effective batch of {8 * accelerator.num_processes * accelerator.gradient_accumulation_steps}")

# %% [markdown]
# **Memory.** The activations are those of one micro-batch; the gradients, on
# the other hand, now live across the micro-batches (they must add up), where
# without accumulation `zero_grad` frees them before every forward pass. The
# planner (lesson 4) and a measurement of the same step:

# %%
full_model = models.load_pretrained_classifier()
accumulation_checks = {
    "batch of 32": levers.plan_and_measure(full_model, memory.TrainingSetup("adamw", 32, SEQ_LEN)),
    "4 micro-batches of 8": levers.plan_and_measure(
        full_model, memory.TrainingSetup("adamw", 8, SEQ_LEN, gradient_accumulation_steps=4)),
}
display(Markdown(levers.memory_table(accumulation_checks)))

# %% [markdown]
# **Time.** Four small passes instead of one large one: each optimizer step
# below is timed 7 times, on the same 32 pairs.

# %%
set_seed(0)
timing_model = models.load_pretrained_classifier()
timing_optimizer = optimizers.make_optimizer("adamw", timing_model.parameters(), lr=LEARNING_RATE)
big_batch_seconds = speed.time_optimizer_step(timing_model, timing_optimizer, [gradient_batch])
micro_batch_seconds = speed.time_optimizer_step(timing_model, timing_optimizer, gradient_micro_batches)
print(f"one batch of 32:        {speed.describe_timing(big_batch_seconds)}")
print(f"four micro-batches of 8: {speed.describe_timing(micro_batch_seconds)}")

# %% [markdown]
# ## 2. Activation checkpointing
#
# **The idea.** During the forward pass autograd keeps, for every operation,
# the tensors its backward needs: most of a step's activations. With activation
# checkpointing each transformer block keeps only its *input*; during backward
# the block's forward runs a second time, from that input, to rebuild what the
# backward needs, block after block. Memory falls from "every tensor of every
# block" to "one input per block, plus one block's tensors at a time".
#
# **The lines.** No line of the loop changes: `model.activation_checkpointing_enable()`
# before `prepare` (transformers 5's name; `gradient_checkpointing_enable()`, the
# older one, still works and warns that it is deprecated). Here is the second
# forward pass, counted on the attention of the first block during one training step:

# %%
def forward_calls_of_first_attention(model):
    calls = []
    hook = model.distilbert.transformer.layer[0].attention.register_forward_hook(lambda *args: calls.append(1))
    model.train()
    model(**gradient_batch).loss.backward()
    hook.remove()
    return len(calls)


plain_model = models.load_pretrained_classifier()
checkpointed_model = models.load_pretrained_classifier()
checkpointed_model.activation_checkpointing_enable()
print(f"forward calls of block 0's attention in one step: {forward_calls_of_first_attention(plain_model)} "
      f"without checkpointing, {forward_calls_of_first_attention(checkpointed_model)} with it")

# %% [markdown]
# **Memory and time**, planned and measured:

# %%
checkpointing_checks = {
    "no checkpointing": accumulation_checks["batch of 32"],
    "activation checkpointing": levers.plan_and_measure(checkpointed_model, memory.TrainingSetup("adamw", 32, SEQ_LEN)),
}
display(Markdown(levers.memory_table(checkpointing_checks)))


# %% [markdown]
# What to expect in time: checkpointing runs each block's forward a second
# time during the backward, so a step costs about one more forward pass,
# nothing else. Timings on a shared machine are noisy (other programs, the
# CPU's clock), and two timings taken minutes apart can disagree by more than
# the effect. So the two steps are timed in turn, round after round, each
# round giving one ratio; the expected ratio comes from the same rounds'
# forward passes: (step + forward) / step.

# %%
def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


set_seed(0)
plain_optimizer = optimizers.make_optimizer("adamw", plain_model.parameters(), lr=LEARNING_RATE)
checkpointed_optimizer = optimizers.make_optimizer("adamw", checkpointed_model.parameters(), lr=LEARNING_RATE)
TIMING_ROUNDS = 7
plain_seconds, checkpointed_seconds, step_ratios, expected_ratios = [], [], [], []
for _ in tqdm(range(TIMING_ROUNDS + 1), desc="timing in turn"):  # the first round warms up, untimed
    plain_step = speed.time_optimizer_step(plain_model, plain_optimizer, [gradient_batch], repeats=1, warmup=0)[0]
    checkpointed_step = speed.time_optimizer_step(checkpointed_model, checkpointed_optimizer, [gradient_batch],
                                                   repeats=1, warmup=0)[0]
    forward = timed(lambda: plain_model(**gradient_batch).loss)
    plain_seconds.append(plain_step)
    checkpointed_seconds.append(checkpointed_step)
    step_ratios.append(checkpointed_step / plain_step)
    expected_ratios.append((plain_step + forward) / plain_step)
plain_seconds, checkpointed_seconds = plain_seconds[1:], checkpointed_seconds[1:]
step_ratios, expected_ratios = step_ratios[1:], expected_ratios[1:]
print(f"one step without checkpointing: {speed.describe_timing(plain_seconds)}")
print(f"one step with checkpointing:    {speed.describe_timing(checkpointed_seconds)}")
print(f"checkpointed step / plain step, {TIMING_ROUNDS} rounds: median {statistics.median(step_ratios):.2f}x "
      f"(from {min(step_ratios):.2f}x to {max(step_ratios):.2f}x)")
print(f"expected, (step + one forward) / step: median {statistics.median(expected_ratios):.2f}x "
      f"(from {min(expected_ratios):.2f}x to {max(expected_ratios):.2f}x)")

# %% [markdown]
# **Does it learn the same?** It computes the same thing: the recomputed
# forward replays the same dropout masks (PyTorch saves the random state with
# the checkpoint). Two short runs of lesson 1's loop from the same seed:

# %%
SHORT_RUN_EXAMPLES = 320  # 10 steps of 32


def short_run(prepare_model, mixed_precision="no"):
    set_seed(0)
    model = prepare_model(models.load_pretrained_classifier())
    train_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0, limit=SHORT_RUN_EXAMPLES)
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, len(train_dataloader))
    accelerator = accelerate_state.fresh_accelerator(mixed_precision=mixed_precision)
    return model, loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, 1, accelerator)


def with_checkpointing(model):
    model.activation_checkpointing_enable()
    return model


reference_model, reference_losses = short_run(lambda model: model)
checkpointed_run_model, checkpointed_losses = short_run(with_checkpointing)
print(f"{len(reference_losses)} steps; largest loss gap {max(abs(a - b) for a, b in zip(reference_losses, checkpointed_losses)):.1e}, "
      f"largest parameter gap {max((a - b).abs().max().item() for a, b in zip(reference_model.parameters(), checkpointed_run_model.parameters())):.1e}")

# %% [markdown]
# ## 3. Mixed precision
#
# **The idea.** bf16 ("brain float 16") keeps float32's 8 exponent bits (the
# same range) but only 8 significant bits instead of 24. Under *mixed*
# precision the weights, gradients and optimizer state stay float32; the
# forward pass runs under autocast, which computes matrix products in bf16, so
# the activations they produce, and autograd saves, take 2 bytes instead of 4.
#
# **The Accelerate line.** `Accelerator(mixed_precision="bf16")`: `prepare` wraps
# the model's forward in `torch.autocast` (on CPU here) and converts its outputs
# back to float32. The loop does not change. After one step, what is in bf16?

# %%
set_seed(0)
accelerator = accelerate_state.fresh_accelerator(mixed_precision="bf16")
bf16_model = models.load_pretrained_classifier()
bf16_optimizer = optimizers.make_optimizer("adamw", bf16_model.parameters(), lr=LEARNING_RATE)
bf16_model, bf16_optimizer = accelerator.prepare(bf16_model, bf16_optimizer)
seen_dtypes = {}
query_layer = bf16_model.distilbert.transformer.layer[0].attention.q_lin
hook = query_layer.register_forward_hook(lambda module, inputs, output: seen_dtypes.update(activation=output.dtype))
outputs = bf16_model(**gradient_batch)
accelerator.backward(outputs.loss)
bf16_optimizer.step()
hook.remove()
seen_dtypes.update(
    logits=outputs.logits.dtype, weight=query_layer.weight.dtype, gradient=query_layer.weight.grad.dtype,
    optimizer_state=bf16_optimizer.state[query_layer.weight]["exp_avg"].dtype,
)
for name, dtype in seen_dtypes.items():
    print(f"{name:>16}: {dtype}")

# %% [markdown]
# Beside it, **pure bf16 storage**: the model itself in bf16
# (`from_pretrained(..., dtype=torch.bfloat16)`), so its weights, gradients and
# AdamW's moments all take 2 bytes. Planned and measured:

# %%
pure_bf16_model = AutoModelForSequenceClassification.from_pretrained(models.TINY_CHECKPOINT_DIR, dtype=torch.bfloat16)
precision_checks = {
    "fp32": accumulation_checks["batch of 32"],
    "bf16 mixed precision (autocast)": levers.plan_and_measure(
        full_model, memory.TrainingSetup("adamw", 32, SEQ_LEN, mixed_precision="bf16")),
    "pure bf16 storage": levers.plan_and_measure(pure_bf16_model, memory.TrainingSetup("adamw", 32, SEQ_LEN)),
}
display(Markdown(levers.memory_table(precision_checks)))

# %% [markdown]
# **Time.** bf16 is fast where the hardware multiplies in bf16 (the tensor
# cores of recent GPUs, AMX-BF16 or AVX512-BF16 on recent CPUs) and where the
# step is mostly matrix products; autocast also adds a cast around each of
# them. What this CPU reports, and what a whole step does here:

# %%
bf16_seconds = speed.time_optimizer_step(bf16_model, bf16_optimizer, [gradient_batch])
print(f"torch's CPU vector capability here: {torch.backends.cpu.get_cpu_capability()} "
      "(the same with and without bf16 units: the CPU's flags say which it has)")
print(f"one step in fp32:           {speed.describe_timing(big_batch_seconds)}")
print(f"one step with bf16 autocast: {speed.describe_timing(bf16_seconds)}")
display(Markdown(speed.bf16_sentence("fp32", speed.Timing(tuple(big_batch_seconds)), "bf16 autocast",
                                     speed.Timing(tuple(bf16_seconds)), cpu_features.cpu_matrix_units())
                 + " Lesson 8 profiles such a step to show where its time goes."))

# %% [markdown]
# A CPU's result does not carry over to a GPU. On GPUs with bf16
# tensor cores (A100, H100, RTX 30xx/40xx and later) the matrix products,
# most of a transformer's arithmetic, run much faster in bf16 than in fp32.
# Two sources you can check, the vendor's peak figures and a measurement of
# `torch.matmul` pasted in a public issue:

# %%
# TFLOPS of dense matrix products (no sparsity), by precision.
GPU_MATMUL_TFLOPS = {
    # NVIDIA A100 datasheet: FP32 19.5, TF32 tensor core 156, BF16 tensor core 312 (dense figures)
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "A100 (datasheet peak)": {"fp32": 19.5, "tf32": 156, "bf16": 312},
    # torch.matmul of 8192 x 8192 matrices on an NVIDIA H20, measured (FP32 31.99, TF32 71.78, BF16 138.60)
    # https://github.com/zzc0721/torch-performance-test-data/issues/77
    "H20 (measured, 8192 x 8192)": {"fp32": 31.99, "tf32": 71.78, "bf16": 138.60},
}
for card, tflops in GPU_MATMUL_TFLOPS.items():
    print(f"{card:>28}: bf16 {tflops['bf16'] / tflops['fp32']:.1f}x fp32, {tflops['bf16'] / tflops['tf32']:.1f}x tf32 "
          f"(matrix products)")
print(f"this CPU, a whole step: bf16 autocast {statistics.median(bf16_seconds) / statistics.median(big_batch_seconds):.1f}x "
      "the time of fp32")
print(f"PyTorch's fp32 matrix products by default: precision {torch.get_float32_matmul_precision()!r}, "
      f"tf32 allowed on CUDA: {torch.backends.cuda.matmul.allow_tf32}")

# %% [markdown]
# A whole training step gains less than its matrix products: the rest of it
# (normalisations, the optimizer step, moving data) is limited by memory
# bandwidth, where bf16's halved bytes help but no tensor core does. And
# PyTorch computes fp32 matrix products on A100 and later in fp32 unless told
# otherwise (`torch.backends.cuda.matmul.allow_tf32`, or
# `torch.set_float32_matmul_precision("high")`), so the fair baseline there is
# fp32, not tf32. What carries over to a GPU is the data sheets' direction, not this CPU's result.

# %% [markdown]
# **Does it learn the same?** Ten steps from the same seed, fp32 and bf16
# autocast (the same batches and dropout masks):

# %%
bf16_run_model, bf16_losses = short_run(lambda model: model, mixed_precision="bf16")
bf16_loss_gap = max(abs(a - b) for a, b in zip(reference_losses, bf16_losses))
figure = plots.plot_loss_curves(
    {"fp32": reference_losses, "bf16 autocast": bf16_losses, "activation checkpointing": checkpointed_losses},
    title=f"The first {len(reference_losses)} steps, same seed: fp32, bf16 autocast, checkpointing",
)
print(f"largest loss gap between fp32 and bf16 autocast over {len(bf16_losses)} steps: {bf16_loss_gap:.1e}")

# %% [markdown]
# The curves stay together: the rounding of bf16 matrix products moves the loss
# by the amount printed, much less than it moves from step to step.
#
# **Why pure bf16 storage is riskier: small updates vanish.** With 8
# significant bits, the bf16 numbers next to a weight w are about w/128 apart
# (between w/256 and w/128, depending on where w falls between two powers of 2).
# Adding an update smaller than half that gap rounds back to w: the weight does
# not move. Below, updates of a given size relative to each entry are added to
# a real weight matrix of the model, stored in fp32 and in bf16:

# %%
real_weight = models.load_pretrained_classifier().distilbert.transformer.layer[0].attention.q_lin.weight.detach()
relative_updates = [2.0 ** (quarter / 4) for quarter in range(-48, -19)]  # 2^-12 to 2^-5
changed_share = {}  # storage dtype -> share of entries that change, for each relative update
for dtype in (torch.float32, torch.bfloat16):
    stored = real_weight.to(dtype)
    changed_share[str(dtype).removeprefix("torch.")] = [
        ((stored + relative * stored.abs()) != stored).float().mean().item() for relative in relative_updates
    ]
figure = lever_plots.plot_vanishing_updates(relative_updates, changed_share, threshold=1 / 256)

# %% [markdown]
# Updates below 1/512 of a weight always vanish, updates above 1/256 never do,
# and in between it depends on where the weight falls.
#
# In training: AdamW's first step moves every weight that has a gradient by
# about the learning rate (the ratio of its moments is ±1). In bf16 storage a
# weight stays where it is when half the bf16 gap around it is larger than
# that. With this lesson's large learning rate (1e-3) that is only the rare
# weights of size 0.5 or more; at the learning rates used to fine-tune
# BERT-sized models (2e-5 to 5e-5 in the BERT paper), it is most of them. One
# real step on the whole model at 2e-5, in fp32 and in pure bf16, against the
# prediction from the weights' sizes alone:

# %%
FINE_TUNING_LR = 2e-5


def bf16_half_gap(weights):
    """Half the distance from each weight to the next bf16 number away from zero: 2^(exponent - 8)."""
    return torch.exp2(torch.floor(torch.log2(weights.float().abs().clamp_min(1e-30))) - 8)


def one_adamw_step(dtype):
    """Return the share of weights with a gradient that the step left unchanged, and the share predicted for bf16."""
    set_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(models.TINY_CHECKPOINT_DIR, dtype=dtype)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=FINE_TUNING_LR, weight_decay=0.0)
    model(**gradient_batch).loss.backward()
    # Embedding rows of tokens absent from the batch get a zero gradient, and AdamW leaves them be.
    has_gradient = [parameter.grad != 0 for parameter in model.parameters()]
    optimizer.step()
    moving = sum(mask.sum().item() for mask in has_gradient)
    unchanged = sum(((p.detach() == b) & mask).sum().item()
                    for p, b, mask in zip(model.parameters(), before, has_gradient))
    predicted = sum(((bf16_half_gap(b) > FINE_TUNING_LR) & mask).sum().item() for b, mask in zip(before, has_gradient))
    return unchanged / moving, predicted / moving


for dtype in (torch.float32, torch.bfloat16):
    unchanged, predicted = one_adamw_step(dtype)
    print(f"{str(dtype):>15}: {100 * unchanged:5.1f}% of the weights with a gradient did not move")
print(f"predicted for bf16 storage (half the gap above lr = {FINE_TUNING_LR:g}): {100 * predicted:.1f}%")

# %% [markdown]
# That is why mixed precision keeps an fp32 copy of the weights: the update
# is computed and added in fp32, and only the forward pass sees bf16. Pure bf16
# storage saves the most memory and is used for very large models, usually with
# tricks to keep small updates (stochastic rounding, or Kahan-summation buffers).
#
# **fp16, for GPU users.** `mixed_precision="fp16"` uses float16, with 11
# significant bits but only 5 exponent bits: small gradients underflow to 0.
# Accelerate then multiplies the loss by a large factor before backward and
# divides the gradients by it before the step (a `GradScaler`, inside
# `accelerator.backward` and the prepared optimizer), skipping steps whose
# gradients overflowed. bf16's float32 range needs none of that.
#
# ## 4. Training fewer parameters
#
# Gradients and optimizer state exist only for parameters that train. Two ways
# to train few of them:
#
# - **freeze the encoder**: `requires_grad_(False)` on every parameter but the
#   classification head's; the optimizer only gets the rest;
# - **LoRA** ([PEFT](https://huggingface.co/docs/peft)): keep every pre-trained
#   weight W frozen and learn a low-rank correction, W + B A, with A (r x d) and
#   B (d x r) small; `get_peft_model` adds the adapters, and trains the head too.

# %%
def frozen_encoder(model):
    for parameter in model.distilbert.parameters():
        parameter.requires_grad_(False)
    return model


LORA = "LoRA (r=16)"  # its settings, with each variant's learning rate, live in course_utils.fine_tuning_variants
LORA_SETTINGS = fine_tuning_variants.VARIANTS[LORA]


def with_lora(model):
    # Copies of the lists: PEFT adds the classifier's names to the list it is given.
    lora_config = LoraConfig(task_type="SEQ_CLS", r=LORA_SETTINGS["r"], lora_alpha=LORA_SETTINGS["lora_alpha"],
                             target_modules=list(LORA_SETTINGS["target_modules"]),
                             modules_to_save=list(LORA_SETTINGS["modules_to_save"]))
    return get_peft_model(model, lora_config)


print(f"{LORA}: lora_alpha {LORA_SETTINGS['lora_alpha']}, adapters on {', '.join(LORA_SETTINGS['target_modules'])}; "
      f"trained whole: {', '.join(LORA_SETTINGS['modules_to_save'])}")


# %% tags=["nbval-check-output"]
variants = {"full fine-tuning": lambda model: model, "frozen encoder": frozen_encoder, LORA: with_lora}
for name, make_variant in variants.items():
    model = make_variant(models.load_pretrained_classifier())
    print(f"{name:>16}: {models.count_parameters(model, trainable_only=True):>7,} trainable of "
          f"{models.count_parameters(model):,} parameters")

# %% [markdown]
# **Memory**, planned and measured. The frozen encoder needs no gradient of its
# own and no activations saved for one; LoRA still back-propagates through every
# block, to reach the adapters, so it keeps most activations:

# %%
fewer_parameter_checks = {"full fine-tuning": accumulation_checks["batch of 32"]}
for name in ("frozen encoder", LORA):
    fewer_parameter_checks[name] = levers.plan_and_measure(variants[name](models.load_pretrained_classifier()),
                                                           memory.TrainingSetup("adamw", 32, SEQ_LEN))
display(Markdown(levers.memory_table(fewer_parameter_checks)))

# %% [markdown]
# **Time.** One optimizer step of each on the same 32 pairs, 7 times:

# %%
variant_timings = {}
for name, make_variant in variants.items():
    set_seed(0)
    model = make_variant(models.load_pretrained_classifier())
    optimizer = optimizers.make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    variant_timings[name] = speed.Timing(tuple(speed.time_optimizer_step(model, optimizer, [gradient_batch])))
    print(f"{name:>16}: {speed.describe_timing(variant_timings[name].seconds)}")
display(Markdown(f"Here {speed.verdict(LORA, variant_timings[LORA], 'full fine-tuning', variant_timings['full fine-tuning']).sentence()}."))

# %% [markdown]
# On large models LoRA is faster than full fine-tuning. Its
# work has three parts. It saves the *weight* gradients of the frozen
# matrices (a frozen Linear's backward computes only the gradient of its
# input: one matrix product instead of two) and almost all of the optimizer
# step. It adds the adapters' small products, and it still pays for the whole
# forward pass and for the backward through every block, to reach the adapters.
# On this tiny model (width 64) the adapters, rank 16 and on the word
# embeddings too, cost about what LoRA saves, every operation is small, so the
# time goes to launching operations, and LoRA launches more of them; on a
# 7B-shaped model (width 4,096) each operation is large and the saved
# arithmetic decides. Counted, for one forward and
# backward pass (the course model on the batch of 32; one Llama-2-7B-shaped
# block, built on the meta device, on 1,024 tokens), with PyTorch's
# `FlopCounterMode` and a dispatch mode that counts the operations:

# %%
class CountingOperations(TorchDispatchMode):
    """Count the operations dispatched inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def forward_backward_cost(run):
    """Return (floating-point operations, dispatched operations) of ``run()``."""
    with FlopCounterMode(display=False) as flops, CountingOperations() as operations:
        run()
    return flops.get_total_flops(), operations.calls


llama_block_config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                                 num_hidden_layers=1, vocab_size=32000)
llama_block_config._attn_implementation = "sdpa"  # a block built on its own names its attention kernel itself


def llama_block_cost(lora):
    with torch.device("meta"):
        block = torch.nn.ModuleDict({"layer": LlamaDecoderLayer(llama_block_config, layer_idx=0)})
        if lora:
            block = get_peft_model(block, LoraConfig(r=LORA_SETTINGS["r"], lora_alpha=LORA_SETTINGS["lora_alpha"], target_modules=[
                "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        hidden = torch.randn(1, 1024, 4096, requires_grad=True)
        position_embeddings = LlamaRotaryEmbedding(llama_block_config)(hidden, torch.arange(1024)[None])
    layer = block.base_model.model["layer"] if lora else block["layer"]

    def run():
        output = layer(hidden, position_embeddings=position_embeddings)
        (output[0] if isinstance(output, tuple) else output).sum().backward()

    return forward_backward_cost(run)


costs = {}
for name in ("full fine-tuning", LORA):
    model = variants[name](models.load_pretrained_classifier())
    costs["course model", name] = forward_backward_cost(lambda: model(**gradient_batch).loss.backward())
    costs["Llama-2-7B-shaped block", name] = llama_block_cost(lora=name != "full fine-tuning")
widths = {"course model": models.load_pretrained_classifier().config.dim,
          "Llama-2-7B-shaped block": llama_block_config.hidden_size}
for where in ("course model", "Llama-2-7B-shaped block"):
    (full_flops, full_calls), (lora_flops, lora_calls) = costs[where, "full fine-tuning"], costs[where, LORA]
    print(f"{where:>24} (width {widths[where]:,}): LoRA does {lora_flops / full_flops:.0%} of full fine-tuning's arithmetic "
          f"({lora_flops / 1e9:,.3g} of {full_flops / 1e9:,.4g} GFLOP) in {lora_calls / full_calls:.1f}x as many operations "
          f"({lora_calls} of {full_calls})")

# %% [markdown]
# On top of that, full fine-tuning's optimizer step reads every weight, its
# gradient and both of AdamW's moments, and writes the weight and the moments
# back: on a 7B model, billions of parameters' worth of memory traffic per
# step, which LoRA's few million trainable parameters avoid.
# What LoRA does not save is the forward pass and the activation gradients
# of the backward: it is never cheaper than those.

# %% [markdown]
# **What the model learns.** Two epochs of each, from seed 0, with lesson 1's
# loop. LoRA trains far fewer parameters and is given a larger learning rate.
# On a model this small (width 64) its settings matter: with adapters on the
# linear layers alone, some seeds stayed at the majority class, the loss at
# ln 2 for both epochs (the settings tried are listed in
# `course_utils/fine_tuning_variants.py`); adapting the word embeddings too,
# and training the whole head, is what made it learn on every seed below.

# %%
NUM_EPOCHS = 2
learning_rates = {name: settings["lr"] for name, settings in fine_tuning_variants.VARIANTS.items()}
print(", ".join(f"{name}: lr {lr:g}" for name, lr in learning_rates.items()))
trained_losses, trained_scores = {}, {}
for name in tqdm(variants, desc="training the three variants"):
    set_seed(0)
    model = variants[name](models.load_pretrained_classifier())
    train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = optimizers.make_optimizer("adamw", trainable, lr=learning_rates[name])
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, NUM_EPOCHS * len(train_dataloader))
    accelerator = accelerate_state.fresh_accelerator()
    trained_losses[name] = loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, NUM_EPOCHS, accelerator)
    trained_scores[name] = loops.evaluate(model, eval_dataloader)

figure = plots.plot_loss_curves(trained_losses, title="Fine-tuning the course DistilBERT, 2 epochs, seed 0", smooth=10)

# %% [markdown]
# One seed is not a ranking: another seed draws other batches, other dropout
# masks and another initial head, and a variant that learns on one seed can
# stay at the majority class on the next. The same three runs over five
# seeds take minutes, so they are **cached**: `tools/lesson5_seed_runs.py`
# trains them with exactly this code (same variants, learning rates, epochs,
# `set_seed(seed)` and data shuffled with `seed`) and writes
# `lessons/cached/05_seed_runs.json`. This notebook reads that file, and
# checks it against the seed it has just trained live:

# %%
seed_runs = fine_tuning_variants.load_seed_runs()
cached = {(run["variant"], run["seed"]): run["accuracy"] for run in seed_runs["runs"]}
for name, scores in trained_scores.items():
    print(f"{name:>16}, seed 0: live {scores['accuracy']:.4f}, cached {cached[name, 0]:.4f}, "
          f"gap {abs(scores['accuracy'] - cached[name, 0]):.1e}")
accuracy_by_seed = {name: {seed: accuracy for (variant, seed), accuracy in cached.items() if variant == name}
                    for name in variants}
figure = lever_plots.plot_scores_over_seeds(
    accuracy_by_seed, baseline=majority_share, highlight=0,
    title=f"Validation accuracy over {len(accuracy_by_seed[LORA])} seeds (cached; seed 0, ringed, retrained above)",
)

# %% [markdown]
# The verdict, computed from every seed: each variant against the majority
# baseline (with the 95% interval of evaluating on this many pairs) and
# against full fine-tuning, seed by seed.

# %%
def interval_half_width(accuracy):
    return 1.96 * math.sqrt(accuracy * (1 - accuracy) / len(labels))


rows = ["| training | trainable parameters | accuracy, median over seeds | lowest - highest | seeds clearly above the majority |",
        "| --- | --- | --- | --- | --- |"]
for name, by_seed in accuracy_by_seed.items():
    values = sorted(by_seed.values())
    above = sum(value - interval_half_width(value) > majority_share for value in values)
    trainable_count = models.count_parameters(variants[name](models.load_pretrained_classifier()), trainable_only=True)
    rows.append(f"| {name} | {trainable_count:,} | {statistics.median(values):.3f} | {values[0]:.3f} - {values[-1]:.3f} "
                f"| {above} of {len(values)} |")
rows.append(f"| always the majority label | 0 | {majority_share:.3f} | | |")
display(Markdown("\n".join(rows)))

full_by_seed = accuracy_by_seed["full fine-tuning"]
for name in ("frozen encoder", LORA):
    by_seed = accuracy_by_seed[name]
    learned = sum(value - interval_half_width(value) > majority_share for value in by_seed.values())
    below_full = sum(by_seed[seed] < full_by_seed[seed] for seed in by_seed)
    print(f"{name}: clearly above the majority baseline on {learned} of {len(by_seed)} seeds; "
          f"below full fine-tuning on {below_full} of {len(by_seed)} seeds "
          f"(median gap {statistics.median([full_by_seed[seed] - by_seed[seed] for seed in by_seed]):+.3f})")

# %%
def clearly_above_majority(by_seed):
    return [seed for seed, value in sorted(by_seed.items()) if value - interval_half_width(value) > majority_share]


lora_by_seed = accuracy_by_seed[LORA]
full_learned, lora_learned = clearly_above_majority(full_by_seed), clearly_above_majority(lora_by_seed)
lora_ahead = [seed for seed in sorted(full_by_seed) if lora_by_seed[seed] > full_by_seed[seed]]
seed_zero_order = "above" if lora_by_seed[0] > full_by_seed[0] else "below"
not_learned = {name: sorted(set(by_seed) - set(clearly_above_majority(by_seed)))
               for name, by_seed in (("full fine-tuning", full_by_seed), (LORA, lora_by_seed))}
reliability = "".join(
    f" {name[0].upper() + name[1:]} was not clearly above the majority class on seed{'s' if len(seeds) > 1 else ''} "
    f"{', '.join(map(str, seeds))} (at its learning rate, in two epochs)." for name, seeds in not_learned.items() if seeds
)
display(Markdown(f"""
Over {len(full_by_seed)} seeds, full fine-tuning learned clearly on {len(full_learned)} (seeds
{", ".join(map(str, full_learned)) or "none"}), LoRA on {len(lora_learned)}, and LoRA scored above full
fine-tuning on {len(lora_ahead)} of {len(full_by_seed)} seeds. Seed 0 alone put LoRA {seed_zero_order} full
fine-tuning; the spread over seeds is what a ranking needs.{reliability} Training fewer
parameters is a trade whose cost or gain only such a measurement tells, on your model and
task. On large pre-trained models LoRA usually comes close to full
fine-tuning (the LoRA paper reports it on par on RoBERTa, DeBERTa, GPT-2 and GPT-3), while
freezing all but the head rarely does.
"""))

# %% [markdown]
# ## 5. The loop features of a real job
#
# ### Gradient clipping
#
# A rare batch can give a gradient many times larger than usual. What one
# such gradient does depends on the optimizer. Under SGD the step is the
# learning rate times the gradient: a gradient 100 times larger moves the
# weights 100 times further, and one step can undo much of the training. Under
# AdamW the step is divided by the root of the second moment, which the large
# gradient itself inflates: the step stays bounded, but the inflated moment
# shrinks the steps that follow, until it decays (β2 = 0.999: hundreds of
# steps). Below, a vector of 10,000 weights trains on noisy gradients; at
# step 200 one gradient is multiplied by `spike`. The size of each update,
# in units of the learning rate (root mean square over the weights):

# %%
def update_sizes(optimizer_name, spike, lr=1e-3, size=10_000, warm_up=200, after=50):
    """Return the update size (RMS over the weights, in units of lr) before, at, and on average after a spike."""
    torch.manual_seed(0)
    weights = torch.zeros(size, requires_grad=True)
    optimizer = (torch.optim.AdamW([weights], lr=lr, weight_decay=0.0) if optimizer_name == "AdamW"
                 else torch.optim.SGD([weights], lr=lr))
    signal = torch.randn(size)  # the direction the gradients share; each step adds its own noise
    sizes = []
    for step in range(warm_up + 1 + after):
        before = weights.detach().clone()
        weights.grad = (signal + torch.randn(size)) * (spike if step == warm_up else 1)
        optimizer.step()
        sizes.append((weights.detach() - before).norm().item() / size**0.5 / lr)
    return sizes[warm_up - 1], sizes[warm_up], sum(sizes[warm_up + 1:]) / after


SPIKES = (10, 100, 10_000)
print(f"{'':>6} {'spike':>7} {'step before':>12} {'step at the spike':>18} {'mean of the next 50':>20}  (units of lr)")
spike_sizes = {}
for optimizer_name in ("SGD", "AdamW"):
    for spike in SPIKES:
        spike_sizes[optimizer_name, spike] = update_sizes(optimizer_name, spike)
        before, at, after = spike_sizes[optimizer_name, spike]
        print(f"{optimizer_name:>6} {spike:>7,} {before:>12.3g} {at:>18.3g} {after:>20.3g}")

# %% [markdown]
# Under SGD the spiked step grows with the spike, and the next steps are as
# before; under AdamW the spiked step stays near the same size whatever the
# spike, and the harm comes after: the next 50 steps are smaller than before
# the spike. Clipping guards against both: it bounds the step of SGD, and it
# keeps one gradient from inflating AdamW's second moment.
#
# Clipping rescales the whole gradient
# when its norm is above `max_grad_norm`. The place matters: **after** the
# backward that completes the gradient, **before** the step that uses it, and
# when accumulating, **only on the micro-batch that updates**
# (`accelerator.sync_gradients`): the gradients of the earlier micro-batches are
# partial sums.

# %%
display(HTML(loop_diff.loop_diff_html(feature_loops.train_accumulating, feature_loops.train_clipping)))

# %% [markdown]
# `accelerator.clip_grad_norm_` rather than `torch.nn.utils.clip_grad_norm_`:
# under fp16 it first divides the gradients by the loss scale, and under FSDP
# it clips the whole gradient, not one shard's. It returns the norm *before*
# clipping. Under **DeepSpeed** it clips nothing: DeepSpeed clips inside its
# own step, at the `gradient_clipping` of its config, and the call only
# returns DeepSpeed's norm; the `max_norm` you pass is ignored. Accelerate's
# own code says so (its DeepSpeed branch, printed from the installed version):

# %%
clip_source = inspect.getsource(accelerate.Accelerator.clip_grad_norm_)
branch_start = clip_source.rindex("\n", 0, clip_source.index("elif self.distributed_type == DistributedType.DEEPSPEED")) + 1
deepspeed_branch = clip_source[branch_start:clip_source.index("elif self.distributed_type == DistributedType.XLA")]
print(f"accelerate {accelerate.__version__}, Accelerator.clip_grad_norm_(parameters, max_norm), under DeepSpeed:")
print(textwrap.dedent(deepspeed_branch).rstrip())
print(f"max_norm appears in that branch: {'max_norm' in deepspeed_branch}")

# %% [markdown]
# Fifty steps of full fine-tuning, clipped at 1.0:

# %%
set_seed(0)
model = models.load_pretrained_classifier()
train_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0, limit=50 * BATCH_SIZE)
optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, len(train_dataloader))
accelerator = accelerate_state.fresh_accelerator()
clipped_losses, grad_norms = feature_loops.train_clipping(
    model, optimizer, lr_scheduler, train_dataloader, 1, accelerator, max_grad_norm=1.0
)
figure = lever_plots.plot_gradient_norms(grad_norms, max_grad_norm=1.0)
clipped_share = sum(norm > 1.0 for norm in grad_norms) / len(grad_norms)
print(f"{100 * clipped_share:.0f}% of the {len(grad_norms)} steps were clipped; "
      f"median norm {statistics.median(grad_norms):.2f}, largest {max(grad_norms):.2f}")

# %% [markdown]
# After the call the gradient's norm is at most `max_grad_norm`. On one batch,
# clipped at half its norm:

# %%
model(**gradient_batch).loss.backward()
half_norm = torch.nn.utils.get_total_norm([parameter.grad for parameter in model.parameters()]).item() / 2
norm_before = accelerator.clip_grad_norm_(model.parameters(), half_norm)
norm_after = torch.nn.utils.get_total_norm([parameter.grad for parameter in model.parameters()])
print(f"norm returned (before clipping): {norm_before:.4f}; after clipping at {half_norm:.4f}: {norm_after:.4f}")
model.zero_grad()

# %% [markdown]
# ### Saving the model: `unwrap_model`, `save_model`, `from_pretrained`
#
# `prepare` may wrap the model (in `DistributedDataParallel` on several
# processes; under mixed precision, its forward in autocast).
# `accelerator.unwrap_model(model)` gives back your model, which transformers
# saves with `save_pretrained` and reloads with `from_pretrained`.
# `accelerator.save_model(model, folder)` unwraps and writes the weights alone
# (`model.safetensors`), once, from the main process; `from_pretrained` also
# needs the config:

# %%
with tempfile.TemporaryDirectory() as folder:
    accelerator.wait_for_everyone()  # on several processes: every one has finished its last step
    accelerator.save_model(model, folder)
    print(f"save_model wrote: {sorted(path.name for path in Path(folder).iterdir())}")
    accelerator.unwrap_model(model).config.save_pretrained(folder)
    reloaded = AutoModelForSequenceClassification.from_pretrained(folder)
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        same = torch.equal(model(**gradient_batch).logits, reloaded(**gradient_batch).logits)
    print(f"with the config: {sorted(path.name for path in Path(folder).iterdir())}; reloaded model, same logits: {same}")

# %% [markdown]
# Back to clipping for a moment: the `Trainer` clips at 1.0 unless told
# otherwise. That is the value of the original BERT recipe (its
# `optimization.py` clips the global norm at 1.0), which the Trainer kept as its
# default; on the run above, clipping at 1.0 acted on the share of steps printed
# there: a guard against the rare large gradient, not a change to every step.

# %%
with tempfile.TemporaryDirectory() as scratch:
    print(f"TrainingArguments().max_grad_norm = {TrainingArguments(output_dir=scratch, report_to='none').max_grad_norm}")

# %% [markdown]
# ### Resuming an interrupted training: `save_state` and `load_state`
#
# A model file is enough to *use* a model, not to *continue training* it: the
# optimizer's moments, the scheduler's position, the random number generators
# (dropout) and the place in the data are missing. `accelerator.save_state(folder)`
# writes all of them; `accelerator.load_state(folder)`, after `prepare`, puts
# them back, and `accelerator.skip_first_batches` skips the batches already
# seen. Accelerate's `examples/by_feature/checkpointing.py` does the same:

# %%
display(HTML(loop_diff.loop_diff_html(feature_loops.train_accumulating, feature_loops.train_resumable)))

# %% [markdown]
# The batch order of each epoch must depend on the epoch number alone, so that
# a resumed run draws the same batches: `DataLoaderConfiguration(use_seedable_sampler=True)`
# and `train_dataloader.set_epoch(epoch)` do that. Three runs of two epochs
# over 256 pairs (8 optimizer steps per epoch, 2 micro-batches each): without
# interruption; interrupted after step 11; and resumed from the state saved at step 10.

# %%
RESUME_EXAMPLES = 256


def resumable_objects():
    set_seed(0)
    model = models.load_pretrained_classifier()
    train_dataloader = data.make_dataloader("train", batch_size=16, seed=0, limit=RESUME_EXAMPLES)
    optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, 2 * len(train_dataloader) // 2)
    accelerator = accelerate_state.fresh_accelerator(
        gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    return model, optimizer, lr_scheduler, train_dataloader, accelerator


with tempfile.TemporaryDirectory() as checkpoints:
    uninterrupted, optimizer, lr_scheduler, train_dataloader, accelerator = resumable_objects()
    feature_loops.train_resumable(uninterrupted, optimizer, lr_scheduler, train_dataloader, 2, accelerator,
                           checkpointing_steps=100, output_dir=f"{checkpoints}/whole")
    interrupted, optimizer, lr_scheduler, train_dataloader, accelerator = resumable_objects()
    feature_loops.train_resumable(interrupted, optimizer, lr_scheduler, train_dataloader, 2, accelerator,
                           checkpointing_steps=10, output_dir=f"{checkpoints}/run", stop_after_steps=11)
    saved = Path(checkpoints) / "run" / "step_10"
    print(f"{saved.name} holds: {sorted(path.name for path in saved.iterdir())}")
    resumed, optimizer, lr_scheduler, train_dataloader, accelerator = resumable_objects()
    feature_loops.train_resumable(resumed, optimizer, lr_scheduler, train_dataloader, 2, accelerator,
                           checkpointing_steps=100, output_dir=f"{checkpoints}/resumed", resume_from_checkpoint=saved)

print(f"resumed from the saved state: largest parameter gap to the uninterrupted run "
      f"{max((a - b).abs().max().item() for a, b in zip(resumed.parameters(), uninterrupted.parameters())):.1e}")
print(f"the interrupted run, stopped at step 11: "
      f"{max((a - b).abs().max().item() for a, b in zip(interrupted.parameters(), uninterrupted.parameters())):.1e}")

# %% [markdown]
# The resumed run ends on exactly the uninterrupted run's parameters. A test of
# the course (`tests/training/test_feature_loops.py`) holds this for checkpoints in either
# epoch, and checks the converse: skipping the seen batches without
# `load_state` ends elsewhere.

# %% [markdown]
# ### The same levers with the `Trainer`
#
# Every lever of this lesson is one argument of transformers' `TrainingArguments`:
# `gradient_accumulation_steps`, `activation_checkpointing` (the older name
# `gradient_checkpointing` still works and warns), `bf16`, `optim`,
# `save_strategy` with `save_steps`, and `trainer.train(resume_from_checkpoint=...)`;
# a PEFT model goes to the `Trainer` as it is. Built and read back, on the
# 32 pairs of the batch above (two optimizer steps of 8 x 4 micro-batches):

# %%
trainer_examples = [{key: tensor[i] for key, tensor in gradient_batch.items()} for i in range(len(gradient_batch["labels"]))]


def trainer_for(folder, model=None, **lever_arguments):
    """A Trainer of the course model (or ``model``) on the 32 pairs, two optimizer steps, no logging."""
    accelerate_state.fresh_accelerator()  # the Trainer builds its own Accelerator: forget the notebook's last one first
    set_seed(0)
    arguments = TrainingArguments(output_dir=folder, per_device_train_batch_size=8, max_steps=2, learning_rate=LEARNING_RATE,
                                  weight_decay=0.01, report_to="none", disable_tqdm=True, logging_strategy="no",
                                  use_cpu=True, seed=0, **lever_arguments)
    return Trainer(model=model if model is not None else models.load_pretrained_classifier(), args=arguments,
                   train_dataset=trainer_examples, data_collator=default_data_collator)


TRAINER_LEVERS = {"gradient_accumulation_steps": 4, "activation_checkpointing": True,
                  "save_strategy": "steps", "save_steps": 1}
with tempfile.TemporaryDirectory() as trainer_folder:
    trainer = trainer_for(trainer_folder, **TRAINER_LEVERS)
    forward_calls = []
    trainer.model.register_forward_hook(lambda *args: forward_calls.append(1))
    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its end-of-training summary
        trainer.train()
    print(f"gradient_accumulation_steps=4: {len(forward_calls)} micro-batches of 8, "
          f"{trainer.state.global_step} optimizer steps")
    print(f"activation_checkpointing=True: model.is_activation_checkpointing = {trainer.model.is_activation_checkpointing}")
    print(f"save_strategy='steps', save_steps=1: {sorted(path.name for path in Path(trainer_folder).iterdir())}")
    print("weight decay by parameter group: " + ", ".join(
        f"{group['weight_decay']} on {len(group['params'])} tensors" for group in trainer.optimizer.param_groups))
    names = {parameter: name for name, parameter in trainer.model.named_parameters()}
    undecayed = [names[p] for group in trainer.optimizer.param_groups if group["weight_decay"] == 0 for p in group["params"]]
    print(f"  the {len(undecayed)} without decay are all biases or LayerNorm weights: "
          f"{all(name.endswith('bias') or 'layernorm' in name.lower().replace('_', '') for name in undecayed)} "
          f"(e.g. {undecayed[0]}, {undecayed[-1]})")
    uninterrupted_parameters = [parameter.detach().clone() for parameter in trainer.model.parameters()]
    resumed_trainer = trainer_for(f"{trainer_folder}/resumed", **TRAINER_LEVERS)
    with contextlib.redirect_stdout(io.StringIO()):
        resumed_trainer.train(resume_from_checkpoint=str(Path(trainer_folder) / "checkpoint-1"))
    print(f"train(resume_from_checkpoint='checkpoint-1'): ends at step {resumed_trainer.state.global_step}, largest "
          f"parameter gap to the uninterrupted run {max((a - b).abs().max().item() for a, b in zip(uninterrupted_parameters, resumed_trainer.model.parameters())):.1e}")
    bf16_trainer = trainer_for(f"{trainer_folder}/bf16", bf16=True)
    print(f"bf16=True: the Trainer's Accelerator runs mixed_precision={bf16_trainer.accelerator.mixed_precision!r}")
    eight_bit_trainer = trainer_for(f"{trainer_folder}/8bit", optim="adamw_bnb_8bit")
    eight_bit_class = type(eight_bit_trainer.create_optimizer())
    print(f"optim='adamw_bnb_8bit': the Trainer's optimizer is {eight_bit_class.__module__}.{eight_bit_class.__name__}")
    lora_trainer = trainer_for(f"{trainer_folder}/lora", model=variants[LORA](models.load_pretrained_classifier()))
    lora_trainer.create_optimizer()
    print(f"a PEFT model: the Trainer's optimizer holds "
          f"{sum(p.numel() for group in lora_trainer.optimizer.param_groups for p in group['params']):,} parameters, "
          f"the trainable ones")

# %% [markdown]
# Two differences from the Accelerate loops above. The `Trainer` builds its
# own optimizer, with weight decay on every tensor but the biases and the
# LayerNorm weights (the groups printed above); passing your own with
# `Trainer(..., optimizers=(optimizer, lr_scheduler))` bypasses that, and
# the decay then is whatever your optimizer applies. And its default
# `max_grad_norm` clips at 1.0 (above).
#
# ## 6. Putting it together: does it fit?
#
# An RTX 4090, sold as "24 GB", reports its memory in binary units (lesson 4:
# `course_utils.gpus`), and a 7B-parameter Llama-shaped causal
# LM to fine-tune on sequences of 1,024 tokens, one per micro-batch. The planner
# of lesson 4 follows one step of the full-size model on fake tensors; here are
# three combinations of levers, from none to the ones that fit:

# %%
llama_class, llama_config = models.fine_tuning_configs()["Llama-2-7B-shaped"]
LLAMA_SEQ_LEN = 1024
LLAMA_CARD = "RTX 4090 (24 GB)"
LLAMA_BUDGET = gpus.gpu_memory_bytes(LLAMA_CARD)  # 24,564 MiB, as nvidia-smi reports it
print(f"{LLAMA_CARD}: {gpus.GPU_MEMORY_MIB[LLAMA_CARD]:,} MiB = {format_bytes(LLAMA_BUDGET)}; {gpus.HEADROOM_NOTE}")
llama_combinations = {
    "fp32, all trained": levers.Levers(),
    "bf16 weights, checkpointing, all trained": levers.Levers(bf16_weights=True, activation_checkpointing=True),
    "bf16 weights, checkpointing, LoRA": levers.Levers(bf16_weights=True, activation_checkpointing=True, train="lora"),
}
llama_plans = {}
for name, combination in tqdm(llama_combinations.items(), desc="planning"):
    llama_plans[name] = levers.plan_with_levers(llama_class, llama_config, combination, LLAMA_SEQ_LEN)
    print(f"{name}:\n    {levers.describe_fit(llama_plans[name], LLAMA_BUDGET)}")

# %% [markdown]
# Each lever shrinks one term: checkpointing the activations, LoRA the
# gradients and optimizer state, bf16 storage the weights. Accumulation then
# gives back the batch size: from two micro-batches on, the peak does not grow
# with their number, only the time does. What a real GPU adds to the plan
# (`memory.DEVICE_NOTE`):

# %%
print(memory.DEVICE_NOTE)

# %% [markdown]
# Memory against model size, one line per combination: the same Llama shape
# with 1 block and with all 32 (parameters grow with the number of blocks;
# the 32-block points are the plans above):

# %%
lines = {name: [] for name in llama_combinations}
for layers in tqdm([1, llama_config.num_hidden_layers], desc="planning two depths"):
    config = copy.deepcopy(llama_config)
    config.num_hidden_layers = layers
    for name, combination in llama_combinations.items():
        plan = llama_plans[name] if layers == llama_config.num_hidden_layers else levers.plan_with_levers(
            llama_class, config, combination, LLAMA_SEQ_LEN)
        with torch.device("meta"):
            parameter_count = models.count_parameters(llama_class.from_config(config))
        lines[name].append((parameter_count, plan.peak))
figure = lever_plots.plot_memory_against_parameters(
    lines, budget=LLAMA_BUDGET, budget_label=LLAMA_CARD,
    title=f"Llama-shaped causal LMs, 1 x {LLAMA_SEQ_LEN} tokens, AdamW: planned peak"
)

# %% [markdown]
# The planner itself extrapolates a model's depth from runs of 1, 2 and 3
# blocks, and checks that every quantity grows by the same amount per block:
# memory is a straight line in the number of blocks, and so in parameters, and
# two depths per combination draw it.
#
# ## Summary
#
# | to shrink | lever | the lines |
# | --- | --- | --- |
# | activations | gradient accumulation | `Accelerator(gradient_accumulation_steps=k)`, `with accelerator.accumulate(model):` |
# | activations | activation checkpointing | `model.activation_checkpointing_enable()` |
# | activations | bf16 mixed precision | `Accelerator(mixed_precision="bf16")` |
# | weights, gradients, state | pure bf16 storage | `from_pretrained(..., dtype=torch.bfloat16)` (watch the vanishing updates) |
# | gradients, state | freezing, LoRA | `requires_grad_(False)`; `get_peft_model(model, LoraConfig(...))` |
#
# And in every real job: `accelerator.clip_grad_norm_` after backward, before
# the step, on `sync_gradients`; `unwrap_model` / `save_model` to save the
# model; `save_state` / `load_state` to resume exactly. Lesson 6 runs the loop
# on several processes, where accumulation also saves communication.
#
# ## Exercises
#
# Replace each `____` with your answer, run the cell, and read the feedback.
# `ex.qN.hint()` gives a hint (call it again for the next one), `ex.qN.solution()`
# shows a solution.
#
# ### Exercise 1 — Accumulate four micro-batches
#
# Only micro-batches of 8 fit, and the recipe says batches of 32. Complete
# `train_in_micro_batches` so that its optimizer steps are those of batches of
# 32: build the `Accelerator` for it and wrap the step. The check trains it on
# micro-batches of 8 and compares the parameters with a run on batches of 32.

# %%
# BEGIN SOLUTION
def train_in_micro_batches(model, optimizer, lr_scheduler, micro_dataloader):
    accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=4)
    model, optimizer, micro_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, micro_dataloader, lr_scheduler
    )
    model.train()
    for step, batch in enumerate(micro_dataloader):
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
# END SOLUTION
# BEGIN STARTER
# def train_in_micro_batches(model, optimizer, lr_scheduler, micro_dataloader):
#     accelerator = accelerate_state.fresh_accelerator(gradient_accumulation_steps=____)
#     model, optimizer, micro_dataloader, lr_scheduler = accelerator.prepare(
#         model, optimizer, micro_dataloader, lr_scheduler
#     )
#     model.train()
#     for step, batch in enumerate(micro_dataloader):
#         with ____:
#             outputs = model(**batch)
#             loss = outputs.loss
#             accelerator.backward(loss)
#             optimizer.step()
#             lr_scheduler.step()
#             optimizer.zero_grad()
# END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2 — Place the clipping
#
# Add gradient clipping at `max_grad_norm` to this accumulating loop: after
# the backward, before the step, only on the micro-batch that updates. The
# check records the gradient each optimizer step uses.

# %%
# BEGIN SOLUTION
def train_clipped(model, optimizer, lr_scheduler, train_dataloader, accelerator, max_grad_norm):
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    model.train()
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
# END SOLUTION
# BEGIN STARTER
# def train_clipped(model, optimizer, lr_scheduler, train_dataloader, accelerator, max_grad_norm):
#     model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
#         model, optimizer, train_dataloader, lr_scheduler
#     )
#     model.train()
#     for step, batch in enumerate(train_dataloader):
#         with accelerator.accumulate(model):
#             outputs = model(**batch)
#             loss = outputs.loss
#             accelerator.backward(loss)
#             ____  # clip here, on the right micro-batches only
#             optimizer.step()
#             lr_scheduler.step()
#             optimizer.zero_grad()
# END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ### Exercise 3 — Make BERT-large fit in 8 GB
#
# You must fine-tune *every* parameter of a BERT-large classifier (335M
# parameters) with AdamW, on an effective batch of 32 sequences of 256 tokens,
# on a GPU with 8 GB, keeping the weights in fp32. Choose the levers in
# `bert_large_levers` (a `levers.Levers`; see `levers.Levers?` for its
# fields) so that the planner's peak fits. Run `levers.plan_with_levers(ex.BERT_LARGE_CLASS, ex.BERT_LARGE_CONFIG, bert_large_levers, 256)`
# to try an answer before checking it.

# %%
# BEGIN SOLUTION
bert_large_levers = levers.Levers(activation_checkpointing=True, micro_batch_size=32)
# END SOLUTION
# BEGIN STARTER
# bert_large_levers = ____  # levers.Levers(mixed_precision=..., activation_checkpointing=..., micro_batch_size=..., ...)
# END STARTER
ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]
# ### Exercise 4 — Resume a training
#
# A training was interrupted; `ex.interrupted_training()` ran it and returns the
# folder of its last saved state, written by `accelerator.save_state` after
# `completed_steps` optimizer steps. Complete `resume` so that it finishes the
# training: it must end with the parameters of the training that was never
# interrupted. (One epoch, no accumulation: one optimizer step per batch.)

# %%
checkpoint_folder, completed_steps = ex.interrupted_training()
print(f"saved after {completed_steps} steps in {Path(checkpoint_folder).name}")


# BEGIN SOLUTION
def resume(model, optimizer, lr_scheduler, train_dataloader, accelerator, checkpoint_folder, completed_steps):
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    accelerator.load_state(checkpoint_folder)
    model.train()
    for step, batch in enumerate(accelerator.skip_first_batches(train_dataloader, completed_steps)):
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
# END SOLUTION
# BEGIN STARTER
# def resume(model, optimizer, lr_scheduler, train_dataloader, accelerator, checkpoint_folder, completed_steps):
#     model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
#         model, optimizer, train_dataloader, lr_scheduler
#     )
#     ____  # restore the saved state
#     model.train()
#     for step, batch in enumerate(____):  # the batches not yet seen
#         outputs = model(**batch)
#         loss = outputs.loss
#         accelerator.backward(loss)
#         optimizer.step()
#         lr_scheduler.step()
#         optimizer.zero_grad()
# END STARTER


ex.q4.check()

# %%
# ex.q4.hint()
# ex.q4.solution()
