# %% [markdown]
# # Lesson 6 — Data parallelism: the same loop on several processes
#
# Lesson 1 promised that the Accelerate loop scales from one device to many
# without changing. This lesson keeps that promise on a laptop: one training
# function, shaped like Accelerate's own examples, runs on **two CPU processes**
# that talk through `torch.distributed` (the *gloo* backend), first from this
# notebook, then from the command line. The same code runs unchanged on eight
# GPUs or on several machines; only the launch command changes.
#
# In this lesson you will
#
# 1. see what data parallelism does, who averages the gradients, and which
#    examples each process gets,
# 2. launch a training that learns on two processes from the notebook, and meet
#    the mistake that makes every process silently train alone,
# 3. check, number for number, that two processes with batches of *b* train the
#    same model as one process with batches of *2b*, and see what Adam's `eps`
#    does to the parameters that only rounding noise moves,
# 4. gather evaluation metrics from every process, and see the number you get without,
# 5. count the effective batch, see what changes when a script moves from 1 to N devices, and
#    measure why its learning rate must be retuned,
# 6. accumulate gradients across processes without an all-reduce per micro-batch (`no_sync`),
# 7. run the same training from the command line, and time one process against two,
# 8. see what happens when a launch goes wrong, then practise with three exercises.
#
# Everything runs on a laptop CPU, without internet and without a GPU.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")`; the data line is
# `load_dataset("glue", "mrpc")`, as lesson 1 shows. The learning rate changes
# too: the tiny model trains at 1e-3 to 3e-3, while `distilbert-base-cased` wants
# about 2e-5 to 5e-5 (the slides use 2e-5; 1e-3 would wreck its pre-trained weights).

# %%
from course_utils.threads import use_course_threads

use_course_threads()

import inspect
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration, notebook_launcher  # the workers create the Accelerators
from IPython.display import Markdown, display
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from course_utils import accelerate_state, command_line, data, launcher, models, parallel, plots, schedules, train
from course_utils.exercises import ____
from course_utils.exercises import lesson6 as ex

# Several processes will load the model: no library progress bars, theirs would interleave.
launcher.silence_library_progress_bars()
# Tokenized and loaded once, here: the workers of every launch below are forked copies of
# this process and find the tokenized data and the model's code already in memory.
data.make_dataloaders(batch_size=16, seed=0)
models.load_pretrained_classifier()
print(f"this machine has {os.cpu_count()} CPU cores")

# %% [markdown]
# ## 1. What data parallelism does
#
# With *N* processes, each one holds a **full copy of the model**. At every step:
#
# 1. each process takes its own **shard** of the data: different examples;
# 2. it runs the forward pass and the backward pass on its shard, which gives
#    gradients $g_i$ of its own mean loss;
# 3. **during that backward pass**, the gradients are averaged across processes
#    (an *all-reduce*): every process receives the same $g = \frac{1}{N}\sum_{i=1}^{N} g_i$;
# 4. every process takes the same optimizer step with $g$, so the copies stay identical.
#
# When the shards have the same size $b$, the average of the per-shard mean gradients
# is the gradient of the mean loss over all $N b$ examples:
#
# $$\frac{1}{N}\sum_{i=1}^{N} \nabla \frac{1}{b}\sum_{x \in \text{shard}_i} \ell(x)
#   \;=\; \nabla \frac{1}{N b} \sum_{x \in \text{all shards}} \ell(x).$$
#
# So *N* processes with batches of $b$ take the step that one process would take
# with a batch of $N b$, while each computes only $b$ examples' worth of work.

# %%
plots.plot_data_parallel_flow(num_processes=2);

# %% [markdown]
# ### Who averages the gradients?
#
# Not `accelerator.backward`. On several processes, `accelerator.prepare(model)`
# wraps the model in torch's `DistributedDataParallel` (DDP). The wrapper puts a
# hook on every parameter; during **any** backward pass through the wrapped
# model, the hooks all-reduce the gradients, bucket by bucket, while the rest of
# the backward pass is still running. The course's slides say "Sincronizza i
# gradienti con accelerator.backward(loss)": this lesson corrects that.
#
# The run below proves it. Each of two processes computes the gradients of one
# batch of its own shard with a **plain `loss.backward()`**, once through the
# prepared model and once through a model that was not prepared, and returns a
# checksum of its gradients (the sum of all their elements).

# %%
def gradients_after_plain_backward():
    accelerator = Accelerator(cpu=True)
    train_dataloader, _ = data.make_dataloaders(batch_size=8, seed=0, limit=64)
    train_dataloader = accelerator.prepare(train_dataloader)
    batch = next(iter(train_dataloader))  # this process's own examples
    checksums = {}
    for prepared in (True, False):
        torch.manual_seed(0)
        model = parallel.without_dropout(models.load_pretrained_classifier())
        if prepared:
            model = accelerator.prepare(model)
        loss = model(**batch).loss
        loss.backward()  # plain PyTorch, not accelerator.backward
        checksums[prepared] = parallel.gradient_checksum(model)
    return type(model).__name__, checksums


backward_results = parallel.launch(gradients_after_plain_backward, num_processes=2)
for rank, (_, checksums) in enumerate(backward_results):
    print(f"process {rank}: gradient checksum {checksums[True]:+.9f} through the prepared model, "
          f"{checksums[False]:+.9f} through the unprepared one")

# %% tags=["nbval-check-output"]
prepared_agree = backward_results[0][1][True] == backward_results[1][1][True]
unprepared_agree = backward_results[0][1][False] == backward_results[1][1][False]
print(f"the two processes agree: {prepared_agree} through the prepared model, {unprepared_agree} without it")

