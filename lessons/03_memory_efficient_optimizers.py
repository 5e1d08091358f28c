# %% [markdown]
# # Lesson 3 — Adafactor, 8-bit Adam, and how much memory training really needs
#
# Lesson 2 ended on a bill: AdamW keeps two fp32 moving averages per weight,
# 8 bytes per parameter, about twice the weights themselves. Two ideas cut it
# down, each paid for with some precision in the update:
#
# | optimizer | the idea | state per parameter |
# | --- | --- | --- |
# | **AdamW** | the reference: both moving averages, in full | 8 bytes |
# | **Adafactor** | *store less*: for a matrix, only the row and column averages of the squared gradients | almost nothing for matrices |
# | **8-bit AdamW** | *store smaller*: both moving averages, quantised to 8 bits | about 2 bytes |
#
# In this lesson you will
#
# 1. build Adafactor's factored second moment from scratch and check it against two libraries;
# 2. quantise AdamW's state to 8 bits from scratch, then look at what bitsandbytes does;
# 3. measure the trade-off: state bytes against how far each update lands from AdamW's;
# 4. train the course model with all three optimizers, same data, seed and schedule;
# 5. see optimizer state grow with model size, from the tiny checkpoint to 7B-shaped models;
# 6. predict the peak memory of a whole training step, and check it against a measurement;
# 7. practise with three exercises.
#
# Everything runs on a laptop CPU in about a minute, without internet.

# %%
import copy
import math

import torch
from accelerate import init_empty_weights
from accelerate.utils import set_seed
from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel, get_linear_schedule_with_warmup

from course_utils import data, loops, memory, models, plots, quantization
from course_utils.exercises import ____
from course_utils.exercises import lesson3 as ex

MIB = 1024**2  # bytes in a mebibyte
GIB = 1024**3  # bytes in a gibibyte

# The training set-up of lesson 2: the same data, batch size, schedule and learning rate.
NUM_EPOCHS = 2
BATCH_SIZE = 32
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
TRAIN_EXAMPLES = 640  # a subset, to keep the lesson fast on a CPU

# %% [markdown]
# ## The model, and one set of gradients for every optimizer
#
# The lesson's model is the course's tiny DistilBERT (it stands in for
# `distilbert-base-cased`). Adafactor treats matrices and vectors differently,
# and 8-bit AdamW treats small tensors differently, so we count both kinds:

# %%
# NBVAL_CHECK_OUTPUT
model = models.load_pretrained_classifier()
parameters = dict(model.named_parameters())
num_parameters = models.count_parameters(model)
matrices = {name: p for name, p in parameters.items() if p.dim() >= 2}
print(f"{num_parameters:,} parameters in {len(parameters)} tensors: "
      f"{len(matrices)} matrices ({sum(p.numel() for p in matrices.values()):,} parameters), "
      f"{len(parameters) - len(matrices)} vectors ({num_parameters - sum(p.numel() for p in matrices.values()):,} parameters)")

# %% [markdown]
# To compare optimizers fairly, each must see *exactly* the same gradients. We
# record them once: the gradients of the loss on the first 10 training batches,
# all taken at the checkpoint's weights (`quantization.record_gradients`). Later
# cells replay this list through each optimizer.

# %%
NUM_REPLAY_STEPS = 10
set_seed(0)
train_dataloader, validation_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0, limit=TRAIN_EXAMPLES)
recorded_gradients = quantization.record_gradients(model, train_dataloader, max_batches=NUM_REPLAY_STEPS)
print(f"{len(recorded_gradients)} steps x {len(recorded_gradients[0])} gradient tensors")

