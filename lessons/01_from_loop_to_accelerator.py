# %% [markdown]
# # Lesson 1 — From a plain PyTorch loop to Hugging Face Accelerate
#
# A training loop written for one CPU usually needs surgery before it runs on a
# GPU, on several GPUs or on several machines: tensors must be moved to the right
# device, gradients must be averaged across processes, the data must be split.
# [Accelerate](https://huggingface.co/docs/accelerate) does that surgery for you
# with a handful of changed lines, and leaves the loop itself in your hands.
#
# In this lesson you will
#
# 1. run a plain PyTorch loop that fine-tunes a pre-trained DistilBERT to detect paraphrases,
# 2. convert it to Accelerate, line by line,
# 3. check that both loops train *exactly* the same model,
# 4. compare the `Trainer` (no loop to write) with Accelerate (your loop, made portable),
# 5. practise with four exercises at the end.
#
# Everything runs on a laptop CPU in about a minute, without internet.
# The dataset's majority class is printed below, so you can tell learning from guessing.

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
# `AutoModelForSequenceClassification.from_pretrained("distilbert-base-cased")`.

# %%
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from IPython.display import HTML, display
from torch.optim import Adam
from transformers import get_linear_schedule_with_warmup

from course_utils import data, loops, models, plots
from course_utils.exercises import ____
from course_utils.exercises import lesson1 as ex

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
# `attention_mask` (1 for real tokens, 0 for padding) and `labels`.

# %%
BATCH_SIZE = 32
NUM_EPOCHS = 2
LEARNING_RATE = 1e-3

train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
batch = next(iter(train_dataloader))
{name: tuple(tensor.shape) for name, tensor in batch.items()}

# %% [markdown]
# ## 1. The plain PyTorch loop
#
# Every step of training does the same six things:
#
# 1. `optimizer.zero_grad()`: forget the gradients of the previous step;
# 2. move the batch to the device the model lives on (`.to(device)`);
# 3. the forward pass: the model computes its outputs;
# 4. the loss: here the model computes the cross-entropy itself when it gets `labels`;
# 5. `loss.backward()`: the backward pass fills `.grad` of every parameter;
# 6. `optimizer.step()` updates the parameters, `lr_scheduler.step()` the learning rate.
#
# We use Adam with a learning rate that rises linearly during a *warm-up* of 10% of
# the steps, then decreases linearly to zero (`get_linear_schedule_with_warmup`).
# The warm-up keeps the first, noisy updates small while Adam's running averages
# are still poor estimates.

# %%
num_training_steps = NUM_EPOCHS * len(train_dataloader)
num_warmup_steps = int(0.1 * num_training_steps)
print(f"{len(train_dataloader)} batches per epoch, {num_training_steps} steps, {num_warmup_steps} of warm-up")

# %%
set_seed(0)
device = torch.device("cpu")  # "cuda" on a GPU machine: the loop must know
model = models.load_pretrained_classifier()
train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps
)

model.to(device)
model.train()
plain_losses = []
for epoch in range(NUM_EPOCHS):
    for batch in train_dataloader:
        optimizer.zero_grad()
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        targets = batch["labels"]
        inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
        targets = targets.to(device)
        outputs = model(**inputs, labels=targets)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        plain_losses.append(loss.item())

plain_scores = loops.evaluate(model, eval_dataloader)
print(f"validation accuracy {plain_scores['accuracy']:.3f}, F1 {plain_scores['f1']:.3f}")

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
# ### `prepare` the training objects
#
# `accelerator.prepare` takes the model, the optimizer, the dataloader and the
# scheduler, and returns them *in the same order*, wrapped:
#
# - the model is moved to the device (and wrapped for data parallelism when several processes run);
# - the dataloader yields batches already on the device, and with several processes each gets its own shard of the data;
# - the optimizer and scheduler are wrapped so they step correctly in those set-ups (for example, skipping a step when mixed precision overflowed).

# %%
set_seed(0)
model = models.load_pretrained_classifier()
train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0)
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps
)

model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
for name, obj in [("model", model), ("optimizer", optimizer), ("train_dataloader", train_dataloader),
                  ("lr_scheduler", lr_scheduler)]:
    print(f"{name:>16}: {type(obj).__name__}")

# %% [markdown]
# ### The loop, without `.to(device)` and with `accelerator.backward`
#
# Two changes inside the loop:
#
# - the lines that moved `inputs` and `targets` to the device go: the prepared dataloader already did it;
# - `loss.backward()` becomes `accelerator.backward(loss)`, which also scales the
#   loss under mixed precision and averages the gradients across processes.
#
# Everything else — zero_grad, forward, loss, the optimizer and scheduler steps —
# stays exactly as you wrote it. That is the point: the loop is still yours.

# %%
model.train()
accelerate_losses = []
for epoch in range(NUM_EPOCHS):
    for batch in train_dataloader:
        optimizer.zero_grad()
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        targets = batch["labels"]
        outputs = model(**inputs, labels=targets)
        loss = outputs.loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        accelerate_losses.append(loss.item())

accelerate_scores = loops.evaluate(model, eval_dataloader)
print(f"validation accuracy {accelerate_scores['accuracy']:.3f}, F1 {accelerate_scores['f1']:.3f}")

# %% [markdown]
# ## 3. Side by side, and the same result
#
# The two loops also live in `course_utils.loops` as `train_plain` and
# `train_accelerate`, written as twins: every line that differs is marked, and a
# test of the course fails if they drift apart in any other way. Here they are
# side by side, the changed lines highlighted:

# %%
display(HTML(loops.loop_diff_html()))

# %% [markdown]
# Both loops above started from the same seed, the same checkpoint and the same
# order of batches, so on one process they should produce the same losses, step
# for step. The curves below lie on top of each other:

# %%
figure = plots.plot_loss_curves(
    {"plain PyTorch loop": plain_losses, "Accelerate loop": accelerate_losses},
    title="Fine-tuning the course DistilBERT on paraphrase pairs (1 CPU process)",
    smooth=5,
)

# %% tags=["nbval-check-output"]
largest_gap = max(abs(a - b) for a, b in zip(plain_losses, accelerate_losses))
print(f"{len(plain_losses)} steps each; the losses agree to within 1e-6: {largest_gap < 1e-6}")

# %% [markdown]
# ## 4. Trainer or Accelerator?
#
# The `Trainer` of `transformers` goes one step further than Accelerate: it *is*
# the loop. You give it the model, the datasets, the optimizer and schedule, and
# it runs zero_grad, forward, backward and the steps itself — plus evaluation,
# logging, checkpointing and mixed precision, all switched on by arguments.
#
# The Trainer draws the batches in its own order. With a model this small, that
# order decides when it leaves the plateau where it answers "paraphrase" to
# everything (the majority-class score above); two epochs can be too few, so we
# give it three, with the same optimizer and schedule shape.

# %%
TRAINER_EPOCHS = 3
trainer_training_steps = TRAINER_EPOCHS * len(train_dataloader)
set_seed(0)
model = models.load_pretrained_classifier()
optimizer = Adam(model.parameters(), lr=LEARNING_RATE)
lr_scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=int(0.1 * trainer_training_steps), num_training_steps=trainer_training_steps
)
tokenized = data.tokenize_dataset(dataset, data.load_tokenizer())
trainer_history = loops.train_with_trainer(
    model, optimizer, lr_scheduler, tokenized["train"], tokenized["validation"], data.load_tokenizer(),
    num_epochs=TRAINER_EPOCHS, batch_size=BATCH_SIZE,
)
print(f"Trainer: validation accuracy {trainer_history[-1]['eval_accuracy']:.3f}, F1 {trainer_history[-1]['eval_f1']:.3f}")

# %% [markdown]
# What does each approach ask you to write, and what does it let you change? The
# figure below measures both on the code of `course_utils.loops`: the lines of
# training code you own, and how many of the six parts of a training step
# (zero_grad, forward, loss, backward, optimizer step, scheduler step) appear in
# that code, where you can change them. The Trainer's lines are settings, not
# steps: its loop is written for you, and you change it only where it has an argument.

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
# for that; a custom loop with Accelerate does, and it stays portable. Here is a
# tiny GAN that learns to produce numbers distributed like the real data (a
# normal distribution centred on 3):

# %%
set_seed(0)
generator = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
critic = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
generator_optimizer = Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
critic_optimizer = Adam(critic.parameters(), lr=2e-3, betas=(0.5, 0.999))
real_samples = 3.0 + 0.5 * torch.randn(2048, 1)
real_dataloader = torch.utils.data.DataLoader(real_samples, batch_size=128, shuffle=True)
generator, critic, generator_optimizer, critic_optimizer, real_dataloader = accelerator.prepare(
    generator, critic, generator_optimizer, critic_optimizer, real_dataloader
)
bce = torch.nn.BCEWithLogitsLoss()

for epoch in range(15):
    for real_batch in real_dataloader:
        fake_batch = generator(torch.randn(len(real_batch), 4, device=accelerator.device))
        # 1. the critic learns to score real samples 1 and generated ones 0
        critic_optimizer.zero_grad()
        critic_loss = (bce(critic(real_batch), torch.ones_like(real_batch))
                       + bce(critic(fake_batch.detach()), torch.zeros_like(real_batch)))
        accelerator.backward(critic_loss)
        critic_optimizer.step()
        # 2. the generator learns to make the critic answer 1 on its samples
        generator_optimizer.zero_grad()
        generator_loss = bce(critic(fake_batch), torch.ones_like(real_batch))
        accelerator.backward(generator_loss)
        generator_optimizer.step()

with torch.no_grad():
    generated = generator(torch.randn(4096, 4, device=accelerator.device))
print(f"real data: mean {real_samples.mean():.2f}, std {real_samples.std():.2f}; "
      f"generated: mean {generated.mean():.2f}, std {generated.std():.2f}")

# %% [markdown]
# ## Summary
#
# | before Accelerate | with Accelerate |
# | --- | --- |
# | you move every batch with `.to(device)` | `accelerator.prepare(dataloader)` yields batches on the device |
# | you move the model with `model.to(device)` | `accelerator.prepare(model)` places (and, on several processes, wraps) it |
# | `loss.backward()` | `accelerator.backward(loss)` also averages gradients across processes |
# | the script runs on the device you wrote in it | the same script runs on CPU, one GPU, many GPUs or machines |
#
# The loop stays yours: you can train two networks, change the order of the
# steps, or add anything the Trainer has no argument for. Lesson 4 launches this
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
# The cell below builds a fresh model, optimizer, dataloader and scheduler. Pass
# them through `accelerator.prepare` so that Accelerate manages all four, keeping
# the same variable names.

# %%
model, optimizer, train_dataloader, lr_scheduler = ex.fresh_training_objects()
# BEGIN SOLUTION
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, lr_scheduler
)
# END SOLUTION
# BEGIN STARTER
# model, optimizer, train_dataloader, lr_scheduler = ____, ____, ____, ____  # one call replaces all four
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