# %% [markdown]
# Through the prepared model the two processes end with the same gradients, the
# average of their own two, although each called only `loss.backward()`; through
# the bare model each keeps the gradients of its own examples. The all-reduce
# belongs to the wrapper.
#
# `accelerator.backward(loss)` is still the line to write. In accelerate 1.15 it
# divides the loss by the number of gradient-accumulation steps (section 6 shows
# it), scales the loss under fp16 mixed precision (a `GradScaler`, so that small
# gradients do not underflow), and hands the backward pass to DeepSpeed or
# Megatron-LM when they run the training. A script that writes
# `accelerator.backward(loss)` keeps working when any of these is switched on. One
# that writes `loss.backward()` under gradient accumulation sums *k* undivided
# losses, so its gradient is *k* times too large. What that does depends on the
# optimizer: AdamW divides each gradient by its own running magnitude, so a
# constant factor cancels (lesson 2, [02_adamw_ema_states](02_adamw_ema_states.ipynb),
# shows why every weight moves by about `lr`) and the step barely changes; SGD's
# step is *k* times too large. The *k*-fold gradient also moves everything that
# reads its size: a clipping threshold (`max_norm`) clips *k* times more, the
# logged loss is *k* times too high, and under fp16 the gradients overflow
# sooner. Section 6 measures both optimizers.
#
# ### Which examples each process gets
#
# A prepared dataloader gives process *i* the batches *i*, *i + N*, *i + 2N*, …
# of the original dataloader: whole batches, taken in turn. Written from scratch,
# with batch numbers:

# %% tags=["nbval-check-output"]
def batch_numbers_of_each_process(num_batches, num_processes):
    return [list(range(rank, num_batches, num_processes)) for rank in range(num_processes)]


batch_numbers_of_each_process(num_batches=5, num_processes=2)

# %% [markdown]
# Accelerate does the same with its `BatchSamplerShard`, with one twist.
# `parallel.shards_of_each_process` asks it which *examples* each process trains on
# for 10 examples in batches of 2 (that is 5 batches) on 2 processes:

# %% tags=["nbval-check-output"]
shards = parallel.shards_of_each_process(num_examples=10, batch_size=2, num_processes=2)
for rank, shard in enumerate(shards):
    print(f"process {rank}: {shard}")

# %%
plots.plot_shards(shards);

# %% [markdown]
# The twist is the last step. The 5 batches do not split evenly, so Accelerate
# completes the last round with the first examples again: every process takes the
# same number of steps, and none waits forever at the gradient average for a
# partner that has finished. With a dataset that divides evenly nothing is repeated.
#
# ### `split_batches`: a keyword that does nothing
#
# Accelerate can also shard differently: cut *each* batch into *N* pieces, so
# that the batch size you choose is the total over all processes. Older tutorials
# write `Accelerator(split_batches=True)`. In accelerate 1.15 that keyword is a
# leftover that is never read: the setting lives in a `DataLoaderConfiguration`.
# Two workers, each with both Accelerators, prepare a dataloader of 8 numbers in
# batches of 4 and say what they got:

# %% tags=["nbval-check-output"]
def batches_with_split_batches():
    ignored = Accelerator(cpu=True, split_batches=True)
    configured = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    return {
        name: (accelerator.split_batches, [batch.tolist() for batch in accelerator.prepare(DataLoader(list(range(8)), batch_size=4))])
        for name, accelerator in (("Accelerator(split_batches=True)", ignored),
                                  ("dataloader_config=DataLoaderConfiguration(split_batches=True)", configured))
    }


split_results = parallel.launch(batches_with_split_batches, num_processes=2, quiet=True)
for name in split_results[0]:
    print(f"{name}: .split_batches is {split_results[0][name][0]}")
    for rank, result in enumerate(split_results):
        print(f"  process {rank} takes {result[name][1]}")

# %% [markdown]
# With the keyword, `.split_batches` stays `False` and each process takes whole
# batches of 4 in turn, without a warning. With the configuration, each batch of 4
# is cut in two. Accelerate's sampler, asked directly, agrees:

# %% tags=["nbval-check-output"]
for rank, shard in enumerate(parallel.shards_of_each_process(8, batch_size=4, num_processes=2, split_batches=True)):
    print(f"process {rank}: {shard}")

# %% [markdown]
# A keyword a library no longer reads fails silently: when a setting matters,
# read it back (`accelerator.split_batches`) or look at what the processes got.
#
# ## 2. Launching the training on two processes
#
# Every process runs the same function. The course's is
# `course_utils.train.training_function`, written like Accelerate's
# `examples/nlp_example.py`: an `Accelerator`, the seed, the data, the model, the
# optimizer and its schedule, `prepare`, the loop, the evaluation. Its last block,
# marked, is this lesson's evidence: each process describes what it saw in a
# `ProcessReport` (its rank, the size of its group, the number of batches of its
# shard, the loss of its last batch, a checksum of its gradients after the last
# backward pass), and `gather_reports` collects the reports of all processes.

# %%
display(Markdown(f"```python\n{inspect.getsource(train.training_function)}```"))

# %% [markdown]
# `accelerate.notebook_launcher(function, args, num_processes=2)` starts the
# processes from a notebook, as forked copies of the notebook's own process. Here
# it is, on a short run (`SHORT`: one pass over the first few dozen examples):

# %%
SHORT = dict(limit=64, num_epochs=1)  # shows the launch; far too short to learn
# use_port: the workers meet on port 29500 unless told otherwise, and another run may hold it.
notebook_launcher(train.training_function, (train.TrainConfig(cpu=True, **SHORT),), num_processes=2,
                  use_port=str(launcher.find_free_port()))

# %% [markdown]
# The first line is Accelerate's guess, printed before any worker looks: on a
# machine without a GPU there are no CUDA devices, and the two workers are CPU
# processes. Then the main process printed its accuracy (a run this short has not
# learned: the real run below does). Two things are missing for a lesson:
# `notebook_launcher` returns nothing, and it does not say how long the workers
# may take or what went wrong in one of them. The course's `parallel.launch` is a
# wrapper that does what `notebook_launcher` does (forked workers with the
# environment of one `torch.distributed` group) and brings back what each worker
# returned, so that this notebook prints the reports itself, once, in rank order.
# It also gives the workers a time limit, reports a worker's own exception, and
# stops every worker when you interrupt the cell (section 8).
#
# First, the mistake almost everyone makes on a machine without a GPU: a plain
# `Accelerator()`, here `TrainConfig(cpu=False)` (the short run again: it only has
# to show who is in the group).