# %% [markdown]
# ## 1. Adafactor: store less
#
# ### The idea
#
# For a weight matrix $W$ of $n \times m$, AdamW's second moment $V$ is another
# $n \times m$ matrix: the moving average of the squared gradients $G^2$.
# Adafactor keeps only two vectors, the moving averages of the **row means**
# $R \in \mathbb{R}^n$ and of the **column means** $C \in \mathbb{R}^m$ of $G^2$,
# and rebuilds an estimate of $V$ when it needs one:
#
# $$R_t = \beta_{2,t} R_{t-1} + (1 - \beta_{2,t})\,\operatorname{mean}_j G_t^2 \qquad
#   C_t = \beta_{2,t} C_{t-1} + (1 - \beta_{2,t})\,\operatorname{mean}_i G_t^2 \qquad
#   \hat V_{ij} = \frac{R_i\, C_j}{\operatorname{mean}(R)}$$
#
# $n + m$ numbers instead of $n \times m$. Two facts make this work:
#
# - averaging is linear, so the moving average of the row means *is* the row
#   means of the moving average: $R$ and $C$ are exactly the row and column
#   means of the $V$ AdamW would keep, without ever building $V$;
# - $\hat V$ is the simplest (rank-1) matrix with those row and column means; it
#   is exact when every row of $V$ is a multiple of every other row.
#
# Adafactor also replaces bias correction by a $\beta_2$ that grows with the
# step, $\beta_{2,t} = 1 - t^{-0.8}$ (0 at the first step, 0.9 at the 18th).
#
# ### From scratch, on one weight matrix
#
# Take the first feed-forward weight of the model and run both versions over
# the recorded gradients: AdamW's full moving average, and Adafactor's two vectors.

# %%
weight_name = next(name for name in parameters if "ffn.lin1.weight" in name)
weight_index = list(parameters).index(weight_name)
rows, cols = parameters[weight_name].shape
print(f"{weight_name}: {rows} x {cols}")

full_average = torch.zeros(rows, cols)  # AdamW's exp_avg_sq
row_average, col_average = torch.zeros(rows), torch.zeros(cols)  # Adafactor's two vectors
for step, gradients in enumerate(recorded_gradients, start=1):
    squared = gradients[weight_index] ** 2 + 1e-30  # transformers adds a tiny eps to avoid 0
    beta2 = 1 - step**-0.8
    full_average = beta2 * full_average + (1 - beta2) * squared
    row_means, col_means = quantization.factor_second_moment(squared)
    row_average = beta2 * row_average + (1 - beta2) * row_means
    col_average = beta2 * col_average + (1 - beta2) * col_means

# %% [markdown]
# The linearity claim, checked: the row and column means of the full moving
# average are the two vectors Adafactor kept.

# %%
full_row_means, full_col_means = quantization.factor_second_moment(full_average)
torch.testing.assert_close(row_average, full_row_means)
torch.testing.assert_close(col_average, full_col_means)
print("moving averages of the means == means of the moving average")

# %% [markdown]
# Now the rank-1 rebuild next to the full matrix. The colours (log scale) show
# what the rebuild keeps: which rows and columns have large gradients. What it
# loses is the detail of individual entries.

# %%
rebuilt = quantization.reconstruct_second_moment(row_average, col_average)
figure = plots.plot_factored_second_moment(full_average, rebuilt)

# %% [markdown]
# What matters for training is the step, which divides the gradient by the
# square root of the second moment. How far does the step computed with the
# rebuild land from the one computed with the full matrix?

# %%
# NBVAL_CHECK_OUTPUT
last_gradient = recorded_gradients[-1][weight_index]
step_full = last_gradient / full_average.sqrt()
step_rebuilt = last_gradient / rebuilt.sqrt()
step_difference = (step_rebuilt - step_full).norm() / step_full.norm()
print(f"numbers kept: {rows * cols:,} (full) against {rows + cols:,} (factored), "
      f"{rows * cols / (rows + cols):.0f} times fewer")
print(f"the step with the rebuild differs from the full one by {step_difference:.0%} (relative norm)")

# %% [markdown]
# ### The libraries: `transformers` and `torch`
#
# Two Adafactors are in common use: `transformers.optimization.Adafactor` (the
# original, from the T5 code base) and `torch.optim.Adafactor` (added in
# torch 2.5). `memory.make_optimizer` builds either by name. We replay the
# recorded gradients through both and compare their statistics for our weight
# with the two vectors computed above.
#
# One setting first. By default transformers' Adafactor chooses its own step
# size (`relative_step=True`: $\min(10^{-2}, 1/\sqrt{t})$, times the weight's
# RMS with `scale_parameter=True`). It then ignores any learning rate and schedule:
# passing `lr` is an error, and its `lr` stays `None`.

# %%
from transformers.optimization import Adafactor

try:
    Adafactor(model.parameters(), lr=LEARNING_RATE)
except ValueError as error:
    print(f"ValueError: {error}")
print(f"default Adafactor's lr: {Adafactor(model.parameters()).param_groups[0]['lr']}")

