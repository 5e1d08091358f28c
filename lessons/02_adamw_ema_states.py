# %% [markdown]
# # Lesson 2 — AdamW: two moving averages per weight, and what they cost
#
# Choosing an optimizer is a trade-off between how well it trains and how much
# memory it keeps. Three optimizers cover most of today's fine-tuning:
#
# | optimizer | keeps per parameter | trade-off |
# | --- | --- | --- |
# | **AdamW** | two full-precision moving averages | the reference: robust, but the most memory |
# | **Adafactor** | row and column statistics instead of a full matrix | far less memory, a coarser step |
# | **8-bit Adam** | the same two averages, quantized to 8 bits | 8-bit codes instead of 32-bit floats, a little precision lost |
#
# This lesson opens up AdamW; lesson 3 measures the other two against it.
# You will
#
# 1. build one AdamW step from its equations, write it yourself, and check it against `torch.optim.AdamW`;
# 2. watch its two moving averages and the step they produce on a noisy gradient, with sliders for β1 and β2;
# 3. estimate the memory of its state for distilbert-base-cased and for much larger models;
# 4. read the state of a real optimizer after a step, and measure it;
# 5. train with AdamW twice: with the `Trainer` and with the Accelerate loop of lesson 1.
#
# Everything runs on a laptop CPU in under a minute, without internet.
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
import gc
import inspect
import math
import tempfile

import torch
from accelerate import Accelerator, init_empty_weights
from accelerate.utils import set_seed
from IPython.display import Markdown, display
from torch.optim import AdamW
from transformers import BertConfig, BertForSequenceClassification

from course_utils import adamw, data, loops, memory, models, plots, schedules
from course_utils.exercises import ____
from course_utils.exercises import lesson2 as ex
from course_utils.optimizers import make_optimizer
from course_utils.threads import use_course_threads
from course_utils.units import MIB  # the slides' "MB" means MiB too

print(f"torch threads in this kernel: {use_course_threads()}")

# %% [markdown]
# ## 1. AdamW from first principles
#
# Plain gradient descent moves every weight by `lr` times its gradient `g`, so a
# weight with large gradients takes large steps and one with tiny gradients
# barely moves. Adam gives each weight its own step size: it divides a smoothed
# gradient by a smoothed gradient *magnitude*. Both smoothings are exponential
# moving averages (EMAs), and they are the two tensors AdamW keeps per weight.
#
# Let us follow one step on a weight tensor of three entries.

# %%
param = torch.tensor([1.0, -2.0, 0.5])
grad = torch.tensor([0.3, -0.01, 4.0])  # three very different gradient scales
lr, beta1, beta2, eps, weight_decay = 1e-3, 0.9, 0.999, 1e-8, 0.01  # torch.optim.AdamW's defaults
step = 1  # steps are counted from 1
exp_avg = torch.zeros_like(param)  # the state starts at zero
exp_avg_sq = torch.zeros_like(param)

# %% [markdown]
# **First moment: the EMA of the gradients.** Each step keeps a fraction β1 of
# the old average and mixes in (1 − β1) of the new gradient. With β1 = 0.9 it
# remembers roughly the last 1/(1 − β1) = 10 gradients: noise averages out, a
# consistent direction stays.
#
# $$m_t = \beta_1\, m_{t-1} + (1 - \beta_1)\, g_t$$

# %%
exp_avg = beta1 * exp_avg + (1 - beta1) * grad
exp_avg

# %% [markdown]
# **Second moment: the EMA of the squared gradients.** The same average, over
# `g**2`: it tracks how large the gradients of each weight are, whatever their
# sign. β2 = 0.999 gives it a long memory, about 1,000 steps.
#
# $$v_t = \beta_2\, v_{t-1} + (1 - \beta_2)\, g_t^2$$

# %%
exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
exp_avg_sq

