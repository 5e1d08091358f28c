# %% [markdown]
# # Lesson 3 — Memory-efficient optimizers: Adafactor and 8-bit Adam
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
# 4. train the course model with all three optimizers, same data, seed and schedule,
#    and see how the Trainer and bitsandbytes are set up to use them;
# 5. see optimizer state grow with model size, from the tiny checkpoint to 7B-shaped models;
# 6. practise with two exercises.
#
# How much memory a *whole* training step needs (weights, gradients, state and
# activations, and when the peak comes) is lesson 4. Everything here runs on a
# laptop CPU in about a minute, without internet.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")`; the data line is
# `load_dataset("glue", "mrpc")`, as lesson 1 shows; and the learning rate changes
# with them: the tiny model trains at 1e-3 to 3e-3, `distilbert-base-cased` wants
# about 2e-5 to 5e-5 (the slides use 2e-5), and 1e-3 would wreck it.

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import copy
import math
import tempfile

import torch
from accelerate import Accelerator, init_empty_weights
from accelerate.utils import set_seed
from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel, get_linear_schedule_with_warmup

from course_utils import data, fidelity, loops, memory, models, optimizers, plots, quantization
from course_utils.exercises import ____
from course_utils.exercises import lesson3 as ex
from course_utils.units import format_bytes

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
# all taken at the checkpoint's weights (`fidelity.record_gradients`). Later
# cells replay this list through each optimizer.

# %%
NUM_REPLAY_STEPS = 10
set_seed(0)
train_dataloader, validation_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
recorded_gradients = fidelity.record_gradients(model, train_dataloader, max_batches=NUM_REPLAY_STEPS)
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
# `torch.optim.Adafactor` (added in torch 2.5). `optimizers.make_optimizer` builds either by name. We replay the
# recorded gradients through both and compare their statistics for our weight
# with the two vectors computed above.
#
# One setting first. By default transformers' Adafactor chooses its own step
# size (`relative_step=True`: $\min(10^{-2}, 1/\sqrt{t})$, times the weight's
# RMS, floored at $\epsilon_2 = 10^{-3}$, with `scale_parameter=True`; the whole
# update is written out below). It then ignores any learning rate and schedule:
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
    return fidelity.replay_gradients(model, recorded_gradients, optimizer_name, **options)


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
    _, optimizer = fidelity.replay_gradients(source, recorded_gradients[:1], name, **options)
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
# ### Adafactor's whole update, in one place
#
# The pieces above, and two more, make one step of transformers' Adafactor with
# its default settings (`relative_step=True`, `scale_parameter=True`, no `beta1`,
# no weight decay), for a weight matrix $\theta$ with gradient $G$ at step $t$:
#
# 1. the factored second moment: $R_t$ and $C_t$ as above, from $G^2 + \epsilon_1$
#    ($\epsilon_1 = 10^{-30}$), and $\hat V = R_t C_t / \operatorname{mean}(R_t)$;
# 2. the update $U = G / \sqrt{\hat V}$;
# 3. clipping: $U \leftarrow U / \max\big(1, \operatorname{RMS}(U) / d\big)$ with $d = 1$,
#    so no step is larger than $d$ in RMS;
# 4. the relative step: $\alpha_t = \max\big(\epsilon_2, \operatorname{RMS}(\theta_{t-1})\big)
#    \cdot \min\big(10^{-2}, 1/\sqrt{t}\big)$, with the floor $\epsilon_2 = 10^{-3}$;
# 5. $\theta_t = \theta_{t-1} - \alpha_t\, U$.
#
# Written out, and replayed over the recorded gradients next to the library:

# %%
def rms(tensor):
    return tensor.square().mean().sqrt()