# %% [markdown]
# To follow the same learning rate and schedule as AdamW we switch the relative
# step off and give it `lr`:

# %%
ADAFACTOR_OPTIONS = dict(
    lr=LEARNING_RATE, scale_parameter=False, relative_step=False, warmup_init=False, weight_decay=WEIGHT_DECAY
)


def replay(optimizer_name, **options):
    """Replay the recorded gradients through a fresh optimizer on a copy of the model; return (updates, optimizer)."""
    return quantization.replay_gradients(
        model, lambda params: memory.make_optimizer(optimizer_name, params, **options), recorded_gradients
    )


adafactor_updates, adafactor = replay("adafactor", **ADAFACTOR_OPTIONS)
torch_adafactor_updates, torch_adafactor = replay("torch_adafactor", lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)

# %% [markdown]
# Both keep, for our weight, the two vectors we computed by hand (torch stores
# them as an $n \times 1$ and a $1 \times m$ matrix):

# %%
def state_of(optimizer, index):
    """The optimizer's state for the parameter at ``index`` (in model.parameters() order)."""
    return optimizer.state[optimizer.param_groups[0]["params"][index]]


transformers_state = state_of(adafactor, weight_index)
torch_state = state_of(torch_adafactor, weight_index)
torch.testing.assert_close(transformers_state["exp_avg_sq_row"], row_average)
torch.testing.assert_close(transformers_state["exp_avg_sq_col"], col_average)
torch.testing.assert_close(torch_state["row_var"].flatten(), row_average, rtol=1e-4, atol=1e-12)
torch.testing.assert_close(torch_state["col_var"].flatten(), col_average, rtol=1e-4, atol=1e-12)
for library, state in (("transformers", transformers_state), ("torch", torch_state)):
    print(f"{library:>12}: " + ", ".join(f"{key} {tuple(value.shape) if torch.is_tensor(value) else type(value).__name__}"
                                         for key, value in state.items()))
print("both agree with the vectors computed from scratch")

# %% [markdown]
# Over the whole model: matrices keep their row and column statistics, and
# **vectors** (biases, LayerNorm weights) keep a full `exp_avg_sq`, one number
# per element, as there is nothing to factor. transformers also keeps `RMS`,
# the weight's root mean square, as a 0-d tensor; torch keeps `step` as one.

# %%
# NBVAL_CHECK_OUTPUT
def print_state(optimizer):
    for name, row in memory.describe_optimizer_state(optimizer).items():
        print(f"  {name:>15}: {row['tensors']:>3} {row['dtype']:>14} tensors, {row['elements']:>9,} elements, "
              f"{row['bytes']:>9,} bytes")
    total = memory.measure_optimizer_state(optimizer)
    print(f"  {'total':>15}: {total:,} bytes = {total / num_parameters:.3f} bytes per parameter")


for label, optimizer in (("transformers' Adafactor", adafactor), ("torch's Adafactor", torch_adafactor),):
    print(label)
    print_state(optimizer)

# %% [markdown]
# `memory.estimate_optimizer_state` predicts these sizes from the parameters'
# shapes alone, so it works on the meta device too. It agrees to the byte:

# %%
# NBVAL_CHECK_OUTPUT
for name, optimizer, options in (
    ("adafactor", adafactor, ADAFACTOR_OPTIONS),
    ("torch_adafactor", torch_adafactor, {}),
):
    measured = memory.measure_optimizer_state(optimizer)
    estimated = memory.estimate_optimizer_state(model, name, **options)
    print(f"{name:>16}: measured {measured:,} bytes, estimated {estimated:,} bytes, equal: {measured == estimated}")

# %% [markdown]
# ### How the two Adafactors differ
#
# Same statistics, different choices around them. Three differences are worth
# knowing, and the first one shows in memory once the weights are in bf16:
#
# - **state dtype**: transformers computes its statistics in fp32 even for
#   bf16 or fp16 weights; torch keeps them in the gradient's dtype;
# - **first moment**: transformers' `beta1` adds back a moving average of the
#   updates (one number per parameter); torch has no `beta1`;
# - **learning rate**: torch's `lr` is always a *relative* step, capped at
#   $1/\sqrt{t}$ and multiplied by the weight's RMS; it has no switch for an
#   absolute step like transformers' `relative_step=False`.