# %% [markdown]
# **Bias correction.** Both averages start at zero, so during the first steps
# they are too small: after one step `m` is only (1 − β1) = 10% of the gradient.
# After t steps, `m` gives the t gradients seen so far weights (1 − β1)β1ᵗ⁻ⁱ
# that add up to 1 − β1ᵗ, not to 1; dividing by 1 − β1ᵗ makes them add up to 1.
# The division fades away as t grows.
#
# $$\hat m_t = \frac{m_t}{1 - \beta_1^t} \qquad \hat v_t = \frac{v_t}{1 - \beta_2^t}$$

# %%
exp_avg_hat = exp_avg / (1 - beta1**step)
exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
exp_avg_hat, exp_avg_sq_hat.sqrt()  # after one step: the gradient itself, and its magnitude

# %% [markdown]
# So the correction gives back the gradient *exactly* only while the gradient is
# constant. When it varies, the corrected average is a weighted average of the
# gradients so far, leaning on the latest: neither the last gradient nor their
# plain mean. Five steps of each, in float64:

# %% tags=["nbval-check-output"]
bias_correction_examples = {
    "constant gradient": [0.3, 0.3, 0.3, 0.3, 0.3],
    "varying gradients": [0.3, -0.1, 0.5, 0.2, 0.4],
}
for name, gradient_values in bias_correction_examples.items():
    m_t, corrected = 0.0, []
    for t, g_t in enumerate(gradient_values, start=1):
        m_t = beta1 * m_t + (1 - beta1) * g_t
        corrected.append(m_t / (1 - beta1**t))
    largest_gap = max(abs(c - g_t) for c, g_t in zip(corrected, gradient_values))
    print(f"{name}: corrected m after each step {', '.join(f'{c:+.4f}' for c in corrected)}\n"
          f"{'':>19}largest gap from that step's gradient {largest_gap:.1e}; after step 5: last gradient "
          f"{gradient_values[-1]:+.4f}, mean of the 5 {sum(gradient_values) / 5:+.4f}")

# %% [markdown]
# **The step.** The weight moves by the smoothed gradient divided by the
# smoothed magnitude. The ratio has no units, so every weight moves by about
# `lr` whatever the scale of its gradient, as long as that scale is well above
# `eps`. `eps` is added *after* the square root, and it does more than guard
# against dividing by zero: the next cell but one shows what.
#
# $$\theta_t = \theta_{t-1} - \text{lr}\,\frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}$$

# %%
update = lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
update / lr  # in units of lr: gradients of 0.3, 0.01 and 4 all give a step of about lr

# %% [markdown]
# **`eps` sets a floor.** Where $\sqrt{\hat v}$ is far below `eps`, the
# denominator is about `eps` and the step is $\text{lr}\,\hat m / \epsilon$: Adam
# behaves like plain SGD with learning rate `lr / eps`, and a tiny gradient makes a
# tiny step instead of one of size `lr`. The first step for gradients from 1e-4
# down to 1e-12, in units of lr, next to what SGD with learning rate `lr / eps` would do:

# %% tags=["nbval-check-output"]
for tiny_gradient in [1e-4, 1e-6, 1e-8, 1e-10, 1e-12]:
    g = torch.tensor([tiny_gradient], dtype=torch.float64)
    zeros = torch.zeros_like(g)
    stepped, _, _ = adamw.adamw_step(zeros, g, zeros, zeros, step=1, lr=lr, eps=eps, weight_decay=0.0)
    print(f"gradient {tiny_gradient:.0e}: Adam's step {-stepped.item() / lr:.4f} lr; "
          f"SGD with lr/eps: {(lr / eps) * tiny_gradient / lr:.4f} lr")

# %% [markdown]
# Well above `eps` every gradient gets a step of about `lr`; well below, the step
# shrinks in proportion to the gradient, exactly as SGD's would. Lesson 6
# ([06_data_parallel](06_data_parallel.ipynb), section 3) meets this floor in
# DistilBERT: its attention key biases have gradients of about 1e-10, and AdamW
# moves them by a few thousandths of `lr` per step.

