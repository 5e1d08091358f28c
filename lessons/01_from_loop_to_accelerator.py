# %% [markdown]
# # Lesson 1 — From a plain PyTorch loop to Hugging Face Accelerate
#
# A training loop written for one CPU usually needs surgery before it runs on a
# GPU, on several GPUs or on several machines: tensors must be moved to the right
# device, the model must be wrapped so that processes average their gradients,
# the data must be split between them.
# [Accelerate](https://huggingface.co/docs/accelerate) does that surgery for you
# with a handful of changed lines, and leaves the loop itself in your hands.
#
# In this lesson you will
#
# 1. run a plain PyTorch loop that fine-tunes a pre-trained DistilBERT to detect paraphrases,
# 2. convert it to Accelerate, line by line,
# 3. check that both loops train *exactly* the same model,
# 4. compare the `Trainer` (no loop to write) with Accelerate (your loop, made portable), against what the seed alone changes,
# 5. practise with four exercises at the end.
#
# Everything runs on a laptop CPU in about a minute, without internet.
# The dataset's majority class is printed below, so you can tell learning from guessing.
#
# The first cell gives torch one thread in this kernel (`course_utils.threads`):
# on a laptop whose other core is busy, two threads spend their time waiting for
# each other and training becomes many times slower, while one thread loses little.

# %%
import tempfile
from collections import Counter

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from IPython.display import HTML, Markdown, display
from torch.optim import Adam
from tqdm.auto import tqdm
from transformers import Trainer, TrainingArguments, get_linear_schedule_with_warmup

from course_utils import data, loop_diff, loops, models, plots
from course_utils.exercises import ____
from course_utils.exercises import lesson1 as ex
from course_utils.threads import use_course_threads

print(f"torch threads in this kernel: {use_course_threads()}")

# %% [markdown]
# ## The data and the model, offline
#
# The course ships two small stand-ins in `data/`, so it runs without a network:
#
# | in this course | stands in for |
# | --- | --- |
# | `data/paraphrase/*.csv`: pairs of sentences, label 1 when they say the same thing | the GLUE MRPC dataset |
# | `data/tiny-distilbert/`: a small DistilBERT pre-trained on the course corpus, with its tokenizer | the `distilbert-base-cased` checkpoint |
#
# Both are loaded with the real Hugging Face APIs (`load_dataset("csv", ...)`,
# `from_pretrained(path)`), so the code is the code you would write for the real ones.
# With internet, one line changes each: `load_dataset("glue", "mrpc")` and
# `AutoModelForSequenceClassification.from_pretrained("distilbert-base-cased")`,
# and so does the learning rate: the tiny model trains at 1e-3 to 3e-3, while
# `distilbert-base-cased` wants about 2e-5 to 5e-5 (the slides use 2e-5); 1e-3
# would wreck the pre-trained weights.

# %%
dataset = data.load_paraphrase_dataset()
dataset

# %%
labels = dataset["validation"]["label"]
majority_share = max(labels.count(0), labels.count(1)) / len(labels)
print(f"always answering the most common label scores {majority_share:.3f} on validation\n")
for example in dataset["train"].select(range(3)):
    print(f"label {example['label']}: {example['sentence1']!r}\n         {example['sentence2']!r}")

# %% [markdown]
# The model is a sequence classifier: it reads both sentences, joined by a `[SEP]`
# token, and outputs two scores (logits), one per label. Loading it is one call:

# %% tags=["nbval-check-output"]
model = models.load_pretrained_classifier()  # with internet: from_pretrained("distilbert-base-cased")
print(f"{type(model).__name__} with {models.count_parameters(model):,} parameters")

# %% [markdown]
# `course_utils.data.make_dataloaders` tokenizes the pairs and returns two
# `DataLoader`s. Each batch is a dict of tensors: `input_ids` (token numbers),
# `attention_mask` (1 for real tokens, 0 for padding) and `labels`, the names the
# model's `forward` takes, so `model(**batch)` runs it.

# %%
BATCH_SIZE = 32
NUM_EPOCHS = 2
LEARNING_RATE = 1e-3  # for the tiny model; distilbert-base-cased wants about 2e-5