# %%
# NBVAL_CHECK_OUTPUT
bf16_model = copy.deepcopy(model).to(torch.bfloat16)
for label, name, options in (
    ("transformers, bf16 weights", "adafactor", ADAFACTOR_OPTIONS),
    ("torch, bf16 weights", "torch_adafactor", {"lr": LEARNING_RATE}),
    ("transformers, beta1=0.9", "adafactor", {**ADAFACTOR_OPTIONS, "beta1": 0.9}),
):
    source = bf16_model if "bf16" in label else model
    _, optimizer = quantization.replay_gradients(
        source, lambda params: memory.make_optimizer(name, params, **options), recorded_gradients[:1]
    )
    dtypes = sorted({row["dtype"] for row in memory.describe_optimizer_state(optimizer).values()})
    state_bytes = memory.measure_optimizer_state(optimizer)
    print(f"{label:>27}: {state_bytes:>9,} bytes ({state_bytes / num_parameters:.3f} per parameter), "
          f"state dtypes {', '.join(dtypes)}")

# %% [markdown]
# The third difference shows in the update itself. With the same `lr`,
# torch's steps are scaled by each weight's RMS, so they are much shorter than
# AdamW's when the weights are small; transformers' (with `relative_step=False`)
# are about as long:

# %%
adamw_updates, adamw = replay("adamw", lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def update_norm(updates):
    return math.sqrt(sum(u.square().sum().item() for u in updates))


rms = torch.cat([p.detach().flatten() for p in model.parameters()]).square().mean().sqrt()
print(f"RMS of all the weights: {rms:.3f}")
for label, updates in (("transformers' Adafactor", adafactor_updates), ("torch's Adafactor", torch_adafactor_updates)):
    print(f"{label:>24}: moved the weights {update_norm(updates) / update_norm(adamw_updates):.0%} as far as AdamW")

# %% [markdown]
# ### Exercise 1 — Adafactor's state for any shape
#
# Write `adafactor_state_elements(shape)`: how many numbers Adafactor's second
# moment keeps for a parameter of that shape (without `beta1`, and without the
# one `RMS` scalar). A matrix `(n, m)` keeps `n + m`; a vector keeps one number
# per element. A stack of matrices `(..., n, m)` (say, the weights of several
# heads stored as one tensor) keeps `n + m` for each matrix in the stack.

# %%
def adafactor_state_elements(shape):
    # BEGIN SOLUTION
    if len(shape) < 2:
        return math.prod(shape)  # a vector: nothing to factor
    *stack, n, m = shape
    return math.prod(stack) * (n + m)
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# The course's own version, `quantization.factored_state_elements`, summed over
# the model, plus one `RMS` per tensor, is what transformers' Adafactor holds:

# %%
# NBVAL_CHECK_OUTPUT
predicted_elements = sum(quantization.factored_state_elements(p.shape) for p in model.parameters()) + len(parameters)
held_elements = memory.count_optimizer_state_elements(adafactor)
print(f"predicted {predicted_elements:,} elements, held {held_elements:,}: equal {predicted_elements == held_elements}")

# %% [markdown]
# ## 2. 8-bit AdamW: store smaller
#
# ### The idea
#
# 8-bit AdamW keeps AdamW's algorithm and both moving averages, but stores each
# in one byte per element instead of four. To make 256 levels cover values of
# very different sizes, the tensor is cut into **blocks of 256 elements**, and
# each block keeps its own scale, the largest magnitude in the block (its
# *absmax*), as one fp32 number. At every step the optimizer dequantises a
# block, updates it in fp32, and quantises it again. A linear code looks like
#
# $$q = \operatorname{round}\!\Big(127\,\frac{x}{\text{absmax}}\Big) \in \{-127, \dots, 127\}
#   \qquad \hat x = \frac{q}{127}\,\text{absmax}$$
#
# so per parameter: 2 states × (1 byte + 4 bytes / 256) ≈ 2.03 bytes, against
# AdamW's 8. Tensors with fewer than 4,096 elements (biases, LayerNorm weights)
# are not worth the trouble: bitsandbytes keeps their states in fp32.
#
# ### From scratch: quantising AdamW's real state
#
# AdamW replayed the recorded gradients above; here are its two moving averages
# for our weight, quantised block by block with `quantization.quantize_blockwise`:

# %%
# NBVAL_CHECK_OUTPUT
adamw_state = state_of(adamw, weight_index)
exp_avg, exp_avg_sq = adamw_state["exp_avg"], adamw_state["exp_avg_sq"]
quantized_exp_avg = quantization.quantize_blockwise(exp_avg)
print(f"exp_avg {tuple(exp_avg.shape)}: fp32 {exp_avg.numel() * 4:,} bytes -> "
      f"{quantized_exp_avg.codes.numel():,} int8 codes + {quantized_exp_avg.absmax.numel()} fp32 scales "
      f"= {quantized_exp_avg.nbytes:,} bytes")

# %% [markdown]
# Rounding to one of 255 levels moves each value by at most half a level,
# absmax / 254. For the first moment that is a small error:

# %%
restored_exp_avg = quantization.dequantize_blockwise(quantized_exp_avg)
error = (restored_exp_avg - exp_avg).norm() / exp_avg.norm()
print(f"exp_avg: relative error after quantise + dequantise {error:.1%}")

# %% [markdown]
# The second moment is harder. Its values are squares, so they span many
# orders of magnitude, and a linear code rounds every value smaller than
# absmax / 254 to **zero**. Adam then divides by $\sqrt{0} + \epsilon$: the
# step of that weight explodes.

# %%
restored_exp_avg_sq = quantization.dequantize_blockwise(quantization.quantize_blockwise(exp_avg_sq))
lost = (restored_exp_avg_sq == 0) & (exp_avg_sq > 0)
print(f"exp_avg_sq: {lost.float().mean():.1%} of the values rounded to 0 by the linear code")


def adamw_step_in_lr(exp_avg, exp_avg_sq, step=NUM_REPLAY_STEPS, beta1=0.9, beta2=0.999, eps=1e-8):
    """AdamW's step (without weight decay) in units of lr, from its two states: lesson 2's formula."""
    return (exp_avg / (1 - beta1**step)) / ((exp_avg_sq / (1 - beta2**step)).sqrt() + eps)


exact_step = adamw_step_in_lr(exp_avg, exp_avg_sq)
linear_step = adamw_step_in_lr(restored_exp_avg, restored_exp_avg_sq)
print(f"largest step, in units of lr: {exact_step.abs().max():.2f} with the fp32 state, "
      f"{linear_step.abs().max():,.0f} with the linear 8-bit state")

# %% [markdown]
# ### The library: bitsandbytes
#
# bitsandbytes (≥ 0.50 runs its 8-bit optimizers on CPU) avoids that with a
# non-linear **dynamic** code: its 256 levels are spaced roughly like
# floating-point numbers, dense near zero and sparse near absmax, so small
# values keep their relative precision. Replaying the recorded gradients
# through `bitsandbytes.optim.AdamW8bit`:

# %%
adamw8bit_updates, adamw8bit = replay("adamw8bit", lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
print("AdamW8bit")
print_state(adamw8bit)

# %% [markdown]
# `state1` and `state2` are the two moving averages: `uint8` for large tensors,
# `float32` for the small ones; `absmax1`/`absmax2` are the block scales; `qmap1`
# and `qmap2` are the two 256-entry code tables (signed for the first moment,
# unsigned for the second), one copy shared by every tensor. The estimate
# agrees to the byte:

# %%
# NBVAL_CHECK_OUTPUT
measured = memory.measure_optimizer_state(adamw8bit)
estimated = memory.estimate_optimizer_state(model, "adamw8bit")
small = [p for p in model.parameters() if p.numel() < quantization.BITSANDBYTES_MIN_8BIT_SIZE]
print(f"adamw8bit: measured {measured:,} bytes, estimated {estimated:,} bytes, equal: {measured == estimated}")
print(f"{len(small)} of {len(parameters)} tensors ({sum(p.numel() for p in small):,} parameters) "
      f"have fewer than {quantization.BITSANDBYTES_MIN_8BIT_SIZE:,} elements and keep fp32 states")

# %% [markdown]
# How well does the dynamic code keep the second moment? bitsandbytes can
# quantise any tensor with its code (`bitsandbytes.functional.quantize_blockwise`):
# here the same `exp_avg_sq` with both codes. Each dot is one value: its size
# within its block (x) against the relative error of its 8-bit copy (y).

# %%
import bitsandbytes.functional as bnb_functional  # already imported, quietly, by memory.make_optimizer

dynamic_code = bnb_functional.create_dynamic_map(signed=False)  # what AdamW8bit uses for exp_avg_sq (qmap2)
codes, quant_state = bnb_functional.quantize_blockwise(
    exp_avg_sq, code=dynamic_code, blocksize=quantization.BITSANDBYTES_BLOCK_SIZE
)
restored_dynamic = bnb_functional.dequantize_blockwise(codes, quant_state)
figure = plots.plot_quantization_error(
    exp_avg_sq,
    {"linear code (from scratch)": restored_exp_avg_sq, "bitsandbytes' dynamic code": restored_dynamic},
    title="Quantising AdamW's exp_avg_sq to 8 bits, blocks of 256",
)

# %% [markdown]
# ### Exercise 2 — 8-bit AdamW's bytes for one tensor
#
# Write `adamw8bit_state_bytes(num_elements)`: the bytes AdamW8bit keeps for
# one parameter tensor of `num_elements` elements, both states included, the
# shared code tables not. Remember the block scales, the last (partial) block,
# and the fp32 fallback below 4,096 elements.

# %%
def adamw8bit_state_bytes(num_elements):
    # BEGIN SOLUTION
    if num_elements < 4096:
        return 2 * 4 * num_elements  # two fp32 states
    num_blocks = math.ceil(num_elements / 256)
    return 2 * (num_elements + 4 * num_blocks)  # two uint8 states, each with an fp32 absmax per block
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# The course's version, `quantization.eight_bit_state_bytes` (one state), summed
# over the model, plus the two shared tables of 256 fp32 entries, is what
# AdamW8bit holds:

# %%
# NBVAL_CHECK_OUTPUT
tables = 2 * 256 * 4
predicted = sum(2 * quantization.eight_bit_state_bytes(p.numel()) for p in model.parameters()) + tables
print(f"predicted {predicted:,} bytes, held {memory.measure_optimizer_state(adamw8bit):,}: "
      f"equal {predicted == memory.measure_optimizer_state(adamw8bit)}")

# %% [markdown]
# ## 3. The trade-off, measured
#
# Every optimizer above saw the same 10 gradients, from the same weights. AdamW
# in fp32 is the reference; for each other optimizer we measure its state in
# bytes per parameter and how far its total update lands from AdamW's:
#
# $$\text{distance} = \frac{\lVert \Delta\theta_{\text{optimizer}} - \Delta\theta_{\text{AdamW}} \rVert}{\lVert \Delta\theta_{\text{AdamW}} \rVert}$$
#
# 8-bit AdamW runs AdamW's algorithm, so its distance is rounding error.
# Adafactor changes the algorithm too (no first moment, a growing $\beta_2$,
# updates clipped to an RMS of 1), so part of its distance is by design; with
# `beta1` it gets a first moment back, and pays 4 bytes per parameter for it.
# torch's Adafactor is left out: with its relative step, the same `lr` means
# something else.

# %%
adafactor_beta1_updates, adafactor_beta1 = replay("adafactor", **ADAFACTOR_OPTIONS, beta1=0.9)
tradeoff = {}
for label, updates, optimizer in (
    ("AdamW", adamw_updates, adamw),
    ("8-bit AdamW", adamw8bit_updates, adamw8bit),
    ("Adafactor", adafactor_updates, adafactor),
    ("Adafactor, beta1=0.9", adafactor_beta1_updates, adafactor_beta1),
):
    bytes_per_parameter = memory.measure_optimizer_state(optimizer) / num_parameters
    tradeoff[label] = (bytes_per_parameter, quantization.relative_distance(updates, adamw_updates))
figure = plots.plot_optimizer_tradeoff(tradeoff, num_steps=NUM_REPLAY_STEPS)

# %%
# NBVAL_CHECK_OUTPUT
for label, (bytes_per_parameter, distance) in tradeoff.items():
    print(f"{label:>21}: {bytes_per_parameter:.3f} bytes of state per parameter")

# %% [markdown]
# ## 4. Training with the three optimizers
#
# The real test is training. The course model is fine-tuned three times from the
# checkpoint, with the same data, seed, batch order and schedule (linear, 10 %
# warm-up), the same peak learning rate and weight decay; only the optimizer
# changes. `loops.train_accelerate` is the Accelerate loop of lesson 1.

# %%
OPTIMIZERS = {
    "AdamW": ("adamw", dict(lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)),
    "Adafactor": ("adafactor", ADAFACTOR_OPTIONS),
    "8-bit AdamW": ("adamw8bit", dict(lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)),
}


def train_with(optimizer_name, options):
    """Fine-tune a fresh copy of the checkpoint; return (per-step losses, validation metrics, state bytes)."""
    set_seed(0)
    model = models.load_pretrained_classifier()
    train_dataloader, validation_dataloader = data.make_dataloaders(
        batch_size=BATCH_SIZE, seed=0, limit=TRAIN_EXAMPLES
    )
    optimizer = memory.make_optimizer(optimizer_name, model.parameters(), **options)
    num_training_steps = NUM_EPOCHS * len(train_dataloader)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=int(0.1 * num_training_steps), num_training_steps=num_training_steps
    )
    losses = loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs=NUM_EPOCHS)
    return losses, loops.evaluate(model, validation_dataloader), memory.measure_optimizer_state(optimizer)