# %% [markdown]
# **Decoupled weight decay: the W in AdamW.** Weight decay pulls every weight
# towards zero. Adam "with L2" adds `weight_decay * param` to the gradient, so
# the decay goes through both moving averages and is then divided by
# $\sqrt{\hat v}$: weights with large gradients are barely decayed, weights with
# small ones are decayed hard. AdamW takes the decay out of the gradient and
# applies it to the weights directly, the same for every weight:
#
# $$\theta_t = \theta_{t-1} - \text{lr}\,\lambda\,\theta_{t-1} - \text{lr}\,\frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}$$

# %%
new_param = param - lr * weight_decay * param - update
new_param

# %% [markdown]
# ### Exercise 1 — One AdamW step
#
# Put the five pieces together in a function. It receives the weight, its
# gradient, the two moving averages and the step number, and returns the new
# weight and the new (uncorrected) moving averages. The check runs it for
# several steps next to `torch.optim.AdamW` on the same weights and gradients,
# and requires every tensor to agree to 1e-6; when they do not, it tells you which
# mistake your step looks like.

# %%
def my_adamw_step(param, grad, exp_avg, exp_avg_sq, step,
                  lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    # BEGIN SOLUTION
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
    exp_avg_hat = exp_avg / (1 - beta1**step)
    exp_avg_sq_hat = exp_avg_sq / (1 - beta2**step)
    param = param - lr * weight_decay * param
    param = param - lr * exp_avg_hat / (exp_avg_sq_hat.sqrt() + eps)
    # END SOLUTION
    # BEGIN STARTER
    # exp_avg = ____
    # exp_avg_sq = ____
    # exp_avg_hat = ____
    # exp_avg_sq_hat = ____
    # param = ____
    # END STARTER
    return param, exp_avg, exp_avg_sq


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### The course's step, and the library's
#
# `course_utils.adamw.adamw_step` is the same step, the decay and the update in
# one expression; the lesson's figures are drawn with it:

# %%
display(Markdown(f"```python\n{inspect.getsource(adamw.adamw_step)}```"))

# %% [markdown]
# `torch.optim.AdamW` keeps the same two tensors, as `exp_avg` and `exp_avg_sq`.
# `adamw.run_steps` applies a step function to a sequence of gradients, and
# `adamw.run_torch_adamw` lets `torch.optim.AdamW` do the same, so the two can be
# compared tensor by tensor. The comparison uses float64, so that only a
# difference in the formula, not rounding, could show.

# %%
generator = torch.Generator().manual_seed(0)
initial_param = torch.randn(4, 3, generator=generator, dtype=torch.float64)
gradients = [torch.randn(4, 3, generator=generator, dtype=torch.float64) for _ in range(10)]

for decay in (0.0, 0.1):
    ours = adamw.run_steps(adamw.adamw_step, initial_param, gradients, lr=0.01, weight_decay=decay)
    torchs = adamw.run_torch_adamw(initial_param, gradients, lr=0.01, weight_decay=decay)
    gap = max((a[key] - b[key]).abs().max().item() for a, b in zip(ours, torchs) for key in a)
    print(f"weight_decay={decay}: 10 steps, largest difference from torch.optim.AdamW {gap:.1e}")

# %% [markdown]
# Why decouple the decay? Take two weights equal to 1 whose gradients are pure
# noise, the same noise but one a thousand times smaller. The loss does not care
# where either weight goes, so weight decay alone should decide, equally for
# both. AdamW does that; Adam with L2 lets the small-gradient weight's decay
# dominate its normalised step and drives it to zero.

# %%
noise = torch.randn(300, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
scales = torch.tensor([1.0, 0.001], dtype=torch.float64)
two_weights = torch.ones(2, dtype=torch.float64)
for name, step_function in [("AdamW", adamw.adamw_step), ("Adam with L2", adamw.adam_l2_step)]:
    history = adamw.run_steps(step_function, two_weights, list(noise * scales), lr=0.01, weight_decay=0.1)
    large, small = history[-1]["param"].tolist()
    print(f"{name:>12}: after 300 steps, weight with large gradients {large:+.3f}, with small gradients {small:+.3f}")

# %% [markdown]
# ## 2. The moving averages, seen
#
# Here is a gradient sequence for a single weight in three phases: a clear
# signal, then mostly noise, then the signal reversed. The figure shows the two
# moving averages (dashed: raw, solid: bias-corrected) and the update they
# produce, in units of `lr`.

# %%
noisy = adamw.noisy_gradients(num_steps=300, seed=0)
figure = plots.plot_moving_averages(noisy, beta1=0.9, beta2=0.999, lr=1e-3)

# %% [markdown]
# What to read in it:
#
# - the first moment follows the signal and smooths the noise, lagging by about 1/(1 − β1) steps after the reversal;
# - the raw averages start near zero; bias correction lifts them to the right scale from the first step;
# - when the signal is clear, the update sits near ±1 `lr`; in the noisy phase the
#   smoothed gradient is small next to the smoothed magnitude, and AdamW takes small steps;
# - without bias correction, the first updates would be several times `lr`:

# %%
traces = adamw.ema_traces(noisy, beta1=0.9, beta2=0.999, lr=1e-3)
print(f"first update with bias correction:    {traces['update'][0] / 1e-3:.2f} lr")
print(f"first update without bias correction: {traces['update_without_bias_correction'][0] / 1e-3:.2f} lr"
      f"  (= (1 - beta1) / sqrt(1 - beta2) = {(1 - 0.9) / math.sqrt(1 - 0.999):.2f})")

# %% [markdown]
# Move the sliders to change β1 and β2; the figure redraws when you let go.
# Try β1 = 0 (no momentum: the update follows every gradient's sign), β1 = 0.99
# (a long lag after the reversal), and a small β2 such as 0.9 (the magnitude
# follows the noise, and the steps become jumpy). The sliders need a running
# kernel: in a static copy of this notebook, the figure above stands in for them.

# %%
plots.moving_average_explorer(noisy, beta1=0.9, beta2=0.999, lr=1e-3)

# %% [markdown]
# ## 3. What the states cost in memory
#
# `exp_avg` and `exp_avg_sq` have the shape of the weights and, for fp32 weights,
# 4 bytes per element:
#
# $$\text{AdamW state} = 2 \text{ states} \times 4 \text{ bytes} = 8 \text{ bytes per parameter}$$
#
# For distilbert-base-cased we only need the number of parameters, so the model
# is built from its configuration on the *meta* device: shapes, no weights, no
# download.

# %% tags=["nbval-check-output"]
meta_model = models.build_distilbert_base_cased(on_meta_device=True)
num_parameters = models.count_parameters(meta_model)
print(f"distilbert-base-cased: {num_parameters:,} parameters")

# %% [markdown]
# ### Exercise 2 — Estimate AdamW's state
#
# Try the rule on the model DistilBERT was distilled from, bert-base-cased: the
# cell builds it from its configuration on the meta device, the same way, and
# counts `bert_parameters`. Compute `estimated_mib`: the memory of AdamW's two
# states for `bert_parameters` fp32 parameters, in MiB (1 MiB = 1024² bytes).
# The lesson then goes on with distilbert-base-cased.

# %%
with init_empty_weights():  # shapes only: no memory, no download
    bert = BertForSequenceClassification(BertConfig(vocab_size=28_996))  # bert-base-cased's configuration
bert_parameters = models.count_parameters(bert)
print(f"bert-base-cased: {bert_parameters:,} parameters")
# BEGIN SOLUTION
estimated_mib = bert_parameters * 8 / 1024**2
# END SOLUTION
# BEGIN STARTER
# estimated_mib = ____
# END STARTER
ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# For distilbert-base-cased, the same rule gives the figure the slides print
# rounded, in "MB": their MB is 1024² bytes, a MiB. The course writes MiB.
# `course_utils.memory.estimate_optimizer_state` makes the same estimate from
# the parameters' shapes and dtypes, and adds what the rule of thumb leaves out:
# a `step` counter per parameter tensor.

# %% tags=["nbval-check-output"]
rule_of_thumb_bytes = num_parameters * 8
estimated_bytes = memory.estimate_optimizer_state(meta_model, "adamw")
num_tensors = len(list(meta_model.parameters()))
print(f"{'8 bytes per parameter':>32}: {rule_of_thumb_bytes:,} bytes = {rule_of_thumb_bytes / MIB:.1f} MiB")
print(f"{'memory.estimate_optimizer_state':>32}: {estimated_bytes:,} bytes = {estimated_bytes / MIB:.1f} MiB")
print(f"difference: {estimated_bytes - rule_of_thumb_bytes:,} bytes, one 4-byte step counter for each of the "
      f"{num_tensors} parameter tensors")

# %% [markdown]
# The state grows linearly with the model. On a log-log plot, the course's tiny
# checkpoint, distilbert-base-cased and three well-known architectures all sit on
# the 8-bytes-per-parameter line; each point is `estimate_optimizer_state` on the
# real architecture (built on the meta device). SGD with momentum keeps one
# state, half as much; plain SGD keeps none.

# %%
tiny_model = models.load_pretrained_classifier()
architectures = {"tiny checkpoint (this course)": tiny_model, "distilbert-base-cased": meta_model}
architectures.update(models.well_known_architectures())
points = {
    name: (models.count_parameters(model), memory.estimate_optimizer_state(model, "adamw"))
    for name, model in architectures.items()
}
figure = plots.plot_state_memory_vs_parameters(points, unit="MiB")

# %% tags=["nbval-check-output"]
for name, (count, state_bytes) in points.items():
    print(f"{name:>30}: {count:>13,} parameters -> AdamW state {state_bytes / MIB:>10,.1f} MiB")

# %% [markdown]
# A 7B-parameter model needs tens of GiB for AdamW's state alone, before its
# weights, gradients and activations: this is why lesson 3 looks at optimizers
# that keep less.
#
# ## 4. The real state after one step
#
# Now with real weights: distilbert-base-cased built from its configuration
# (random weights, no download), one forward and backward pass on a small batch
# of random tokens, and one `AdamW` step. The state's size does not depend on
# the data, and the optimizer creates its state during its first `step()`.

# %%
set_seed(0)
model = models.build_distilbert_base_cased(on_meta_device=False)
optimizer = AdamW(model.parameters(), lr=2e-5)
print(f"before the first step, the optimizer holds state for {len(optimizer.state)} parameters")

input_ids = torch.randint(0, model.config.vocab_size, (2, 32))
labels = torch.tensor([0, 1])
model(input_ids=input_ids, labels=labels).loss.backward()
optimizer.step()
print(f"after it, for {len(optimizer.state)} parameter tensors")

# %% [markdown]
# `optimizer.state` maps each parameter to a dict: `step` (a 0-d tensor counting
# steps), `exp_avg` and `exp_avg_sq` (shaped like the parameter). Printing it
# would show a wall of numbers; shapes and dtypes say what matters:

# %%
print(adamw.optimizer_state_table(optimizer, model, max_rows=4))

# %% [markdown]
# Summed over every parameter, per state name:

# %% tags=["nbval-check-output"]
for name, row in memory.describe_optimizer_state(optimizer).items():
    print(f"{name:>10}: {row['tensors']:>3} {row['dtype']} tensors, {row['elements']:>11,} elements, "
          f"{row['bytes']:>11,} bytes = {row['bytes'] / MIB:5.1f} MiB")

# %% [markdown]
# ### Exercise 3 — Measure the state
#
# Write `optimizer_state_size(optimizer)`, returning `(num_elements, num_bytes)`
# for everything `optimizer.state` holds. Two rules:
#
# - measure each tensor where it lives: do not copy it (`torch.tensor(t)`
#   copies, and warns) — a copy of a 7B model's state would need as much memory again;
# - memory is held by *storages* (allocations), and a tensor may be a view of
#   part of one: some optimizers share one tensor between parameters, or keep
#   all their states as views of one flat buffer. Count each storage once and
#   whole: `t.untyped_storage().data_ptr()` identifies it,
#   `t.untyped_storage().nbytes()` is its size in bytes, and
#   `nbytes // t.element_size()` its elements;
# - some optimizers keep `step` as a Python number: skip what is not a tensor.
#
# The check tries your function on several optimizers, including such tricky ones.

# %%
def optimizer_state_size(optimizer):
    num_elements, num_bytes, seen = 0, 0, set()
    for state in optimizer.state.values():
        for value in state.values():
            # BEGIN SOLUTION
            if not torch.is_tensor(value):
                continue  # a Python number holds no tensor memory
            storage = value.untyped_storage()
            if storage.data_ptr() in seen:
                continue  # one allocation shared by several entries
            seen.add(storage.data_ptr())
            num_bytes += storage.nbytes()  # the whole allocation, not the part this view shows
            num_elements += storage.nbytes() // value.element_size()
            # END SOLUTION
            # BEGIN STARTER
            # ____
            # END STARTER
    return num_elements, num_bytes


ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]
# `course_utils.memory` measures the same way. On the DistilBERT optimizer, the
# count agrees with the estimate made on the meta device, to the byte:

# %% tags=["nbval-check-output"]
state_elements = memory.count_optimizer_state_elements(optimizer)
state_bytes = memory.measure_optimizer_state(optimizer)
print(f"optimizer state: {state_elements:,} elements, {state_bytes:,} bytes = {state_bytes / MIB:.1f} MiB "
      f"(the slides round it to {state_bytes / MIB:.0f} \"MB\", meaning MiB)")
print(f"= 2 x {num_parameters:,} parameters + {num_tensors} step counters: "
      f"{state_elements == 2 * num_parameters + num_tensors}")
print(f"measured == estimated on the meta device: {state_bytes == estimated_bytes}")

# %% [markdown]
# Next to the weights and gradients, the state is the largest of the three:

# %% tags=["nbval-check-output"]
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
gradient_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
print(f"weights {weight_bytes / MIB:.1f} MiB + gradients {gradient_bytes / MIB:.1f} MiB "
      f"+ AdamW state {state_bytes / MIB:.1f} MiB = {(weight_bytes + gradient_bytes + state_bytes) / MIB:,.1f} MiB")

# %% [markdown]
# Free them all before training: rebinding the names drops the last references
# (unlike `del`, this cell can run twice).

# %%
model = optimizer = input_ids = labels = None
gc.collect();

# %% [markdown]
# ## 5. Training with AdamW, two ways
#
# AdamW is the `Trainer`'s default optimizer, and one line in a custom loop. We
# fine-tune the course's tiny checkpoint on the paraphrase data (see lesson 1)
# both ways, from the same seed, with `torch.optim.AdamW` and a linear schedule
# with 10% warm-up. The data is hard for so small a model: with fewer epochs,
# some seeds never get past predicting "paraphrase" for every pair.

# %%
NUM_EPOCHS = 3
BATCH_SIZE = 32
LEARNING_RATE = 1e-3  # for the tiny model; distilbert-base-cased wants about 2e-5

dataset = data.load_paraphrase_dataset()
tokenizer = data.load_tokenizer()
tokenized = data.tokenize_dataset(dataset, tokenizer)
train_dataset = tokenized["train"]
validation_dataset = tokenized["validation"]
num_training_steps = NUM_EPOCHS * math.ceil(len(train_dataset) / BATCH_SIZE)

# %% [markdown]
# ### With the `Trainer`
#
# `course_utils.loops.train_with_trainer` is lesson 1's Trainer set-up: it takes
# our optimizer and schedule through `optimizers=`, and returns the Trainer. Its
# evaluation hands `loops.trainer_metrics` an `EvalPrediction`, the logits
# (`predictions`) and the true labels (`label_ids`), which it turns into accuracy
# and F1 with no download. The optimizer comes from the course's one builder,
# `course_utils.optimizers.make_optimizer`, and the schedule is added separately.

# %%
display(Markdown(f"```python\n{inspect.getsource(loops.trainer_metrics)}```"))

# %%
set_seed(0)
model = models.load_pretrained_classifier()
optimizer = make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, num_training_steps, warmup_fraction=0.1)
with tempfile.TemporaryDirectory() as output_dir:  # the Trainer makes this folder; it saves nothing here
    trainer = loops.train_with_trainer(
        model, optimizer, lr_scheduler, train_dataset, validation_dataset, tokenizer, NUM_EPOCHS, 0, output_dir
    )