train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
batch = next(iter(train_dataloader))
{name: tuple(tensor.shape) for name, tensor in batch.items()}

# %% [markdown]
# ## 1. The plain PyTorch loop
#
# Every step of training does the same six things:
#
# 1. move the batch to the device the model lives on (`.to(device)`);
# 2. the forward pass: `model(**batch)` computes the outputs;
# 3. the loss: here the model computes the cross-entropy itself, because the batch holds `labels`;
# 4. `loss.backward()`: the backward pass fills `.grad` of every parameter;
# 5. `optimizer.step()` updates the parameters, `lr_scheduler.step()` the learning rate;
# 6. `optimizer.zero_grad()`: clear the gradients before the next batch adds its own.
#
# We use Adam with a learning rate that rises linearly during a *warm-up* of 10% of
# the steps, then decreases linearly to zero (`get_linear_schedule_with_warmup`).
# The warm-up keeps the first, noisy updates small while Adam's running averages
# are still poor estimates.

# %%
training_steps = NUM_EPOCHS * len(train_dataloader)
warmup_steps = int(0.1 * training_steps)
print(f"{len(train_dataloader)} batches per epoch, {training_steps} steps, {warmup_steps} of warm-up")

# %% [markdown]
# The cell below builds everything afresh from the seed, so running it again
# trains the same model again, and trains it with the loop.

# %%
set_seed(0)
device = torch.device("cpu")  # "cuda" on a GPU machine: the loop must know
model = models.load_pretrained_classifier()
model.to(device)  # first: the optimizer below is built from the parameters where they will train
train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=warmup_steps, num_training_steps=training_steps
)

model.train()
plain_losses = []
for epoch in range(NUM_EPOCHS):
    for step, batch in enumerate(train_dataloader):
        batch = {k: v.to(device) for k, v in batch.items()}
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        plain_losses.append(loss.item())

plain_scores = loops.evaluate(model, eval_dataloader)
print(f"validation accuracy {plain_scores['accuracy']:.3f}, F1 {plain_scores['f1']:.3f} "
      f"(majority class: {majority_share:.3f})")

# %% [markdown]
# ## 2. The same loop with Accelerate
#
# ### Create an `Accelerator`
#
# The `Accelerator` looks at the machine and at how the script was launched (one
# process, or several with `accelerate launch`), and picks the device and the
# distributed set-up. `device_placement=True` (the default) means it also moves
# the model and every batch to that device for you.

# %%
accelerator = Accelerator(device_placement=True)
print(f"device: {accelerator.device}, processes: {accelerator.num_processes}, "
      f"distributed type: {accelerator.distributed_type.value}")

# %% [markdown]
# ### `prepare`, then the loop without `.to(device)` and with `accelerator.backward`
#
# `accelerator.prepare` takes the model, the optimizer, the dataloader and the
# scheduler, and returns them *in the same order*, wrapped:
#
# - the model is moved to the device; when several processes run, it is wrapped in
#   `DistributedDataParallel` (DDP), and it is that wrapper which averages the
#   gradients across processes, during the backward pass;
# - the dataloader yields batches already on the device, and with several processes each gets its own shard of the data;
# - the optimizer and scheduler are wrapped so they step correctly in those set-ups (for example, skipping a step when mixed precision overflowed).
#
# Then two changes inside the loop:
#
# - the line that moved the batch to the device goes: the prepared dataloader already did it;
# - `loss.backward()` becomes `accelerator.backward(loss)`.
#
# Everything else — forward, loss, the optimizer and scheduler steps, zero_grad —
# stays exactly as you wrote it. That is the point: the loop is still yours.
# Again the cell starts from fresh objects, this time from another seed,
# `ACCELERATE_SEED`: section 4 sets this run beside section 1's to see what the
# seed alone does, and section 3 checks that from one seed the two loops train
# the same model.

# %%
ACCELERATE_SEED = 1
set_seed(ACCELERATE_SEED)
model = models.load_pretrained_classifier()
train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=ACCELERATE_SEED)
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=warmup_steps, num_training_steps=training_steps
)