# %%
silent = parallel.launch(train.training_function, args=(train.TrainConfig(cpu=False, **SHORT),), num_processes=2)
silent_reports = [result.report for result in silent]
print(parallel.format_reports(silent_reports))

# %% [markdown]
# Both workers ran, without any error, and both printed the accuracy line that
# only the main process prints: each believes it is the main process. Look at the *world size* column: each
# `Accelerator` sees a group of 1, in mode `NO`. Without a GPU, an Accelerator
# does not join the other processes unless it is allowed to run on the CPU, so
# each worker trained alone on *all* the batches. `diagnose_launch` reads the reports:

# %%
print(parallel.diagnose_launch(silent_reports, num_processes=2))

# %% [markdown]
# Now a real run with `Accelerator(cpu=True)`, which `TrainConfig(cpu=True)` asks
# for: the examples and epochs of `RUN`, batches of `BATCH_SIZE` on each
# process (the cell prints the counts), and dropout off (section 3 explains why).

# %%
RUN = dict(limit=2880, num_epochs=2, lr=1e-3, seed=0, dropout=False, cpu=True)
BATCH_SIZE = 16  # per process

train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0, limit=RUN["limit"])
print(f"{len(train_dataloader.dataset)} training examples in batches of {BATCH_SIZE}: {len(train_dataloader)} batches "
      f"per epoch, {parallel.batches_per_process(len(train_dataloader), 2)} for each of 2 processes")

# %% [markdown]
# %%
results = parallel.launch(train.training_function, args=(train.TrainConfig(batch_size=BATCH_SIZE, **RUN),), num_processes=2)
reports = [result.report for result in results]
print(parallel.format_reports(reports))
print()
print(parallel.diagnose_launch(reports, num_processes=2))
print(f"validation accuracy {results[0].accuracy:.4f}; always predicting the most frequent label scores "
      f"{results[0].baseline:.4f}")
print(f"learned: more than 0.05 above the baseline: {results[0].accuracy - results[0].baseline > 0.05}")

# %% [markdown]
# This is data parallelism, on a model that learned. The two processes form one
# group (`MULTI_CPU`), each trained on its own half of the batches, the losses of
# their last batches differ (different examples), yet their gradient checksums
# are equal: after each backward pass, both hold the average gradient. Their
# parameters are identical too:

# %% tags=["nbval-check-output"]
print(f"batches per epoch: {[r.num_batches for r in silent_reports]} alone ({SHORT['limit']} examples), "
      f"{[r.num_batches for r in reports]} in a group ({RUN['limit']} examples)")
print(f"largest difference between the two copies' parameters: "
      f"{parallel.max_parameter_difference(results[0].parameters, results[1].parameters)}")

# %% [markdown]
# ## 3. Two processes with batch *b* = one process with batch *2b*
#
# The equation of section 1 says that the two processes above, with batches of
# *b* = `BATCH_SIZE` each, took the steps that one process would take with batches
# of *2b*. Let us check it to the last digit, or nearly: the same function, on
# **one** process, with `batch_size=2 * BATCH_SIZE`.
# (`parallel.launch` runs even a single process in a child process, so that this
# notebook never holds an `Accelerator` of its own.)

# %%
one = parallel.launch(train.training_function, args=(train.TrainConfig(batch_size=2 * BATCH_SIZE, **RUN),), num_processes=1)
differences = parallel.parameter_differences(results[0].parameters, one[0].parameters)
print(f"2 processes x {BATCH_SIZE} against 1 process x {2 * BATCH_SIZE}, largest differences per parameter:")
for name, gap in sorted(differences.items(), key=lambda item: item[1], reverse=True)[:4]:
    print(f"  {gap:.1e}  {name}")

# %% [markdown]
# Nearly equal, but two parameters stand out: the biases of the attention
# *keys* (`k_lin.bias`), one per layer. Such a bias adds the same number to every
# score of a query, and softmax ignores a constant added to all its inputs: the
# loss does not depend on it, so its gradient is zero, up to rounding. One
# backward pass in this notebook shows it:

# %%
model = parallel.without_dropout(models.load_pretrained_classifier())
model(**next(iter(train_dataloader))).loss.backward()
for name, parameter in model.named_parameters():
    if ".0.attention." in name:
        print(f"largest gradient {parameter.grad.abs().max().item():.1e}  {name}")

# %% [markdown]
# Does Adam, which divides each gradient by its own running scale, turn that
# noise into steps of ordinary size? No: its `eps` sets a floor. The step is
# $\text{lr}\,\hat m / (\sqrt{\hat v} + \epsilon)$ with $\epsilon = 10^{-8}$ (lesson 2
# builds it). Where gradients are about $10^{-10}$, $\sqrt{\hat v}$ is far below
# $\epsilon$, the denominator is $\epsilon$, and Adam behaves like plain SGD with
# learning rate $\text{lr}/\epsilon$: a tiny step. Eight AdamW steps, read from the
# optimizer's own state after each one, in units of lr:

# %%
def adam_steps_in_units_of_lr(model, optimizer, names):
    """For each parameter in ``names``: the median |m_hat / (sqrt(v_hat) + eps)| and median sqrt(v_hat), after this step."""
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    eps = optimizer.param_groups[0]["eps"]
    found = {}
    for name, parameter in model.named_parameters():
        if name in names:
            state = optimizer.state[parameter]
            step = state["step"].item()
            m_hat = state["exp_avg"] / (1 - beta1**step)
            v_hat_root = (state["exp_avg_sq"] / (1 - beta2**step)).sqrt()
            found[name] = ((m_hat / (v_hat_root + eps)).abs().median().item(), v_hat_root.median().item())
    return found


torch.manual_seed(0)
model = parallel.without_dropout(models.load_pretrained_classifier())
optimizer = torch.optim.AdamW(model.parameters(), lr=RUN["lr"])
LAYER = "distilbert.transformer.layer.0.attention"
watched = [f"{LAYER}.k_lin.bias", f"{LAYER}.q_lin.bias"]
history = {name: [] for name in watched}
for step, batch in zip(range(8), train_dataloader):
    optimizer.zero_grad()
    model(**batch).loss.backward()
    optimizer.step()
    for name, measured in adam_steps_in_units_of_lr(model, optimizer, watched).items():
        history[name].append(measured)
