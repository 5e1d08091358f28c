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
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")`; the data line is
# `load_dataset("glue", "mrpc")`, as lesson 1 shows.

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

# The training set-up: lesson 2's batch size, schedule and weight decay, on the whole
# training split, with a learning rate high enough for the tiny model to learn in two epochs.
NUM_EPOCHS = 2
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01

# %% [markdown]
# ## The model, and one set of gradients for every optimizer
#
# The lesson's model is the course's tiny DistilBERT (it stands in for
# `distilbert-base-cased`). Adafactor treats matrices and vectors differently,
# and 8-bit AdamW treats small tensors differently, so we count both kinds:

# %% tags=["nbval-check-output"]
model = models.load_pretrained_classifier()
parameters = dict(model.named_parameters())
num_parameters = models.count_parameters(model)
matrices = {name: p for name, p in parameters.items() if p.dim() >= 2}
print(f"{num_parameters:,} parameters in {len(parameters)} tensors: "
      f"{len(matrices)} matrices ({sum(p.numel() for p in matrices.values()):,} parameters), "
      f"{len(parameters) - len(matrices)} vectors ({num_parameters - sum(p.numel() for p in matrices.values()):,} parameters)")

# %% [markdown]
# To compare optimizers fairly, each must see *exactly* the same gradients. We
# record them once: the gradients of the loss on the first few training batches,
# all taken at the checkpoint's weights (`quantization.record_gradients`). Later
# cells replay this list through each optimizer.

# %%
NUM_REPLAY_STEPS = 10
set_seed(0)
train_dataloader, validation_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
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
# step, $\beta_{2,t} = 1 - t^{-0.8}$: 0 at the first step, so the first average is
# the first squared gradient, then closer and closer to 1.
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
# Two Adafactors are in common use: `transformers.optimization.Adafactor` (a
# port of fairseq's implementation of the 2018 paper by Shazeer and Stern) and
# `torch.optim.Adafactor` (added in torch 2.5). `memory.make_optimizer` builds either by name. We replay the
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
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

# %% tags=["nbval-check-output"]
tables = 2 * 256 * 4
predicted = sum(2 * quantization.eight_bit_state_bytes(p.numel()) for p in model.parameters()) + tables
print(f"predicted {predicted:,} bytes, held {memory.measure_optimizer_state(adamw8bit):,}: "
      f"equal {predicted == memory.measure_optimizer_state(adamw8bit)}")

# %% [markdown]
# ## 3. The trade-off, measured
#
# Every optimizer above saw the same recorded gradients, from the same weights. AdamW
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
REPLAYED = {  # label: (updates, optimizer, name and options for the estimate)
    "AdamW": (adamw_updates, adamw, ("adamw", {})),
    "8-bit AdamW": (adamw8bit_updates, adamw8bit, ("adamw8bit", {})),
    "Adafactor": (adafactor_updates, adafactor, ("adafactor", {})),
    "Adafactor, beta1=0.9": (adafactor_beta1_updates, adafactor_beta1, ("adafactor", {"beta1": 0.9})),
}
tradeoff = {}
for label, (updates, optimizer, _) in REPLAYED.items():
    bytes_per_parameter = memory.measure_optimizer_state(optimizer) / num_parameters
    tradeoff[label] = (bytes_per_parameter, quantization.relative_distance(updates, adamw_updates))
figure = plots.plot_optimizer_tradeoff(tradeoff, num_steps=NUM_REPLAY_STEPS)

# %% [markdown]
# The x axis is measured; the estimate from the shapes alone agrees, to the byte,
# for all four:

# %% tags=["nbval-check-output"]
for label, (_, optimizer, (name, options)) in REPLAYED.items():
    measured = memory.measure_optimizer_state(optimizer)
    estimated = memory.estimate_optimizer_state(model, name, **options)
    print(f"{label:>21}: measured {measured:>9,} bytes, estimated {estimated:>9,} bytes, equal: {measured == estimated}, "
          f"{measured / num_parameters:.3f} bytes per parameter")

# %% [markdown]
# 8-bit AdamW lands close to AdamW for a quarter of the memory. Adafactor is far
# from it for almost no memory. And `beta1` does not bring Adafactor closer over
# these first steps: transformers' first moment averages the *updates* and has
# no bias correction, so it still remembers its start at zero, and its steps
# are short. Compare how far each moved the weights:

# %%
for label, updates in (("Adafactor", adafactor_updates), ("Adafactor, beta1=0.9", adafactor_beta1_updates)):
    print(f"{label:>21}: moved the weights {update_norm(updates) / update_norm(adamw_updates):.0%} as far as AdamW")