model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
model.train()
accelerate_losses = []
for epoch in range(NUM_EPOCHS):
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        accelerate_losses.append(loss.item())

accelerate_scores = loops.evaluate(model, eval_dataloader)
print(f"validation accuracy {accelerate_scores['accuracy']:.3f}, F1 {accelerate_scores['f1']:.3f} "
      f"(majority class: {majority_share:.3f})")

# %% [markdown]
# What `prepare` returned. On one process the model comes back as it was (placed
# on the device); on several it would be a `DistributedDataParallel`:

# %%
for name, obj in [("model", model), ("optimizer", optimizer), ("train_dataloader", train_dataloader),
                  ("lr_scheduler", lr_scheduler)]:
    print(f"{name:>16}: {type(obj).__name__}")

# %% [markdown]
# ### What `accelerator.backward` does
#
# The slides say *"Sincronizza i gradienti con accelerator.backward(loss)"*: the
# course corrects that. Here is the whole method, as installed: it divides the loss
# by the number of gradient-accumulation steps, scales it when fp16 mixed precision
# is on (`self.scaler`), and hands over to DeepSpeed or Megatron-LM when they are
# used; otherwise it calls `loss.backward()`. Nothing in it averages gradients:
# the DDP wrapper that `prepare` installs does that during *any* backward pass
# through the wrapped model, a plain `loss.backward()` included. Lesson 6
# ([06_data_parallel](06_data_parallel.ipynb)) runs this on two processes and
# shows it. `accelerator.backward(loss)` is still the line to write: it is what
# makes gradient accumulation, fp16 and DeepSpeed work without touching the loop.

# %%
display(Markdown("```python\n" + "\n".join(loop_diff.code_lines(Accelerator.backward)) + "\n```"))

# %% [markdown]
# ## 3. Side by side, and the same result
#
# The two loops also live in `course_utils.loops` as `train_plain` and
# `train_accelerate`, written as twins, in the shape of Accelerate's own
# `examples/nlp_example.py`. A test of the course asserts exactly which lines one
# removes and the other adds, and that the cells above run these very loops.
# Here they are side by side, the changed lines highlighted:

# %%
display(HTML(loop_diff.loop_diff_html()))

# %% [markdown]
# From the same seed, the same checkpoint and the same order of batches, the two
# loops should produce the same losses on one process, step for step, and end
# with the same parameters. The cell below runs both twins that way, from seed 0,
# for `TWIN_STEPS` steps on the first batches of the training data: a short run,
# since a whole training costs as much as section 1's, and every step of it is compared.

# %%
TWIN_STEPS = 20
twin_losses, twin_parameters = {}, {}
for way, train, where in [("plain PyTorch loop", loops.train_plain, device),
                          ("Accelerate loop", loops.train_accelerate, accelerator)]:
    set_seed(0)
    twin_model = models.load_pretrained_classifier()
    if train is loops.train_plain:
        twin_model.to(device)  # as in section 1: on its device before its optimizer is built
    twin_dataloader = data.make_dataloader("train", batch_size=BATCH_SIZE, seed=0, limit=TWIN_STEPS * BATCH_SIZE)
    twin_optimizer = Adam(twin_model.parameters(), lr=LEARNING_RATE)
    twin_scheduler = get_linear_schedule_with_warmup(
        twin_optimizer, num_warmup_steps=int(0.1 * TWIN_STEPS), num_training_steps=TWIN_STEPS
    )
    twin_losses[way] = train(twin_model, twin_optimizer, twin_scheduler, twin_dataloader, 1, where)
    twin_parameters[way] = [parameter.detach().clone() for parameter in twin_model.parameters()]

# %% [markdown]
# The curves lie on top of each other:

# %%
figure = plots.plot_loss_curves(
    twin_losses, title=f"Both loops from seed 0, {TWIN_STEPS} steps of fine-tuning (1 CPU process)"
)