for name, values in history.items():
    steps_in_lr = [step for step, _ in values]
    roots = [root for _, root in values]
    print(f"{name.removeprefix(LAYER + '.')}: sqrt(v_hat) {min(roots):.1e} to {max(roots):.1e} (eps = "
          f"{optimizer.param_groups[0]['eps']:.0e}); each step moves it by {min(steps_in_lr):.1e} to "
          f"{max(steps_in_lr):.1e} lr")

# %% [markdown]
# The query biases, which have real gradients, move by a good fraction of lr per
# step (up to lr itself); the key biases by a tiny fraction of lr (the numbers above). So Adam does not blow the noise up. What
# makes the two runs disagree on the key biases, and only there, is that their
# updates are pure noise: the two runs round differently, so the small steps point
# in directions that have nothing in common between the runs, step after step.
# Elsewhere, both runs follow the same real gradient and rounding only nudges it.
# (Lesson 2 introduced `eps` as a guard against dividing by zero; this is its
# other role, a floor below which Adam stops normalising.) Every other parameter agrees:

# %%
TOLERANCE = 1e-5
gap = parallel.max_parameter_difference(results[0].parameters, one[0].parameters, skip=parallel.NOISE_ONLY_PARAMETERS)
print(f"largest difference, all parameters but {parallel.NOISE_ONLY_PARAMETERS}: {gap:.1e}")
print(f"validation accuracy: {one[0].accuracy:.4f} on 1 process, {results[0].accuracy:.4f} on 2 "
      f"(majority-class baseline {one[0].baseline:.4f})")

# %% tags=["nbval-check-output"]
print(f"every other parameter within {TOLERANCE:.0e}: {gap <= TOLERANCE}")
print(f"the same accuracy on 1 and on 2 processes: {one[0].accuracy == results[0].accuracy}")

# %% [markdown]
# The loss of one process over its *2b* examples is the mean of the two processes'
# losses over their *b* each, step after step:

# %%
mean_of_two = [(a + b) / 2 for a, b in zip(results[0].losses, results[1].losses)]
print(f"{len(mean_of_two)} steps; largest gap between the losses: "
      f"{max(abs(a - b) for a, b in zip(mean_of_two, one[0].losses)):.1e}")
plots.plot_loss_curves(
    {f"1 process, batch {2 * BATCH_SIZE}": one[0].losses, f"mean of 2 processes, batch {BATCH_SIZE} each": mean_of_two},
    title="The same training on 1 and on 2 processes",
);

# %% [markdown]
# The differences left are rounding: the two runs add the same numbers in a
# different order (and pad their batches to different lengths). Four things had to be right for the comparison to be honest:
#
# - **Dropout off.** Dropout draws a random mask from each process's own random
#   generator; two processes cannot draw the masks one process would. With
#   dropout on, both runs are fine trainings, but different ones.
# - **The same examples at each step.** The dataloader shuffles with a seeded
#   generator, and Accelerate gives every process the same shuffled order to take
#   its batches from. Process 0 takes batch 0 of *b* examples and process 1 batch 1,
#   which are exactly the *2b* examples of batch 0 of the 1-process run:
#   the check below asks Accelerate's sampler.
# - **Equal shards.** The gradient average equals the gradient of the mean over
#   *2b* examples only when both shards hold *b*: the number of examples is a
#   multiple of *2b* (the check below says so), so no batch is short and nothing
#   is repeated.
# - **The same learning rate at each step.** The scheduler was built for the
#   number of batches *before* `prepare` (twice as many of size *b* as of size *2b*),
#   and a prepared scheduler steps once per process at every optimizer step.

# %% tags=["nbval-check-output"]
num_examples = RUN["limit"]
two_processes = parallel.shards_of_each_process(num_examples, BATCH_SIZE, num_processes=2)
one_process = parallel.shards_of_each_process(num_examples, 2 * BATCH_SIZE, num_processes=1)[0]
same_examples = all(
    sorted(two_processes[0][step] + two_processes[1][step]) == one_process[step] for step in range(len(one_process))
)
print(f"{num_examples} examples, a multiple of 2 x {BATCH_SIZE}: {num_examples % (2 * BATCH_SIZE) == 0}")
print(f"{len(one_process)} steps per epoch either way; same examples at every step: {same_examples}")

# %% [markdown]
# The learning rates, computed from scratch with the schedule of
# `training_function`: on two processes, a schedule over the batches of *b*
# stepped twice per step; on one, a schedule over the batches of *2b* stepped once.