trainer_metrics = trainer.evaluate()
print(f"Trainer: validation accuracy {trainer_metrics['eval_accuracy']:.3f}, F1 {trainer_metrics['eval_f1']:.3f}")

# %% [markdown]
# The optimizer the `Trainer` used is ours, so its state can be measured as before:
# 8 bytes per parameter of the tiny model, plus its step counters.

# %% tags=["nbval-check-output"]
trainer_state_bytes = memory.measure_optimizer_state(trainer.optimizer)
tiny_parameters = models.count_parameters(model)
print(f"{tiny_parameters:,} parameters; AdamW state after training: {memory.count_optimizer_state_elements(trainer.optimizer):,} "
      f"elements, {trainer_state_bytes:,} bytes = {trainer_state_bytes / MIB:.2f} MiB")
print(f"as estimated: {trainer_state_bytes == memory.estimate_optimizer_state(model, 'adamw')}")

# %% [markdown]
# ### With Accelerate
#
# The Accelerate loop of lesson 1 (`course_utils.loops.train_accelerate`) takes
# the same optimizer and schedule; it returns the loss of every step.

# %%
set_seed(0)
model = models.load_pretrained_classifier()
optimizer = make_optimizer("adamw", model.parameters(), lr=LEARNING_RATE)
lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, num_training_steps, warmup_fraction=0.1)
train_dataloader, validation_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
losses = loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, NUM_EPOCHS, Accelerator())
# One batch's loss is noisy: average the first and the last ten steps.
print(f"{len(losses)} steps; mean loss over the first 10: {sum(losses[:10]) / 10:.3f}, "
      f"over the last 10: {sum(losses[-10:]) / 10:.3f}")