# %% tags=["nbval-check-output"]
plain_twin_losses, accelerate_twin_losses = twin_losses.values()
largest_gap = max(abs(a - b) for a, b in zip(plain_twin_losses, accelerate_twin_losses))
same_parameters = all(torch.equal(a, b) for a, b in zip(*twin_parameters.values()))
print(f"{len(plain_twin_losses)} steps each; the losses agree to within 1e-6: {largest_gap < 1e-6}; "
      f"the trained parameters are identical: {same_parameters}")

# %% [markdown]
# ## 4. Trainer or Accelerator?
#
# The `Trainer` of `transformers` goes one step further than Accelerate: it *is*
# the loop. You give it the model, the datasets, the optimizer and schedule, and
# it runs forward, backward and the steps itself — plus evaluation, logging,
# checkpointing and mixed precision, all switched on by arguments. Here is all a
# user writes to train with it (`course_utils.loops.train_with_trainer`):

# %%
display(Markdown("```python\n" + "\n".join(loop_diff.code_lines(loops.train_with_trainer)) + "\n```"))

# %% [markdown]
# With so small a model, one run says little: the seed (the order of the batches
# and the dropout draws) decides when a run leaves the plateau where it answers
# "paraphrase" to everything. So before reading anything into a gap between the
# two ways, we need what the seed alone does, and sections 1 and 2 measured it:
# the loop trained from seed 0 in section 1 and from `ACCELERATE_SEED` in section 2
# (plain or with Accelerate, section 3 showed it trains the same model). The
# Trainer now trains from `ACCELERATE_SEED` too, with the same optimizer,
# schedule, epochs and batch size. A gap between the two ways that is smaller
# than what the seed alone does to one of them is no evidence that either trains
# better. Each run costs as much as the ones above; more seeds would tell more, at
# that price each.

# %%
tokenizer = data.load_tokenizer()
tokenized = data.tokenize_dataset(dataset, tokenizer)

set_seed(ACCELERATE_SEED)
model = models.load_pretrained_classifier()
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=warmup_steps, num_training_steps=training_steps
)
with tempfile.TemporaryDirectory() as output_dir:  # the Trainer makes this folder; it saves nothing here
    trainer = loops.train_with_trainer(
        model, optimizer, lr_scheduler, tokenized["train"], tokenized["validation"], tokenizer,
        NUM_EPOCHS, ACCELERATE_SEED, output_dir,
    )

accuracy = {
    "plain loop, seed 0": plain_scores["accuracy"],
    f"Accelerate loop, seed {ACCELERATE_SEED}": accelerate_scores["accuracy"],
    f"Trainer, seed {ACCELERATE_SEED}": trainer.evaluate()["eval_accuracy"],
}
for name, value in accuracy.items():
    print(f"{name:>25}: validation accuracy {value:.3f}")
print(f"{'majority class':>25}: {majority_share:.3f}")

# %%
seed_effect = abs(accuracy["plain loop, seed 0"] - accuracy[f"Accelerate loop, seed {ACCELERATE_SEED}"])
way_gap = abs(accuracy[f"Trainer, seed {ACCELERATE_SEED}"] - accuracy[f"Accelerate loop, seed {ACCELERATE_SEED}"])
lowest = min(accuracy.values())
display(Markdown(
    f"From the same seed {ACCELERATE_SEED}, the Trainer and the loop differ by {way_gap:.3f} in accuracy; "
    f"the seed alone (0 against {ACCELERATE_SEED}) moves the loop by {seed_effect:.3f}. "
    + ("The gap between the two ways is smaller than what the seed alone does to one of them: differences "
       "of this size are seed noise here, and these runs do not show that either way trains better. "
       if way_gap < seed_effect else
       "Here the gap between the two ways is larger than what the seed alone did to the loop; two seeds are "
       "still too few to rank the two ways on so noisy a task, and the Trainer's defaults below are real "
       "differences. ")
    + (f"All three runs learned: the lowest accuracy, {lowest:.3f}, is {lowest - majority_share:.3f} above "
       f"the majority-class score {majority_share:.3f}."
       if lowest - majority_share > 0.05 else
       f"One run ended at {lowest:.3f}, near the majority-class score {majority_share:.3f}: it never left "
       "the plateau, and it says nothing about its way of training.")
))