# %%
def learning_rates(num_training_steps, steps_per_step, num_steps):
    """The learning rate of each optimizer step, for a scheduler stepped ``steps_per_step`` times per step."""
    optimizer = torch.optim.AdamW(torch.nn.Linear(1, 1).parameters(), lr=RUN["lr"])
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedules.linear_warmup_then_decay(int(0.1 * num_training_steps), num_training_steps)
    )
    rates = []
    for _ in range(num_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: changes nothing, but keeps the usual order of the two steps
        for _ in range(steps_per_step):
            lr_scheduler.step()
    return rates


steps = RUN["num_epochs"] * len(one_process)
two_rates = learning_rates(RUN["num_epochs"] * 2 * len(one_process), steps_per_step=2, num_steps=steps)
one_rates = learning_rates(RUN["num_epochs"] * len(one_process), steps_per_step=1, num_steps=steps)
print(f"{steps} optimizer steps; largest gap between the learning rates: "
      f"{max(abs(a - b) for a, b in zip(two_rates, one_rates)):.1e}")

# %% [markdown]
# One subtlety hides there: the warm-up lasts `int(0.1 * num_training_steps)`
# scheduler steps. Two processes agree with one only when that number, counted in
# batches of *b*, is twice the one counted in batches of *2b*; the run above was sized
# so that it is (a warm-up of an odd number of small batches would end half a step
# earlier on one side).
#
# ## 4. Metrics from every process
#
# At evaluation time each process scores its own shard of the validation set. The
# accuracy of one shard is not the accuracy of the model: the predictions of all
# processes must be collected first. `accelerator.gather(tensor)` concatenates a
# tensor from every process, on every process;
# `accelerator.gather_for_metrics(tensor)` does the same and also drops the
# examples Accelerate repeated to fill the last step, so each example counts once.
# `training_function` does it in its evaluation loop:

# %%
display(Markdown("```python\n" + "\n".join(
    line for line in inspect.getsource(train.training_function).splitlines()
    if "eval_dataloader)" in line or "gather_for_metrics" in line or "correct +=" in line or "total +=" in line
) + "\n```"))

# %% [markdown]
# Its evidence block also scores each process's shard *without* gathering, which
# is what a script that forgets to gather would print. Side by side, from the run
# of section 2:

# %%
for rank, result in enumerate(results):
    print(f"process {rank}: its own shard only {result.shard_accuracy:.4f}, gathered {result.accuracy:.4f}, "
          f"majority-class baseline {result.baseline:.4f}")

# %% tags=["nbval-check-output"]
print(f"the two shards' accuracies differ: {results[0].shard_accuracy != results[1].shard_accuracy}; "
      f"gathered, both processes report the same: {results[0].accuracy == results[1].accuracy}")

# %% [markdown]
# Without gathering, each process reports a different number, and neither is the
# model's accuracy; gathered, both report the accuracy of the whole split. To
# print something once, print it on the main process only: `accelerator.print(...)`,
# or `if accelerator.is_main_process: ...` (as `training_function` does).
#
# ## 5. The effective batch, and moving from 1 to N devices
#
# The batch that one optimizer step averages over is the **effective batch**:
#
# $$\text{effective batch} = \text{per-process batch} \times \text{processes} \times \text{accumulation steps}.$$
#
# A script's `batch_size` is per process. Moved from 1 device to *N* with that
# number unchanged, the script trains with an *N* times larger batch and takes
# *N* times fewer steps per epoch. With the lesson's dataloader of batches of `BATCH_SIZE`:

# %%
batches = len(train_dataloader)
for devices in (1, 2, 8):
    print(f"{devices} device{'s' if devices > 1 else ' '}: effective batch {BATCH_SIZE * devices:>3}, "
          f"{parallel.batches_per_process(batches, devices):>3} optimizer steps per epoch")
print(f"the run of section 2: {len(results[0].losses) // RUN['num_epochs']} steps per epoch on each process, "
      f"effective batch {BATCH_SIZE * results[0].report.num_processes}")

# %% [markdown]
# The learning rate and the warm-up were tuned for the old batch and number of
# steps, so they usually need retuning. A short experiment shows it, on a problem
# small enough to train many times: a two-layer network learns to classify random
# inputs that a fixed random network labelled (`parallel.train_small_classifier`),
# with AdamW, for the same 3 epochs, with batches of 16 (one device) and of 128
# (the same script on eight devices), at three learning rates, from 4 seeds each.

# %%
SWEEP_BATCHES, SWEEP_RATES, SWEEP_SEEDS = [16, 128], [1e-3, 3e-3, 1e-2], [0, 1, 2, 3]
with tqdm(total=len(SWEEP_BATCHES) * len(SWEEP_RATES) * len(SWEEP_SEEDS), desc="training runs") as bar:
    sweep = parallel.learning_rate_sweep(SWEEP_BATCHES, SWEEP_RATES, SWEEP_SEEDS, progress=bar.update)
plots.plot_learning_rate_sweep(sweep, title="Validation loss after 3 epochs, 4 seeds per point");

# %%
small, large = SWEEP_BATCHES
median_loss = {key: statistics.median(values) for key, values in sweep.items()}
best_rate = {batch: min(SWEEP_RATES, key=lambda lr: median_loss[batch, lr]) for batch in SWEEP_BATCHES}
kept_rate = best_rate[small]
gap = median_loss[large, kept_rate] - median_loss[large, best_rate[large]]
# The runs of the two learning rates compared do not overlap: their gap is more than seed noise.
apart = min(sweep[large, kept_rate]) > max(sweep[large, best_rate[large]])
display(Markdown(
    f"With batches of {small}, the best of the three learning rates is {best_rate[small]:g} (median validation loss "
    f"{median_loss[small, best_rate[small]]:.3f}). Kept at {kept_rate:g}, batches of {large} end at "
    f"{median_loss[large, kept_rate]:.3f} (seeds from {min(sweep[large, kept_rate]):.3f} to "
    f"{max(sweep[large, kept_rate]):.3f}); retuned, their best rate is {best_rate[large]:g}, at "
    f"{median_loss[large, best_rate[large]]:.3f} (from {min(sweep[large, best_rate[large]]):.3f} to "
    f"{max(sweep[large, best_rate[large]]):.3f}). "
    + (f"The larger batch needed its learning rate retuned: {gap:.3f} nats per example lost without, and every "
       "seed of one rate ends apart from every seed of the other, so it is not seed noise."
       if best_rate[large] != kept_rate and apart else
       "Here one learning rate served both batches, or the gap stays within what the seeds alone do: this run "
       "does not show that the larger batch needs another learning rate.")
))

# %% [markdown]
# Two common starting points for the retuning, heuristics rather than laws: scale
# the learning rate linearly with the batch (with a warm-up; common for SGD on
# large image batches), or with its square root (often closer for Adam; here
# √8 ≈ 2.8). The warm-up is best thought of as a fraction of the training
# (here 10% of the schedule), which `training_function` gets right by counting
# the schedule in batches before `prepare`. Section 3 kept the effective batch
# fixed at *2b* on purpose: that is why one process and two trained the same model.
#
# ## 6. Accumulating gradients across processes: `no_sync`
#
# Gradient accumulation sums the gradients of *k* micro-batches before one
# optimizer step (lesson 5): `Accelerator(gradient_accumulation_steps=k)` and
# `with accelerator.accumulate(model):` around the step. On several processes, an
# all-reduce after every micro-batch would be wasted work: only the sum before
# the step matters. `accumulate` skips it: on the micro-batches that do not step,
# it runs everything inside it, the forward pass *and* the backward pass, under
# `accelerator.no_sync(model)`, DDP's switch that keeps the gradients local. Both
# passes must be inside: DDP reads the switch in the *forward* pass, where it
# prepares the backward's all-reduce, so a `no_sync` around the backward alone
# still all-reduces. The run below counts that too.
#
# The run below counts the all-reduces: `parallel.AllReduceCounter` registers a
# DDP communication hook that does DDP's usual all-reduce and counts it (one call
# per bucket of gradients). Each of 2 processes takes micro-batches of
# `MICRO_BATCH` examples with *k* = `ACCUMULATION_STEPS`, once with `accumulate`
# and once accumulating by hand without `no_sync`.

# %%
ACCUMULATION_STEPS = 4
MICRO_BATCH = 8  # per process


def count_allreduces():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION_STEPS)
    train_dataloader, _ = data.make_dataloaders(batch_size=MICRO_BATCH, seed=0, limit=128)
    counts = {}
    for way in ("with accelerator.accumulate", "by hand, without no_sync"):
        torch.manual_seed(0)
        model = models.load_pretrained_classifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer, dataloader = accelerator.prepare(model, optimizer, train_dataloader)
        counter = parallel.AllReduceCounter(model)
        optimizer_steps = 0
        for step, batch in enumerate(dataloader):
            if way == "with accelerator.accumulate":
                with accelerator.accumulate(model):
                    accelerator.backward(model(**batch).loss)
                    optimizer.step()  # the prepared optimizer steps only on every k-th micro-batch
                    optimizer.zero_grad()
                    optimizer_steps += accelerator.sync_gradients
            else:
                accelerator.backward(model(**batch).loss)
                if (step + 1) % ACCUMULATION_STEPS == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    optimizer_steps += 1
        counts[way] = (step + 1, optimizer_steps, counter.calls)
    # What accelerator.backward does to the loss: the same batch, two backward passes, no all-reduce.
    with accelerator.no_sync(model):
        optimizer.zero_grad()
        accelerator.backward(model(**batch).loss)
        divided = parallel.gradient_checksum(model)
        optimizer.zero_grad()
        model(**batch).loss.backward()
        plain = parallel.gradient_checksum(model)
    # Where no_sync must be: around the forward and the backward, or around the backward alone.
    placements = {}
    for placement in ("forward and backward", "backward only"):
        before = counter.calls
        if placement == "forward and backward":
            with accelerator.no_sync(model):
                model(**batch).loss.backward()
        else:
            loss = model(**batch).loss
            with accelerator.no_sync(model):
                loss.backward()
        placements[placement] = counter.calls - before
    optimizer.zero_grad()
    return counts, divided / plain, placements