# %%
figure = plots.plot_loss_curves({"Accelerate loop, AdamW": losses}, title="Fine-tuning the tiny checkpoint with AdamW", smooth=10)

# %% [markdown]
# And the state this optimizer holds after training, measured:

# %% tags=["nbval-check-output"]
accelerate_state_bytes = memory.measure_optimizer_state(optimizer)
print(f"AdamW state after training with Accelerate: {accelerate_state_bytes:,} bytes = "
      f"{accelerate_state_bytes / MIB:.2f} MiB, the same as with the Trainer: {accelerate_state_bytes == trainer_state_bytes}")

# %%
metrics = loops.evaluate(model, validation_dataloader)
print(f"Accelerate loop: validation accuracy {metrics['accuracy']:.3f}, F1 {metrics['f1']:.3f}")

# %%
display(Markdown(
    f"The two runs end {abs(metrics['accuracy'] - trainer_metrics['eval_accuracy']):.3f} apart in accuracy. "
    "That is no finding about either way of training: one run of each cannot rank them. The Trainer draws "
    f"its batches in another order (its own sampler, drawn from torch's generator, which it seeds with "
    "`args.seed`), clips the gradient norm at "
    f"{trainer.args.max_grad_norm} and runs on Accelerate itself (`trainer.accelerator`); on so small a "
    "model the seed alone moves the accuracy by several points, as lesson 1 shows by training the same loop "
    "from two seeds."
))

# %% [markdown]
# ## Summary
#
# - AdamW keeps two moving averages per weight: of the gradients (`exp_avg`, β1)
#   and of the squared gradients (`exp_avg_sq`, β2). Bias correction undoes their
#   start at zero; their ratio gives every weight a step of about `lr`.
# - Its weight decay is *decoupled*: applied to the weights, not added to the
#   gradient, so every weight is decayed alike.
# - In fp32 the two states cost 8 bytes per parameter, plus a step counter per
#   tensor. Counted on the meta device, estimated, measured: the three agree.
# - The `Trainer` and an Accelerate loop take the same `torch.optim.AdamW`; its
#   state is the same size either way.
#
# Lesson 3 measures optimizers that keep less: Adafactor and 8-bit Adam.