# %% [markdown]
# The Trainer does not run *our* loop with other names: its defaults differ, and
# it runs on Accelerate itself. From the Trainer above:

# %%
print(f"trainer.accelerator is an {type(trainer.accelerator).__name__}: the Trainer prepares and steps through Accelerate")
print(f"max_grad_norm = {trainer.args.max_grad_norm}: it clips the gradient norm at every step (our loop does not)")
print(f"its batches come from its own {type(trainer._get_train_sampler()).__name__}, drawn from torch's global "
      f"generator, which it seeds with args.seed = {trainer.args.seed}: another batch order than our DataLoader's")

# %% [markdown]
# One default disappears when you hand the Trainer your own optimizer. Left to
# build its own (no `optimizers=`), the Trainer makes AdamW with two parameter
# groups: `TrainingArguments(weight_decay=...)` on the weight matrices, and no
# decay on the biases and LayerNorm weights, which decay would only pull towards
# zero (they scale and shift, they do not fit the data). `optimizers=(...)`, as
# above, bypasses that: the Trainer steps the optimizer you built, with its
# groups as they are, so `AdamW(model.parameters(), weight_decay=0.01)` decays
# every bias and LayerNorm weight too. Both, read from the Trainers' own
# optimizers (`create_optimizer()` builds the default one; it trains nothing):

# %% tags=["nbval-check-output"]
PLURALS = {"bias": "biases", "LayerNorm weight": "LayerNorm weights", "weight matrix": "weight matrices"}


def kind_of_parameter(name, module_of):
    """Return "bias", "LayerNorm weight" or "weight matrix" for a parameter name of ``model``."""
    if name.endswith("bias"):
        return "bias"
    return "LayerNorm weight" if isinstance(module_of[name.rsplit(".", 1)[0]], torch.nn.LayerNorm) else "weight matrix"


def describe_groups(optimizer, model):
    """Print each parameter group's weight decay and the kinds of parameters in it."""
    module_of, name_of = dict(model.named_modules()), {id(p): n for n, p in model.named_parameters()}
    for number, group in enumerate(optimizer.param_groups, start=1):
        kinds = Counter(kind_of_parameter(name_of[id(p)], module_of) for p in group["params"])
        print(f"  group {number}: weight_decay {group['weight_decay']}, {len(group['params'])} tensors: "
              + ", ".join(f"{count} {kind if count == 1 else PLURALS[kind]}" for kind, count in sorted(kinds.items())))


with tempfile.TemporaryDirectory() as output_dir:
    default_trainer = Trainer(model=model, args=TrainingArguments(
        output_dir=output_dir, weight_decay=0.01, use_cpu=True, report_to="none"))
    default_optimizer = default_trainer.create_optimizer()
print(f"the Trainer's own {type(default_optimizer).__name__}, with TrainingArguments(weight_decay=0.01):")
describe_groups(default_optimizer, model)
print(f"the {type(trainer.optimizer.optimizer).__name__} we passed with optimizers=(...), as the Trainer above stepped it:")
describe_groups(trainer.optimizer, model)

# %% [markdown]
# What does each approach ask you to write, and what does it let you change? The
# figure below measures both on the three functions' own code, the same way for
# each: the statements you write (a call counts once, however many arguments it
# takes), and how many of the six parts of a training step (forward, loss,
# backward, optimizer step, scheduler step, zero_grad) appear in that code, where
# you can change them. The Trainer's statements are settings, not steps: its loop
# is written for you, and you change it only where it has an argument.

# %%
figure = plots.plot_trainer_versus_accelerator(
    {"plain loop": loops.train_plain, "Accelerate loop": loops.train_accelerate, "Trainer": loops.train_with_trainer}
)

# %% [markdown]
# The Trainer is the easiest when your training fits its pattern: one model, one
# loss, one optimizer. Some training does not. A **generative adversarial network
# (GAN)** trains two networks against each other — a generator that makes
# samples and a critic that tells them from real ones — with two optimizers, two
# losses and a strict order of updates within each step. The Trainer has no place
# for that; a custom loop with Accelerate does. Here is a tiny GAN whose generator
# learns to turn random noise into numbers drawn like the real data (a normal
# distribution centred on 3, spread 0.5):