# %% tags=["nbval-check-output"]
allreduce_results = parallel.launch(count_allreduces, num_processes=2, quiet=True)
for way, (micro_batches, optimizer_steps, calls) in allreduce_results[0][0].items():
    print(f"{way}: {micro_batches} micro-batches, {optimizer_steps} optimizer steps, {calls} all-reduces "
          f"= {calls / optimizer_steps:g} per optimizer step")
print(f"accelerator.backward gave {allreduce_results[0][1]:.4f} x the gradients of loss.backward "
      f"(gradient_accumulation_steps = {ACCUMULATION_STEPS})")
for placement, calls in allreduce_results[0][2].items():
    print(f"no_sync around the {placement}: {calls} all-reduce{'s' if calls != 1 else ''} for one micro-batch")
print(f"effective batch: {MICRO_BATCH} per process x {len(allreduce_results)} processes x {ACCUMULATION_STEPS} "
      f"micro-batches = {MICRO_BATCH * len(allreduce_results) * ACCUMULATION_STEPS} examples per optimizer step")

# %% [markdown]
# With `accumulate`, one all-reduce per optimizer step (the tiny model's gradients
# fit in one bucket); by hand, one per micro-batch, *k* times the communication
# for the same result. `no_sync` around the backward alone saved nothing: the
# forward pass, outside it, had already prepared the all-reduce. And
# `accelerator.backward` divided the loss by *k*, so that the *k* summed gradients
# are their mean. The effective batch is the last line: the per-process
# micro-batch times the processes times the accumulation steps.
#
# What if the loss is not divided (a plain `loss.backward()` under accumulation)?
# Section 1 said it depends on the optimizer. The tiny model, dropout off, from
# the same seed, `ACCUMULATION_STEPS` micro-batches per optimizer step, trained
# twice with each optimizer, the loss divided by *k* and not; the cell compares
# how far the parameters moved (one process: nothing here depends on the group):

# %% tags=["nbval-check-output"]
accumulation_batches = list(data.make_dataloader("train", batch_size=MICRO_BATCH, seed=0, limit=2 * ACCUMULATION_STEPS * MICRO_BATCH))
for name, optimizer_class, lr in (("AdamW", torch.optim.AdamW, 1e-3), ("SGD", torch.optim.SGD, 1e-2)):
    divided_update, undivided_update = (
        parallel.update_after_accumulation(optimizer_class, lr, accumulation_batches, ACCUMULATION_STEPS, divide)
        for divide in (True, False)
    )
    change = (undivided_update - divided_update).norm() / divided_update.norm()
    print(f"{name:>5}, {len(accumulation_batches) // ACCUMULATION_STEPS} optimizer steps: the undivided loss moves the "
          f"parameters {undivided_update.norm() / divided_update.norm():.3f} x as far, a change of {change:.2%} "
          "of the update")

# %% [markdown]
# AdamW's step hardly notices the factor *k* (what remains comes from `eps`,
# which does not scale); SGD's step is about *k* times as large, a different
# training. With AdamW the missing division still shows in the logged loss and
# in any clipping threshold, and with fp16 in the loss scale.
#
# ## 7. The same training from the command line
#
# `course_utils/train.py` is a script around the same function: its `main()`
# parses the options, checks that the process is not alone when it was launched
# as one of several, calls `training_function`, and prints the reports once with
# `accelerator.print`. Its options:

# %%
train.build_parser().print_help()