# %% [markdown]
# ## 4. Training with the three optimizers
#
# The real test is training. The course model is fine-tuned three times from the
# checkpoint, with the same data, seed, batch order and schedule (linear, 10 %
# warm-up), the same peak learning rate and weight decay; only the optimizer
# changes. `loops.train_accelerate` is the Accelerate loop of lesson 1. Each
# run takes a few seconds.

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
    train_dataloader, validation_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
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
    smooth=10,
)

# %%
for label, (losses, metrics, state_bytes) in runs.items():
    print(f"{label:>12}: state {state_bytes:>9,} bytes ({state_bytes / num_parameters:.2f} per parameter), "
          f"final loss {sum(losses[-5:]) / 5:.3f}, validation accuracy {metrics['accuracy']:.3f}, F1 {metrics['f1']:.3f}")

# %% [markdown]
# 8-bit AdamW starts out on AdamW's path, since its update is AdamW's up to
# rounding; over many steps small differences grow, as between any two runs that
# differ slightly, and the curves part. Adafactor, without a first moment and
# with its own normalisation, takes a path of its own. Which trains best on a
# given task is an empirical question, worth a run like this one; the memory
# each needs is not, and the next section shows how that gap grows with the model.
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

# %% tags=["nbval-check-output"]
print(f"{'model':>22} {'parameters':>14} " + " ".join(f"{label:>21}" for label in state_bytes))
for name in sorted(parameter_counts, key=parameter_counts.get):
    print(f"{name:>22} {parameter_counts[name]:>14,} "
          + " ".join(f"{plots.format_bytes(state_bytes[label][name]):>21}" for label in state_bytes))

# %% [markdown]
# On log-log axes a fixed number of bytes per parameter is a straight line of
# slope 1; the optimizers differ only in height: 8 bytes per parameter for
# AdamW, about 4 for Adafactor with `beta1`, about 2 for 8-bit AdamW. Plain
# Adafactor sits far below and is not even straight: it grows with the *width*
# of the matrices (rows + columns), not with their area. For the 7B-shaped
# Llama that is the difference between a state that needs a GPU of its own and
# one that fits in a corner of it. (torch's Adafactor would draw the same line
# as transformers' without `beta1`: in fp32 they hold the same bytes, as
# section 1 showed.)
#
# ## 6. The memory of a whole training step
#
# The optimizer state is only one of four things a training step holds:
#
# - the **weights** (4 bytes per parameter in fp32);
# - the **gradients**, one per weight (4 bytes);
# - the **optimizer state** (8 bytes for AdamW);
# - the **activations**: what the forward pass saves for the backward pass. They
#   grow with the batch size and the sequence length (attention's scores with its
#   square), not with the parameter count.
#
# The widely used rule of thumb adds the first three for fp32 Adam,
# 4 + 4 + 8 = **16 bytes per parameter**; it is what `accelerate estimate-memory`
# reports as "Training using Adam". It leaves out the activations, and the
# temporaries each phase creates. `memory.rule_of_thumb_training_memory` computes
# it; `memory.estimate_training_memory` adds the activations and follows the
# step phase by phase (forward, backward, optimizer step) to find its peak;
# `memory.measure_training_step_peak` measures a real step with PyTorch's
# `MemTracker`, which sees every tensor PyTorch allocates.
#
# First the step we ran in section 4: the course model, AdamW, one batch of 32
# pairs (padding included, so no attention mask is needed).

# %%
lesson_batch = next(iter(train_dataloader))
lesson_batch = {"input_ids": lesson_batch["input_ids"], "labels": lesson_batch["labels"]}
batch_size, seq_len = lesson_batch["input_ids"].shape
step_model = copy.deepcopy(model)  # the measurement trains it for two steps
lesson_measured = memory.measure_training_step_peak(
    step_model, memory.make_optimizer("adamw", step_model.parameters(), lr=LEARNING_RATE), lesson_batch
)
lesson_estimated = memory.estimate_training_memory(model, "adamw", batch_size=batch_size, seq_len=seq_len)
lesson_rule = memory.rule_of_thumb_training_memory(model)


def print_step(label, step):
    print(f"{label:>10}: weights {step.weights / MIB:6.2f} MiB, gradients {step.gradients / MIB:6.2f} MiB, "
          f"optimizer state {step.optimizer_state / MIB:6.2f} MiB, activations {step.activations / MIB:6.2f} MiB, "
          f"peak {step.peak / MIB:6.2f} MiB (during the {step.phase_of_peak})")


print(f"batch of {batch_size} x {seq_len} tokens")
print(f"16 bytes per parameter: {lesson_rule / MIB:.2f} MiB")
print_step("estimated", lesson_estimated)
print_step("measured", lesson_measured)