# %%
set_seed(0)
generator = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
critic = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
generator_optimizer = Adam(generator.parameters(), lr=4e-3, betas=(0.5, 0.999))
critic_optimizer = Adam(critic.parameters(), lr=4e-3, betas=(0.5, 0.999))
real_samples = 3.0 + 0.5 * torch.randn(2048, 1)
real_dataloader = torch.utils.data.DataLoader(real_samples, batch_size=128, shuffle=True)
generator, critic, generator_optimizer, critic_optimizer, real_dataloader = accelerator.prepare(
    generator, critic, generator_optimizer, critic_optimizer, real_dataloader
)
bce = torch.nn.BCEWithLogitsLoss()
GAN_EPOCHS = 30

for epoch in tqdm(range(GAN_EPOCHS), desc="GAN epochs"):
    for real_batch in real_dataloader:
        fake_batch = generator(torch.randn(len(real_batch), 4, device=accelerator.device))
        # 1. the critic learns to score real samples 1 and generated ones 0
        critic_loss = (bce(critic(real_batch), torch.ones_like(real_batch))
                       + bce(critic(fake_batch.detach()), torch.zeros_like(real_batch)))
        accelerator.backward(critic_loss)
        critic_optimizer.step()
        critic_optimizer.zero_grad()
        # 2. the generator learns to make the critic answer 1 on its samples
        generator_loss = bce(critic(fake_batch), torch.ones_like(real_batch))
        accelerator.backward(generator_loss)
        generator_optimizer.step()
        generator_optimizer.zero_grad()
        critic_optimizer.zero_grad()  # the generator's loss also left gradients in the critic

with torch.no_grad():
    generated = generator(torch.randn(4096, 4, device=accelerator.device)).squeeze(1)
quantile_levels = torch.tensor([0.1, 0.5, 0.9])
real_quantiles = torch.quantile(real_samples.squeeze(1), quantile_levels)
generated_quantiles = torch.quantile(generated, quantile_levels)
print(f"     real data: mean {real_samples.mean():.2f}, std {real_samples.std():.2f}, "
      f"10/50/90% quantiles {', '.join(f'{q:.2f}' for q in real_quantiles)}")
print(f"generated data: mean {generated.mean():.2f}, std {generated.std():.2f}, "
      f"10/50/90% quantiles {', '.join(f'{q:.2f}' for q in generated_quantiles)}")

# %%
largest_quantile_gap = (real_quantiles - generated_quantiles).abs().max().item()
real_std, generated_std = real_samples.std().item(), generated.std().item()
display(Markdown(
    f"After {GAN_EPOCHS * len(real_dataloader)} steps of each network, the generated numbers' 10%, 50% and 90% "
    f"quantiles lie within {largest_quantile_gap:.2f} of the real data's, for a spread (std) of {real_std:.2f}: "
    + (f"the generator draws numbers distributed much like the real ones, though not identically "
       f"(their std is {generated_std:.2f})."
       if largest_quantile_gap < 0.25 * real_std else
       "the generator has not learned the real distribution in these steps.")
))

# %% [markdown]
# The loop is portable in the sense that matters first: `prepare` places both
# networks and the data, so the same cell runs on a GPU. On several processes a
# GAN needs more care than a one-model loop, and this course does not run it
# there: the critic runs twice before its backward pass, and the generator's loss
# goes backward through the wrapped critic, two patterns that
# `DistributedDataParallel` handles only with care (each wrapped model's forward
# and backward should pair up). Lesson 6 runs a one-model loop on two processes.
#
# ## Summary
#
# | before Accelerate | with Accelerate |
# | --- | --- |
# | you move every batch with `.to(device)` | `accelerator.prepare(dataloader)` yields batches on the device |
# | you move the model with `model.to(device)` | `accelerator.prepare(model)` places it and, on several processes, wraps it in DDP, which averages the gradients during backward |
# | `loss.backward()` | `accelerator.backward(loss)`: divides by the accumulation steps, scales under fp16, hands over to DeepSpeed; it does not average gradients |
# | the script runs on the device you wrote in it | the same script runs on CPU, one GPU, many GPUs or machines |
#
# The loop stays yours: you can train two networks, change the order of the
# steps, or add anything the Trainer has no argument for. Lesson 6 launches this
# very loop on several processes.