runs = {label: train_with(name, options) for label, (name, options) in OPTIMIZERS.items()}

# %%
figure = plots.plot_loss_curves(
    {label: losses for label, (losses, _, _) in runs.items()},
    title="Fine-tuning the course DistilBERT: same data, seed and schedule",
    smooth=5,
)

# %%
for label, (losses, metrics, state_bytes) in runs.items():
    print(f"{label:>12}: state {state_bytes:>9,} bytes ({state_bytes / num_parameters:.2f} per parameter), "
          f"final loss {sum(losses[-5:]) / 5:.3f}, validation accuracy {metrics['accuracy']:.3f}, F1 {metrics['f1']:.3f}")

# %% [markdown]
# On this small problem the three land close together; the memory they need
# does not. The next section shows how that gap grows with the model.
#
# ## 5. Optimizer state against model size
#
# The state is a fixed number of bytes per parameter, so it grows linearly with
# the model. We count real architectures on the meta device (shapes only, no
# weights, no download), from the tiny checkpoint to a 7B-shaped Llama, and
# estimate each optimizer's state with `memory.estimate_optimizer_state`, which
# the sections above showed exact to the byte.

# %%
def meta_model(model_class, config):
    with init_empty_weights():
        return model_class(config)


architectures = {
    "tiny checkpoint": model,
    "distilbert-base-cased": models.build_distilbert_base_cased(on_meta_device=True),
    **models.well_known_architectures(),  # BERT-base, GPT-2 (small), Llama 7B-shaped
    "GPT-2 medium": meta_model(GPT2Model, GPT2Config(n_embd=1024, n_layer=24, n_head=16)),
    "GPT-2 large": meta_model(GPT2Model, GPT2Config(n_embd=1280, n_layer=36, n_head=20)),
    "GPT-2 xl": meta_model(GPT2Model, GPT2Config(n_embd=1600, n_layer=48, n_head=25)),
    # Shaped like Llama 3.2 1B: grouped-query attention and tied embeddings.
    "Llama 1B-shaped": meta_model(LlamaModel, LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True)),
}
parameter_counts = {name: models.count_parameters(m) for name, m in architectures.items()}
STATE_OPTIMIZERS = {
    "AdamW": ("adamw", {}),
    "Adafactor, beta1=0.9": ("adafactor", {"beta1": 0.9}),
    "8-bit AdamW": ("adamw8bit", {}),
    "Adafactor": ("adafactor", {}),
}
state_bytes = {
    label: {name: memory.estimate_optimizer_state(m, optimizer, **options) for name, m in architectures.items()}
    for label, (optimizer, options) in STATE_OPTIMIZERS.items()
}
figure = plots.plot_optimizer_memory_by_model(parameter_counts, state_bytes, title="Optimizer state against model size (fp32 weights)")

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'model':>22} {'parameters':>14} " + " ".join(f"{label:>21}" for label in state_bytes))
for name in sorted(parameter_counts, key=parameter_counts.get):
    print(f"{name:>22} {parameter_counts[name]:>14,} "
          + " ".join(f"{plots.format_bytes(state_bytes[label][name]):>21}" for label in state_bytes))

# %% [markdown]
# Three lines, three slopes on a log-log plot that are in fact the same slope
# (linear growth) at different heights: 8 bytes per parameter for AdamW, about
# 2 for 8-bit AdamW, and for Adafactor a tiny fraction, since almost every
# parameter of a transformer lives in a matrix. For the 7B-shaped Llama that is
# the difference between a state that needs its own GPU and one that fits in a
# corner of it.