def adafactor_step(weight, gradient, row_average, col_average, step, eps1=1e-30, eps2=1e-3, clip_threshold=1.0):
    """One default step of transformers' Adafactor for one matrix; return (new weight, new row and column averages)."""
    beta2 = 1 - step**-0.8
    squared = gradient**2 + eps1
    row_average = beta2 * row_average + (1 - beta2) * squared.mean(dim=-1)
    col_average = beta2 * col_average + (1 - beta2) * squared.mean(dim=-2)
    update = gradient / quantization.reconstruct_second_moment(row_average, col_average).sqrt()
    update = update / max(1.0, rms(update).item() / clip_threshold)
    step_size = max(eps2, rms(weight).item()) * min(1e-2, 1 / math.sqrt(step))
    return weight - step_size * update, row_average, col_average


def replay_adafactor_by_hand(start, eps2=1e-3):
    weight, rows_avg, cols_avg = start.clone(), torch.zeros(start.shape[0]), torch.zeros(start.shape[1])
    for step, gradients in enumerate(recorded_gradients, start=1):
        weight, rows_avg, cols_avg = adafactor_step(weight, gradients[weight_index], rows_avg, cols_avg, step, eps2=eps2)
    return weight


def replay_library_adafactor(start):
    weight = torch.nn.Parameter(start.clone())
    library_adafactor = Adafactor([weight])  # the defaults: relative step, scaled by the weight's RMS
    for gradients in recorded_gradients:
        weight.grad = gradients[weight_index].clone()
        library_adafactor.step()
    return weight.detach()


start = parameters[weight_name].detach()
by_hand, by_library = replay_adafactor_by_hand(start), replay_library_adafactor(start)
print(f"{weight_name}, {len(recorded_gradients)} default Adafactor steps: the weight moved by "
      f"{(by_library - start).norm():.4f}; by hand and library differ by {(by_hand - by_library).norm():.1e}")
torch.testing.assert_close(by_hand, by_library)

# %% [markdown]
# The floor $\epsilon_2$ is what lets a weight that starts at zero move: its
# RMS is 0, so without the floor its step size would be 0, for ever. The same
# ten gradients, applied to a zero matrix:

# %% tags=["nbval-check-output"]
zeros = torch.zeros_like(start)
for label, moved in (
    ("the library", replay_library_adafactor(zeros)),
    ("by hand, eps2 = 1e-3", replay_adafactor_by_hand(zeros)),
    ("by hand, eps2 = 0", replay_adafactor_by_hand(zeros, eps2=0.0)),
):
    print(f"{label:>21}: RMS of the weight after {len(recorded_gradients)} steps {rms(moved):.2e}")

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
weight_adamw_state = state_of(adamw, weight_index)
exp_avg, exp_avg_sq = weight_adamw_state["exp_avg"], weight_adamw_state["exp_avg_sq"]
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
import bitsandbytes.functional as bnb_functional  # already imported, quietly, by optimizers.make_optimizer

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
# ### 8-bit optimizers in practice
#
# Three habits from bitsandbytes' documentation and the 8-bit optimizers paper
# (Dettmers et al., 2022):
#
# - **Embeddings keep 32-bit state.** The paper found training more stable when
#   the word embeddings' optimizer state stays in 32 bits: build the model with
#   `bitsandbytes.nn.StableEmbedding` (an embedding with a LayerNorm and 32-bit
#   state), or keep the model and tell the optimizer, before building it, with
#   `GlobalOptimManager.override_config(weight, "optim_bits", 32)`. The second way,
#   on the course model:

# %% tags=["nbval-check-output"]
import bitsandbytes  # already imported, quietly, by optimizers.make_optimizer

embedding_weight_name = next(name for name in parameters if "word_embeddings" in name)


def adamw8bit_with_32bit_embeddings():
    """A copy of the model, one step of AdamW8bit with its word embeddings' state kept in 32 bits; return the optimizer."""
    replica = copy.deepcopy(model)
    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    manager.initialize()  # the manager is global: forget any earlier model's overrides
    manager.register_parameters(replica.parameters())
    manager.override_config(dict(replica.named_parameters())[embedding_weight_name], "optim_bits", 32)
    optimizer = bitsandbytes.optim.AdamW8bit(replica.parameters(), lr=LEARNING_RATE)
    for parameter, gradient in zip(replica.parameters(), recorded_gradients[0]):
        parameter.grad = gradient.clone()
    optimizer.step()
    manager.initialize()  # later 8-bit optimizers must not inherit the override
    return optimizer, dict(replica.named_parameters())[embedding_weight_name]