# %% [markdown]
# ## Exercises
#
# Replace each `____` with your answer, run the cell, and read the feedback.
# `ex.qN.hint()` gives a hint (call it again for the next one), `ex.qN.solution()`
# shows a solution.
#
# ### Exercise 1 — How many warm-up steps?
#
# You fine-tune for `num_epochs` epochs on a dataloader of `num_batches_per_epoch`
# batches, and want a warm-up of 10% of all training steps. Compute
# `num_warmup_steps` (an `int`, as `get_linear_schedule_with_warmup` expects).

# %%
num_epochs = 4
num_batches_per_epoch = len(data.make_dataloader("train", batch_size=16, seed=0))
print(f"{num_epochs} epochs of {num_batches_per_epoch} batches")
# BEGIN SOLUTION
num_warmup_steps = int(0.1 * num_epochs * num_batches_per_epoch)
# END SOLUTION
# BEGIN STARTER
# num_warmup_steps = ____
# END STARTER
ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2 — Prepare the training objects
#
# The cell below builds a fresh model, optimizer, dataloader and scheduler, and
# an `Accelerator`, with names of their own (`my_...`, so that the sections above
# keep theirs if you run them again; a second `Accelerator` shares the first
# one's process state). Pass the four objects through `my_accelerator.prepare`
# so that Accelerate manages all four, keeping the same variable names.

# %%
my_model, my_optimizer, my_dataloader, my_scheduler = ex.fresh_training_objects()
my_accelerator = Accelerator()
# BEGIN SOLUTION
my_model, my_optimizer, my_dataloader, my_scheduler = my_accelerator.prepare(
    my_model, my_optimizer, my_dataloader, my_scheduler
)
# END SOLUTION
# BEGIN STARTER
# my_model, my_optimizer, my_dataloader, my_scheduler = ____, ____, ____, ____  # one call replaces all four
# END STARTER
ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ### Exercise 3 — Convert a plain loop
#
# Below is a plain PyTorch training function. Convert it to Accelerate: create an
# `Accelerator` inside the function, `prepare` the four objects, remove the manual
# device moves and replace `loss.backward()`. It must still return the list of
# per-step losses. The check trains your function and the course's reference loop
# from the same seed and compares the final parameters.

# %%
# BEGIN SOLUTION
def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
    accelerator = Accelerator()
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    losses = []
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses
# END SOLUTION
# BEGIN STARTER
# def train_with_accelerate(model, optimizer, lr_scheduler, train_dataloader, num_epochs):
#     device = torch.device("cpu")
#     model.to(device)
#     losses = []
#     for epoch in range(num_epochs):
#         model.train()
#         for step, batch in enumerate(train_dataloader):
#             batch = {k: v.to(device) for k, v in batch.items()}
#             outputs = model(**batch)
#             loss = outputs.loss
#             loss.backward()
#             optimizer.step()
#             lr_scheduler.step()
#             optimizer.zero_grad()
#             losses.append(loss.item())
#     return losses
# END STARTER


ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]
# ### Exercise 4 — Trainer or a custom loop?
#
# Which of these needs a custom training loop rather than the `Trainer`? Set
# `answer` to `"a"`, `"b"` or `"c"`.
#
# - a. fine-tuning a classifier with AdamW, a linear schedule and evaluation after every epoch;
# - b. training a generator and a critic in turn, each with its own optimizer and loss;
# - c. fine-tuning a classifier in mixed precision on two GPUs.

# %%
# BEGIN SOLUTION
answer = "b"
# END SOLUTION
# BEGIN STARTER
# answer = ____
# END STARTER
ex.q4.check()