# %% [markdown]
# To start several processes, `accelerate launch` uses torch's multi-process
# launcher (the one behind `torchrun`), which Accelerate selects with
# `--multi_gpu`, even on a machine without GPUs; the script's own `--cpu` then
# creates `Accelerator(cpu=True)`. Two traps to know:
#
# - `accelerate launch --cpu --num_processes 2` starts **one** process: Accelerate's
#   CPU launcher expects MPI (`mpirun`) to start the others. The course script
#   notices (the launcher set a meeting address for several processes but no
#   `WORLD_SIZE`) and stops with the command that starts two.
# - Without a configuration file (`accelerate config`), `accelerate launch` prints
#   a warning about the defaults it uses; passing them (`--num_machines 1
#   --mixed_precision no --dynamo_backend no`) silences it.
#
# `command_line.run_command` runs a command as a terminal opened in the repository
# would, with this notebook's Python environment (interrupted, it stops the
# command and every process it started). A short run on two processes (one pass
# over the first few dozen examples: it shows the launch, and is far too short to learn):

# %%
# The processes meet on port 29500 unless told otherwise; a free one cannot clash with another run.
ACCELERATE_LAUNCH = (
    "accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no "
    f"--main_process_port {launcher.find_free_port()}"
)
command_line.run_command(f"{ACCELERATE_LAUNCH} -m course_utils.train --cpu --limit 64 --epochs 1 --batch-size 8");

# %% [markdown]
# The two processes printed nothing of their own: the main process printed every
# line once. To run on more hardware, only the launch changes:
#
# | where | command |
# | --- | --- |
# | this laptop, 2 CPU processes | `accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no -m course_utils.train --cpu` |
# | the same, with torch's launcher | `OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 -m course_utils.train --cpu` (without `OMP_NUM_THREADS`, torchrun sets it to 1 and says so) |
# | one machine with 8 GPUs | `accelerate launch --multi_gpu --num_processes 8 -m course_utils.train` (no `--cpu`) |
# | two machines with 8 GPUs each | on each: `accelerate launch --multi_gpu --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 --num_processes 16 -m course_utils.train` (`--machine_rank 1` on the second; the address is machine 0's; `--num_processes` counts the processes of all machines) |
#
# `accelerate config` asks these questions once and saves the answers, so that
# `accelerate launch -m course_utils.train` is enough afterwards. Remember
# section 5: with `--batch-size` unchanged, 8 GPUs train with 8 times the batch.
#
# ### Is it faster?
#
# The runs of sections 2 and 3 timed their training loops (model loading and
# process start-up excluded): the same optimizer steps, one thread per process,
# on one process and on two.

# %%
train_seconds = {"1 process": one[0].train_seconds, "2 processes": results[0].train_seconds}
steps = len(one[0].losses)
print(f"1 process / 2 processes: {train_seconds['1 process'] / train_seconds['2 processes']:.2f} "
      f"(above 1: two processes are faster)")
gradient_bytes = sum(tensor.numel() for tensor in results[0].parameters.values()) * 4  # fp32
for name, seconds in train_seconds.items():
    print(f"{name}: {1000 * seconds / steps:.1f} ms per optimizer step")
print(f"gradients averaged at every step: {gradient_bytes / 1024**2:.2f} MiB from each process")
plots.plot_wall_times(
    {f"{name} x batch {2 * BATCH_SIZE if name == '1 process' else BATCH_SIZE}": [seconds]
     for name, seconds in train_seconds.items()},
    title="The same training on 1 and 2 CPU processes\n(one thread each, one run each)",
);

# %% [markdown]
# Two processes have twice the cores for the same arithmetic, so the ideal ratio
# is 2. What they add is communication: at every step, each process sends its
# gradients and waits for the other's, whatever the size of the batch; on a
# laptop whose cores other programs share, each also waits for the slower of the
# two. One run each is one measurement, not a finding: `benchmarks/bench_parallel.py`
# compares the setups properly (one process with PyTorch's default threads, one
# process with one thread, two processes with one thread each; 3 runs each, in
# rotating order, medians). Data parallelism pays off when a step's computation
# dwarfs its communication, and when each process brings hardware of its own, a
# GPU or a machine, with fast links between them. The point of this lesson is
# that the code does not change.
#
# ## 8. When a launch goes wrong
#
# `parallel.launch` checks three traps before it starts any worker, and says what
# to do about each:
#
# - **More processes than CPU cores.** They would take turns on the cores and every
#   step would wait for the slowest.
# - **A busy port.** The processes meet on a TCP port (29500 by default in
#   torch); an earlier run that is still alive may hold it. `port=None` lets the
#   operating system pick a free one (on the command line:
#   `--main_process_port`, as in section 7).
# - **CUDA already used in the notebook** (on a GPU machine): forked workers cannot use it.
#
# A busy port, for instance:

# %%
with socket.socket() as squatter:
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    busy_port = squatter.getsockname()[1]
    try:
        parallel.launch(train.training_function, args=(train.TrainConfig(cpu=True),), port=busy_port)
    except parallel.LaunchError as error:
        print(error)

# %%
try:
    parallel.launch(train.training_function, args=(train.TrainConfig(cpu=True),), num_processes=os.cpu_count() + 1)
except parallel.LaunchError as error:
    print(error)

# %% [markdown]
# Once the workers run, three more things can happen. A worker raises: the
# launch stops the others (which would wait forever for it at the next
# all-reduce) and raises a `parallel.WorkerError` that names the exception and
# the line of your code, not the launcher's:

# %%
def shard_mean(values):
    accelerator = Accelerator(cpu=True)
    shard = values[accelerator.process_index :: accelerator.num_processes]
    return sum(shard) / len(shard)


try:
    parallel.launch(shard_mean, args=([1.0],), num_processes=2, quiet=True)  # the second shard is empty
except parallel.WorkerError as error:
    print(error)

# %% [markdown]
# A worker takes too long (an endless loop, or a partner that never arrives at a
# collective): with `timeout=` seconds, the launch stops every worker and raises
# `parallel.WorkerTimeout`:

# %%
def wait_for_a_partner_that_never_comes():
    accelerator = Accelerator(cpu=True)
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()  # process 1 never gets here
    else:
        time.sleep(3600)