overridden, embedding_weight = adamw8bit_with_32bit_embeddings()
print(f"{embedding_weight_name} {tuple(embedding_weight.shape)}: state "
      + ", ".join(f"{key} {value.dtype}" for key, value in overridden.state[embedding_weight].items() if key.startswith("state")))
print(f"state of the whole model: {memory.measure_optimizer_state(adamw8bit):,} bytes all 8-bit, "
      f"{memory.measure_optimizer_state(overridden):,} bytes with 32-bit embeddings")

# %% [markdown]
# - **Paged optimizers absorb spikes.** `PagedAdamW8bit` (and `paged_adamw_8bit`
#   in the Trainer, below) puts its state in CUDA unified memory, which the
#   driver moves to CPU RAM when the GPU runs short, for example when one long
#   batch needs more activations than the rest, instead of stopping with an
#   out-of-memory error. On a CPU there is nothing to page to.
# - **What 8-bit state saves in a whole fp32 step.** Weights and gradients are
#   untouched; only the state shrinks. For distilbert-base-cased (counted on the
#   meta device, no weights):

# %% tags=["nbval-check-output"]
distilbert_shapes = models.build_distilbert_base_cased(on_meta_device=True)
distilbert_parameters = models.count_parameters(distilbert_shapes)
weights_and_gradients_per_parameter = 4 + 4  # fp32 weights and fp32 gradients
per_parameter, state_per_parameter = {}, {}
for label, name in (("AdamW", "adamw"), ("8-bit AdamW", "adamw8bit")):
    state_per_parameter[label] = memory.estimate_optimizer_state(distilbert_shapes, name) / distilbert_parameters
    per_parameter[label] = weights_and_gradients_per_parameter + state_per_parameter[label]
    print(f"{label:>12}: 4 (weights) + 4 (gradients) + {state_per_parameter[label]:.2f} (state) = "
          f"{per_parameter[label]:.2f} bytes per parameter")
print(f"8-bit state takes fp32 training from {per_parameter['AdamW']:.0f} to {per_parameter['8-bit AdamW']:.1f} bytes "
      f"per parameter, not to {per_parameter['AdamW'] / 4:.0f}: only the state shrinks, "
      f"{state_per_parameter['AdamW'] / state_per_parameter['8-bit AdamW']:.1f}x (from "
      f"{state_per_parameter['AdamW']:.2f} to {state_per_parameter['8-bit AdamW']:.2f} bytes); the weights and "
      f"gradients keep their {weights_and_gradients_per_parameter} bytes. The activations come on top of all three "
      "(lesson 4 counts them).")

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
    tradeoff[label] = (bytes_per_parameter, fidelity.relative_distance(updates, adamw_updates))
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
    optimizer = optimizers.make_optimizer(optimizer_name, model.parameters(), **options)
    num_training_steps = NUM_EPOCHS * len(train_dataloader)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=int(0.1 * num_training_steps), num_training_steps=num_training_steps
    )
    losses = loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, NUM_EPOCHS, Accelerator())
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
# with its own normalisation, takes a path of its own. These are single runs
# with one seed: on this task, other batch orders alone move the validation
# accuracy by several points (lesson 1), so differences of this size are seed
# noise, not a ranking. Which trains best on a given task is an empirical
# question, worth several seeds; the memory each needs is not, and the next
# section shows how that gap grows with the model.
#
# ### The same optimizers in the Trainer
#
# With the `Trainer`, the optimizer is one string in `TrainingArguments`:
# `optim="adafactor"`, `"adamw_bnb_8bit"` or `"paged_adamw_8bit"`. The Trainer
# turns the string into a class and its keyword arguments
# (`Trainer.get_optimizer_cls_and_kwargs`); here is what each builds, built on
# the course model:

# %% tags=["nbval-check-output"]
from transformers import Trainer, TrainingArguments