# %% [markdown]
# For a small model the rule of thumb is not even close: the activations of one
# batch weigh many times the model. Now distilbert-base-cased, the slides'
# model, with real (randomly initialised) weights: a batch of 8 sequences of
# 64 random tokens. This measurement takes the longest of the lesson, a few seconds.

# %%
set_seed(0)
distilbert = models.build_distilbert_base_cased(on_meta_device=False)
generator = torch.Generator().manual_seed(0)
distilbert_batch = {
    "input_ids": torch.randint(0, distilbert.config.vocab_size, (8, 64), generator=generator),
    "labels": torch.randint(0, 2, (8,), generator=generator),
}
distilbert_measured = memory.measure_training_step_peak(
    distilbert, memory.make_optimizer("adamw", distilbert.parameters(), lr=2e-5), distilbert_batch
)
distilbert_meta = architectures["distilbert-base-cased"]
distilbert_estimated = memory.estimate_training_memory(distilbert_meta, "adamw", batch_size=8, seq_len=64)
distilbert_rule = memory.rule_of_thumb_training_memory(distilbert_meta)
print(f"16 bytes per parameter: {distilbert_rule / MIB:,.1f} MiB")
print_step("estimated", distilbert_estimated)
print_step("measured", distilbert_measured)
del distilbert, distilbert_batch

# %% [markdown]
# Side by side, as stacked bars. The rule's bar has no activations; the black
# line is the peak, which is *not* the sum of the parts: the backward pass
# frees each block's activations as it creates that block's gradients, and the
# optimizer step needs temporaries of its own.

# %%
def rule_of_thumb_parts(rule_bytes):
    """The rule's 16 bytes per parameter, split as it counts them: 4 + 4 + 8, no activations."""
    return {"weights": rule_bytes // 4, "gradients": rule_bytes // 4, "optimizer_state": rule_bytes // 2, "activations": 0}


figure = plots.plot_training_memory_breakdown(
    {
        "rule of thumb\n(16 B/param)": rule_of_thumb_parts(distilbert_rule),
        "estimated": distilbert_estimated,
        "measured": distilbert_measured,
    },
    title="distilbert-base-cased, fp32, AdamW: one training step on 8 x 64 tokens",
)

# %% [markdown]
# At this small batch the peak is in the optimizer step, above the rule by the
# step's temporaries. The estimate, checked against the measurement, can go
# where measuring would take minutes: larger batches and longer sequences.
# There the activations take over, and the peak moves into the forward or
# backward pass:

# %% tags=["nbval-check-output"]
print(f"{'batch x tokens':>15} {'activations':>12} {'peak':>10}  phase of the peak   peak / rule of thumb")
for batch_size, seq_len in [(8, 64), (16, 128), (32, 256), (8, 512)]:
    step = memory.estimate_training_memory(distilbert_meta, "adamw", batch_size=batch_size, seq_len=seq_len)
    print(f"{batch_size:>6} x {seq_len:<6}  {plots.format_bytes(step.activations):>12} {plots.format_bytes(step.peak):>10}"
          f"  {step.phase_of_peak:<18} {step.peak / distilbert_rule:.1f}x")

# %% [markdown]
# ### Explore: model, optimizer, precision, batch, length
#
# `step_memory` assembles the four parts for any model of section 5 and any
# optimizer. Weights, gradients and optimizer state are exact for every model,
# optimizer and precision. The activations come from `estimate_training_memory`,
# which models fp32 DistilBERT, BERT and GPT-2: for the Llama-shaped models and
# for bf16 the figure says "not estimated" rather than invent a number. The
# activations do not depend on the optimizer; the peak (black line) is
# estimated for AdamW only, whose step's temporaries the course models.

# %%
def step_memory(model_name, optimizer_label, precision, batch_size, seq_len):
    """Return the bytes of each part of one training step; None for a part the course cannot estimate."""
    model = architectures[model_name]
    if precision == "bf16":
        model = copy.deepcopy(model).to(torch.bfloat16)  # on the meta device: no memory allocated
    optimizer, options = STATE_OPTIMIZERS[optimizer_label]
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    parts = {
        "weights": parameter_bytes + sum(b.numel() * b.element_size() for b in model.buffers()),
        "gradients": parameter_bytes,
        "optimizer_state": memory.estimate_optimizer_state(model, optimizer, **options),
        "activations": None,
        "peak": None,
    }
    try:
        adamw_step = memory.estimate_training_memory(model, "adamw", batch_size=batch_size, seq_len=seq_len)
    except ValueError:  # a model, precision or length the estimate does not model
        return parts
    parts["activations"] = adamw_step.activations
    if optimizer_label == "AdamW":
        parts["peak"] = adamw_step.peak
    return parts


explorer_models = [name for name in sorted(parameter_counts, key=parameter_counts.get) if name != "tiny checkpoint"]
plots.training_memory_explorer(
    explorer_models, step_memory, list(STATE_OPTIMIZERS), ["fp32", "bf16"],
    seq_lens=(64, 128, 256, 512), reference=("AdamW", "fp32"),
    initial={"model": "GPT-2 large", "optimizer": "8-bit AdamW", "batch_size": 4, "seq_len": 256},
)

# %% [markdown]
# The widgets need a running kernel. In a static copy of this notebook, here
# is the same figure for GPT-2 large on 4 x 256 tokens, for every optimizer:

# %%
figure = plots.plot_training_memory_breakdown(
    {label: step_memory("GPT-2 large", label, "fp32", 4, 256) for label in STATE_OPTIMIZERS},
    title="GPT-2 large, fp32: one training step on 4 x 256 tokens (estimated)",
    xlabel="optimizer",
)

# %% [markdown]
# ### Exercise 3 — Will it fit?
#
# You want to fine-tune GPT-2 large in fp32 on batches of 4 sequences of 256
# tokens, and you have a fixed memory budget. Here is the estimate with AdamW:

# %% tags=["nbval-check-output"]
gpt2_large = architectures["GPT-2 large"]
adamw_step = memory.estimate_training_memory(
    gpt2_large, "adamw", batch_size=ex.Q3_BATCH_SIZE, seq_len=ex.Q3_SEQ_LEN
)
adamw_state = memory.estimate_optimizer_state(gpt2_large, "adamw")
adamw8bit_state = memory.estimate_optimizer_state(gpt2_large, "adamw8bit")
print(f"budget: {ex.Q3_BUDGET_GIB} GiB; batches of {ex.Q3_BATCH_SIZE} x {ex.Q3_SEQ_LEN} tokens")
print(f"AdamW: peak {adamw_step.peak / GIB:.2f} GiB, during the {adamw_step.phase_of_peak}")
print(f"optimizer state: AdamW {adamw_state / GIB:.2f} GiB, 8-bit AdamW {adamw8bit_state / GIB:.2f} GiB")

# %% [markdown]
# Compute `peak_8bit_gib`, the peak of the same step with 8-bit AdamW, in GiB.
# The weights, gradients and activations do not change with the optimizer; the
# optimizer state is held during the whole step, forward pass included. (The
# 8-bit optimizer's own step is small next to this peak: leave it out.)

# %%
# BEGIN SOLUTION
peak_8bit_gib = (adamw_step.peak - adamw_state + adamw8bit_state) / 1024**3
# END SOLUTION
# BEGIN STARTER
# peak_8bit_gib = ____
# END STARTER
ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]
# Does each fit the budget? And what would the rule of thumb have said?