try:
    parallel.launch(wait_for_a_partner_that_never_comes, num_processes=2, quiet=True, timeout=2)
except parallel.WorkerTimeout as error:
    print(error)

# %% [markdown]
# And you interrupt the cell (the ■ button, or *Kernel > Interrupt*): the launch
# stops every worker it started and says so in one line
# (`KeyboardInterrupt: interrupted: the 2 worker processes of this launch were stopped`);
# `command_line.run_command` does the same for a command and all the processes it started.
#
# ### An `Accelerator` in the notebook
#
# Accelerate keeps its state in class-level singletons of the process. An
# `Accelerator` created in the notebook itself (say, by calling your exercise
# function to try it) stays there, and `notebook_launcher` then refuses to start:
# the forked workers would inherit it. `parallel.launch` starts each worker from a
# clean Accelerate state, so it keeps working. The cell below shows both, then
# undoes the notebook's Accelerator with `accelerate_state.reset_accelerate_state()`, so
# that the cells above run again as before.

# %%
accelerator_in_the_notebook = Accelerator(cpu=True)
try:
    notebook_launcher(train.training_function, (train.TrainConfig(cpu=True),), num_processes=2)
except ValueError as error:
    print(f"notebook_launcher: {error}")
group_sizes = parallel.launch(lambda: Accelerator(cpu=True).num_processes, num_processes=2, quiet=True)
print(f"parallel.launch: each worker's Accelerator sees a group of {group_sizes}")
del accelerator_in_the_notebook
accelerate_state.reset_accelerate_state()

# %% [markdown]
# ## Exercises
#
# `ex.qN.check()` checks your answer, `ex.qN.hint()` gives a hint (call it again
# for the next one), `ex.qN.solution()` shows the solution. Exercises 2 and 3
# launch your code on two processes.
#
# ### Exercise 1: batches per process
#
# Write `batches_per_process(num_batches, num_processes)`: how many batches does
# each of `num_processes` processes take from a dataloader of `num_batches`
# batches, with Accelerate's defaults? (`import math` is done for you.)

# %%
import math


def batches_per_process(num_batches, num_processes):
    # BEGIN SOLUTION
    return math.ceil(num_batches / num_processes)
    # END SOLUTION
    # BEGIN STARTER
    # return ____
    # END STARTER


ex.q1.check()

# %%
# ex.q1.hint()
# ex.q1.solution()

# %% [markdown]
# ### Exercise 2: a worker that trains alone
#
# Launched on two processes, `count_my_batches` reports that each of its workers
# is alone and takes all 10 batches of its dataloader: its Accelerator was
# created as `Accelerator()`. Fix that line so that the two workers form a group
# and share the batches. The check launches your function on two processes.

# %%
def count_my_batches():
    # BEGIN SOLUTION
    accelerator = Accelerator(cpu=True)
    # END SOLUTION
    # BEGIN STARTER
    # accelerator = Accelerator(____)  # was Accelerator(): each worker trained alone
    # END STARTER
    dataloader = accelerator.prepare(DataLoader(list(range(40)), batch_size=4))
    return ex.describe_accelerator(accelerator, dataloader)


ex.q2.check()

# %%
# ex.q2.hint()
# ex.q2.solution()

# %% [markdown]
# ### Exercise 3: an accuracy over every process
#
# Each batch of `dataloader` holds `predictions` and `labels` (tensors of 0s and
# 1s) of *this process's* shard of a small validation set. Complete the line so
# that the function returns the accuracy over the whole set, each example counted
# once, the same value on every process. The check runs it on two processes.

# %%
def accuracy_over_all_processes(accelerator, dataloader):
    correct, total = 0, 0
    for batch in dataloader:
        # BEGIN SOLUTION
        predictions, labels = accelerator.gather_for_metrics((batch["predictions"], batch["labels"]))
        # END SOLUTION
        # BEGIN STARTER
        # predictions, labels = ____
        # END STARTER
        correct += (predictions == labels).sum().item()
        total += labels.numel()
    return correct / total


ex.q3.check()

# %%
# ex.q3.hint()
# ex.q3.solution()

# %% [markdown]
# ## Summary
#
# - Data parallelism: a full model copy per process, a shard of the data each,
#   gradients averaged during the backward pass by the `DistributedDataParallel`
#   wrapper that `prepare(model)` installs (a plain `loss.backward()` synchronises
#   too), the same step everywhere. Write `accelerator.backward(loss)` anyway: it
#   divides the loss for gradient accumulation, scales it under fp16, and hands
#   over to DeepSpeed or Megatron-LM.
# - `notebook_launcher(training_function, args, num_processes=2)` starts the
#   processes from a notebook (`parallel.launch` is the course's wrapper that also
#   brings the results back); without a GPU, the `Accelerator` inside must be
#   created with `cpu=True`, or each process silently trains alone. Ask each
#   process for its `num_processes` and `distributed_type` to be sure.
# - Sharding is set with `DataLoaderConfiguration(split_batches=...)`; the
#   `Accelerator(split_batches=True)` keyword is ignored in accelerate 1.15.
# - *N* processes with batches of *b* take the steps of one process with batches of
#   *N b*, to rounding, when dropout is off, the shards are equal, the shuffle is seeded
#   and the scheduler is counted in batches before `prepare`. Parameters whose
#   gradient is only rounding noise (the attention key biases) differ between two
#   such runs: Adam's `eps` keeps their steps tiny, but the steps are noise.
# - Gather predictions with `gather_for_metrics` before computing a metric (each
#   shard alone gives its own, wrong, number); print on the main process only.
# - Effective batch = per-process batch x processes x accumulation steps: moving
#   from 1 device to *N* multiplies it by *N* and divides the steps per epoch by
#   *N*; retune the learning rate and warm-up (linear or square-root scaling are
#   heuristics, not laws).
# - `accelerator.accumulate` runs the micro-batches that do not step under
#   `no_sync`: one all-reduce per optimizer step instead of one per micro-batch.
# - From the command line, only the launch changes between a laptop, eight GPUs and
#   several machines: `accelerate launch ... -m course_utils.train`.