with tempfile.TemporaryDirectory() as output_dir:
    for optim in ("adamw_torch", "adafactor", "adamw_bnb_8bit", "paged_adamw_8bit"):
        arguments = TrainingArguments(output_dir=output_dir, optim=optim, report_to=[], use_cpu=True)
        optimizer_class, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(arguments, model)
        built = optimizer_class(model.parameters(), **optimizer_kwargs)
        print(f'optim="{optim}": {optimizer_class.__module__}.{optimizer_class.__name__}('
              + ", ".join(f"{key}={value}" for key, value in optimizer_kwargs.items()) + ")")
        del built

# %% [markdown]
# So `"adafactor"` is transformers' Adafactor with the relative step switched
# off (`scale_parameter=False, relative_step=False`), as in this lesson, so the
# Trainer's learning rate and schedule apply; `"adamw_bnb_8bit"` is
# bitsandbytes' `AdamW` with `optim_bits=8`, the `AdamW8bit` of section 2;
# `"paged_adamw_8bit"` is the same with `is_paged=True`.
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
    **models.well_known_architectures(),  # BERT-base, GPT-2 (small), the Llama-2-7B body (no LM head)
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
          + " ".join(f"{format_bytes(state_bytes[label][name]):>21}" for label in state_bytes))

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

# %% [markdown]
# ## Summary

# %%
from IPython.display import Markdown, display

eight_bit_per_parameter = memory.estimate_optimizer_state(distilbert_shapes, "adamw8bit") / distilbert_parameters
compared = sorted((label for label in tradeoff if label != "AdamW"), key=lambda label: tradeoff[label][0])
distances_by_bytes = [tradeoff[label][1] for label in compared]  # from the fewest bytes to the most
if distances_by_bytes == sorted(distances_by_bytes, reverse=True):
    tradeoff_reading = "Here, the fewer bytes an optimizer keeps, the further its update from AdamW's."
else:
    farthest = max(compared, key=lambda label: tradeoff[label][1])
    tradeoff_reading = (f"Fewer bytes do not simply mean a larger distance: the farthest from AdamW is {farthest}, "
                        f"at {tradeoff[farthest][0]:.2f} bytes per parameter (section 3 says why).")
display(Markdown(f"""
- **Adafactor** keeps, for each weight matrix, the moving averages of the row
  and column means of the squared gradients, $n + m$ numbers instead of
  $n \\times m$, and rebuilds a rank-1 second moment from them. Vectors keep a
  full second moment. `beta1` adds a first moment back (one number per
  parameter). Its default step is relative to the weight's RMS, floored at
  $\\epsilon_2 = 10^{{-3}}$, with updates clipped to an RMS of at most 1.
  transformers' version keeps fp32 statistics and can take an absolute `lr`
  (`relative_step=False, scale_parameter=False`, what the Trainer's
  `optim="adafactor"` builds); torch's keeps the gradient's dtype and always
  steps relative to the weights' RMS.
- **8-bit AdamW** keeps AdamW's algorithm and quantises both moving averages
  to one byte, with an fp32 scale per block of {quantization.BITSANDBYTES_BLOCK_SIZE}:
  {eight_bit_per_parameter:.2f} bytes per parameter on distilbert-base-cased.
  Tensors under {quantization.BITSANDBYTES_MIN_8BIT_SIZE:,} elements stay fp32. A non-linear
  code keeps the small values of the second moment that a linear code would
  round to zero. Keep the embeddings' state in 32 bits; fp32 training goes from
  {per_parameter['AdamW']:.0f} to {per_parameter['8-bit AdamW']:.1f} bytes per parameter, before activations.
- **The trade-off**, measured over {NUM_REPLAY_STEPS} steps of the same gradients:
  {"; ".join(f"{label} {bpp:.2f} bytes per parameter, {distance:.0%} from AdamW" for label, (bpp, distance) in tradeoff.items() if label != "AdamW")}.
  {tradeoff_reading} 8-bit AdamW's distance is rounding; Adafactor's is its
  different algorithm. The training runs are one seed each: not a ranking.

Lesson 4 counts the memory of a whole training step: weights, gradients,
optimizer state and activations, and when the peak comes.
"""))