# %% tags=["nbval-check-output"]
rule = memory.rule_of_thumb_training_memory(gpt2_large)
with_8bit = adamw_step.peak - adamw_state + adamw8bit_state
for label, need in (("rule of thumb, AdamW", rule), ("estimate, AdamW", adamw_step.peak), ("estimate, 8-bit AdamW", with_8bit)):
    print(f"{label:>22}: {need / GIB:5.2f} GiB -> {'fits' if need <= ex.Q3_BUDGET_GIB * GIB else 'does not fit'} in {ex.Q3_BUDGET_GIB} GiB")

# %% [markdown]
# ## Summary
#
# - **Adafactor** keeps, for each weight matrix, the moving averages of the row
#   and column means of the squared gradients, $n + m$ numbers instead of
#   $n \times m$, and rebuilds a rank-1 second moment from them. Vectors keep a
#   full second moment. `beta1` adds a first moment back (4 bytes per
#   parameter). transformers' version keeps fp32 statistics and can take an
#   absolute `lr` (`relative_step=False, scale_parameter=False`); torch's keeps
#   the gradient's dtype and always steps relative to the weights' RMS.
# - **8-bit AdamW** keeps AdamW's algorithm and quantises both moving averages
#   to one byte, with an fp32 scale per block of 256: about 2.03 bytes per
#   parameter. Tensors under 4,096 elements stay fp32. A non-linear code keeps
#   the small values of the second moment that a linear code would round to zero.
# - **The trade-off**: the less an optimizer keeps, the further its update from
#   AdamW's. On the course task all three train about equally well.
# - **A training step** holds weights, gradients, optimizer state and
#   activations; the 16-bytes-per-parameter rule forgets the activations, which
#   grow with batch size and sequence length and soon dominate. Estimate the
#   peak before you run, and measure when you can.
#
# Lesson 4 spreads training over several processes with Accelerate.
