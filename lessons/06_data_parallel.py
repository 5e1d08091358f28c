# %% [markdown]
# # Lesson 4 — Data parallelism: the same loop on several processes
#
# Lesson 1 promised that the Accelerate loop scales from one device to many
# without changing. This lesson keeps that promise on a laptop: the course's loop
# (`course_utils.loops.train_accelerate`) runs on **two CPU processes** that talk
# through `torch.distributed` (the *gloo* backend), first from this notebook, then
# from the command line. The same code runs unchanged on eight GPUs or on several
# machines; only the launch command changes.
#
# In this lesson you will
#
# 1. see what data parallelism does, and which examples each process gets,
# 2. launch the course's training on two processes from the notebook, and meet
#    the mistake that makes every process silently train alone,
# 3. check, number for number, that two processes with batches of *b* train the
#    same model as one process with batches of *2b*,
# 4. gather evaluation metrics from every process,
# 5. run the same training from the command line, and time one process against two,
# 6. practise with three exercises.
#
# Everything runs on a laptop CPU in about a minute, without internet and without a GPU.
#
# The model and the data are the course's offline stand-ins (lesson 1 introduces
# them): a small pre-trained DistilBERT from `data/tiny-distilbert/` for the
# `distilbert-base-cased` checkpoint, and the paraphrase pairs of `data/paraphrase/`
# for the GLUE MRPC dataset. With internet, the model line becomes
# `models.load_pretrained_classifier("distilbert-base-cased")`; the data line is
# `load_dataset("glue", "mrpc")`, as lesson 1 shows.

# %%
import inspect
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
from accelerate import Accelerator  # imported, not created: the workers create their own
from IPython.display import Markdown, display
from torch.utils.data import DataLoader

from course_utils import data, loops, models, parallel, plots, train
from course_utils.exercises import ____
from course_utils.exercises import lesson6 as ex

# Several processes will load the model: no library progress bars, theirs would interleave.
parallel.silence_library_progress_bars()
print(f"this machine has {os.cpu_count()} CPU cores")

# %% [markdown]
# ## 1. What data parallelism does
#
# With *N* processes, each one holds a **full copy of the model**. At every step:
#
# 1. each process takes its own **shard** of the data: different examples;
# 2. it runs the forward pass and the backward pass on its shard, which gives
#    gradients $g_i$ of its own mean loss;
# 3. `accelerator.backward(loss)` **averages** the gradients across processes (an
#    *all-reduce*): every process receives the same $g = \frac{1}{N}\sum_{i=1}^{N} g_i$;
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
# `Accelerator(split_batches=True)` shards differently: it cuts *each* batch into
# *N* pieces, so the batch size you choose is the total over all processes:

# %% tags=["nbval-check-output"]
for rank, shard in enumerate(parallel.shards_of_each_process(8, batch_size=4, num_processes=2, split_batches=True)):
    print(f"process {rank}: {shard}")

# %% [markdown]
# ## 2. Launching the course's training on two processes
#
# Every process runs the same function. The course's is
# `course_utils.train.train_on_this_process`: it reads top to bottom like
# lesson 1 (an `Accelerator`, the seed, the model, the data, the optimizer, the
# course loop), then each process describes what it saw in a `ProcessReport`:
# its rank, the size of its group, the number of batches of its shard, the loss
# of its last batch, and a checksum of its gradients after the last
# `accelerator.backward`. `gather_reports` collects the reports of all processes.

# %%
display(Markdown(f"```python\n{inspect.getsource(train.train_on_this_process)}```"))

# %% [markdown]
# `accelerate.notebook_launcher(function, args, num_processes=2)` starts the
# processes from a notebook. Our `parallel.launch` wraps it: it first checks the
# usual traps (section 6), and it brings back what each worker returned, so that
# this notebook prints the reports itself, once, in rank order; two processes
# printing at the same time would mix their lines.
#
# The run below keeps the training small (a few hundred examples) and turns dropout
# off; section 3 explains why. First, the mistake almost everyone makes on a
# machine without a GPU: a plain `Accelerator()`, here `TrainConfig(cpu=False)`.

# %%
SMALL_RUN = dict(limit=256, num_epochs=2, lr=1e-3, seed=0, dropout=False)
BATCH_SIZE = 8  # per process

train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=0, limit=SMALL_RUN["limit"])
print(f"{len(train_dataloader.dataset)} training examples in batches of {BATCH_SIZE}: {len(train_dataloader)} batches "
      f"per epoch, {parallel.batches_per_process(len(train_dataloader), 2)} for each of 2 processes")

# %% [markdown]
# (Loading the data here also saves the workers that work: they are copies of
# this notebook's process, made at launch, and find the tokenized data in memory.)

# %%
silent = parallel.launch(
    train.train_on_this_process, args=(train.TrainConfig(batch_size=BATCH_SIZE, cpu=False, **SMALL_RUN),),
    num_processes=2,
)
silent_reports = [result.report for result in silent]
print(parallel.format_reports(silent_reports))

# %% [markdown]
# Both workers ran, without any error. But look at the *world size* column: each
# `Accelerator` sees a group of 1, in mode `NO`. Without a GPU, an Accelerator
# does not join the other processes unless it is allowed to run on the CPU, so
# each worker trained alone on *all* the batches. `diagnose_launch` reads the reports:

# %%
print(parallel.diagnose_launch(silent_reports, num_processes=2))

# %% [markdown]
# Now the same launch with `Accelerator(cpu=True)`, which `TrainConfig(cpu=True)` asks for:

# %%
results = parallel.launch(
    train.train_on_this_process, args=(train.TrainConfig(batch_size=BATCH_SIZE, cpu=True, **SMALL_RUN),),
    num_processes=2,
)
reports = [result.report for result in results]
print(parallel.format_reports(reports))
print()
print(parallel.diagnose_launch(reports, num_processes=2))

# %% [markdown]
# This is data parallelism. The two processes form one group (`MULTI_CPU`), each
# trained on its own half of the batches, the losses of their last batches
# differ (different examples), yet their gradient checksums are equal: after
# `accelerator.backward`, both hold the average gradient. Their parameters are
# identical too:

# %%
print(f"batches per epoch: {[r.num_batches for r in silent_reports]} alone, {[r.num_batches for r in reports]} in a group")
print(f"largest difference between the two copies' parameters: "
      f"{parallel.max_parameter_difference(results[0].parameters, results[1].parameters)}")

# %% [markdown]
# ## 3. Two processes with batch *b* = one process with batch *2b*
#
# The equation of section 1 says that the two processes above took the steps
# that one process would take with batches of 16. Let us check it to the last
# digit, or nearly: the same function, on **one** process, with `batch_size=16`.
# (`parallel.launch` runs even a single process in a child process, so that this
# notebook never holds an `Accelerator` of its own.)

# %%
one = parallel.launch(
    train.train_on_this_process, args=(train.TrainConfig(batch_size=2 * BATCH_SIZE, cpu=True, **SMALL_RUN),),
    num_processes=1,
)
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
# Adam divides each gradient by its own running scale, so it turns that rounding
# noise into steps of ordinary size, in random directions: two runs that round
# differently disagree on those biases and on nothing else (they change nothing
# the model computes either). Every other parameter agrees:

# %%
TOLERANCE = 1e-5
gap = parallel.max_parameter_difference(results[0].parameters, one[0].parameters, skip=parallel.NOISE_ONLY_PARAMETERS)
print(f"largest difference, all parameters but {parallel.NOISE_ONLY_PARAMETERS}: {gap:.1e}")
print(f"within {TOLERANCE:.0e}: {gap <= TOLERANCE}")

# %% [markdown]
# The loss of one process over 16 examples is the mean of the two processes'
# losses over their 8 each, step after step:

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
#   its batches from. Process 0 takes batch 0 of 8 examples and process 1 batch 1,
#   which are exactly the 16 examples of batch 0 of the 1-process run:
#   the check below asks Accelerate's sampler.
# - **Equal shards.** The gradient average equals the gradient of the mean over
#   16 examples only when both shards hold 8: the number of examples is a
#   multiple of 16, so no batch is short and nothing is repeated.
# - **The same learning rate at each step.** The scheduler was built for the
#   number of batches *before* `prepare` (twice as many of size 8 as of size 16),
#   and a prepared scheduler steps once per process at every optimizer step.

# %% tags=["nbval-check-output"]
num_examples = SMALL_RUN["limit"]
two_processes = parallel.shards_of_each_process(num_examples, BATCH_SIZE, num_processes=2)
one_process = parallel.shards_of_each_process(num_examples, 2 * BATCH_SIZE, num_processes=1)[0]
same_examples = all(
    sorted(two_processes[0][step] + two_processes[1][step]) == one_process[step] for step in range(len(one_process))
)
print(f"{num_examples} examples: {len(one_process)} steps either way; same examples at every step: {same_examples}")

# %% [markdown]
# The learning rates, computed from scratch with the course's scheduler: on two
# processes, a schedule over the batches of 8 stepped twice per step; on one, a
# schedule over the batches of 16 stepped once.

# %%
def learning_rates(num_training_steps, steps_per_step, num_steps):
    """The learning rate of each optimizer step, for a scheduler stepped ``steps_per_step`` times per step."""
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(
        torch.nn.Linear(1, 1), num_training_steps, lr=SMALL_RUN["lr"]
    )
    rates = []
    for _ in range(num_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: changes nothing, but keeps the usual order of the two steps
        for _ in range(steps_per_step):
            lr_scheduler.step()
    return rates


steps = SMALL_RUN["num_epochs"] * len(one_process)
two_rates = learning_rates(SMALL_RUN["num_epochs"] * 2 * len(one_process), steps_per_step=2, num_steps=steps)
one_rates = learning_rates(SMALL_RUN["num_epochs"] * len(one_process), steps_per_step=1, num_steps=steps)
print(f"{steps} optimizer steps; largest gap between the learning rates: "
      f"{max(abs(a - b) for a, b in zip(two_rates, one_rates)):.1e}")

# %% [markdown]
# One subtlety hides there: the warm-up lasts `int(0.1 * num_training_steps)`
# scheduler steps. Two processes agree with one only when that number, counted in
# batches of 8, is twice the one counted in batches of 16; the run above was sized
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
# The course's `loops.evaluate` does exactly that when it is given the accelerator:

# %%
display(Markdown("```python\n" + "\n".join(
    line for line in inspect.getsource(loops.evaluate).splitlines() if "accelerator" in line or "for batch" in line
) + "\n```"))

# %% [markdown]
# So both workers return the metrics of the whole validation split, the same on each:

# %%
for rank, result in enumerate(results):
    print(f"process {rank}: accuracy {result.metrics['accuracy']:.4f}, F1 {result.metrics['f1']:.4f}")

# %% [markdown]
# To print something once, print it on the main process only:
# `accelerator.print(...)`, or `if accelerator.is_main_process: ...`.
# The command-line version below does that.
#
# ## 5. The same training from the command line
#
# `course_utils/train.py` is a script around the same function: its `main()`
# parses the options, creates the `Accelerator`, trains, gathers the reports and
# prints them once with `accelerator.print`.
#
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
# If the script is launched as several processes but its Accelerator ends up
# alone (say `--cpu` was forgotten), `parallel.check_process_group` stops it with
# an error that says so, instead of letting each process train alone.
#
# `parallel.run_command` runs a command as a terminal opened in the repository
# would, with this notebook's Python environment. First the options:

# %%
parallel.run_command("python -m course_utils.train --help");

# %% [markdown]
# Two processes with batches of 8, then one process with batches of 16; each
# writes its metrics and its training time to a JSON file. The launcher gives
# each of the two processes one thread; `--threads 1` gives the single process
# one thread too, so that each process computes on one core in both runs.

# %%
outputs = Path(tempfile.mkdtemp(prefix="lesson6-"))
# The processes meet on port 29500 unless told otherwise; a free one cannot clash with another run.
ACCELERATE_LAUNCH = (
    "accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no "
    f"--main_process_port {parallel.find_free_port()}"
)
TRAINING = "-m course_utils.train --cpu --no-dropout --limit 256 --epochs 2"

parallel.run_command(f"{ACCELERATE_LAUNCH} {TRAINING} --batch-size 8 --metrics-json {outputs / 'two.json'}");

# %%
parallel.run_command(f"python {TRAINING} --batch-size 16 --threads 1 --metrics-json {outputs / 'one.json'}");

# %% [markdown]
# Each process printed nothing of its own: the main process printed every line
# once. To run on more hardware, only the launch changes:
#
# | where | command |
# | --- | --- |
# | this laptop, 2 CPU processes | `accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no -m course_utils.train --cpu` |
# | the same, with torch's launcher | `OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 -m course_utils.train --cpu` (without `OMP_NUM_THREADS`, torchrun sets it to 1 and says so) |
# | one machine with 8 GPUs | `accelerate launch --multi_gpu --num_processes 8 -m course_utils.train` (no `--cpu`) |
# | two machines with 8 GPUs each | on each: `accelerate launch --multi_gpu --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 --num_processes 16 -m course_utils.train` (`--machine_rank 1` on the second; the address is machine 0's; `--num_processes` counts the processes of all machines) |
#
# `accelerate config` asks these questions once and saves the answers, so that
# `accelerate launch -m course_utils.train` is enough afterwards.
#
# ### Is it faster?
#
# The JSON files hold the wall time of each training loop (model loading and
# process start-up excluded), and both runs did the same optimizer steps:

# %%
timings = {name: json.loads((outputs / f"{name}.json").read_text()) for name in ("one", "two")}
ratio = timings["one"]["train_seconds"] / timings["two"]["train_seconds"]
print(f"same validation accuracy: {timings['one']['accuracy'] == timings['two']['accuracy']}")
print(f"1 process / 2 processes: {ratio:.2f} (above 1: two processes are faster)")
plots.plot_wall_times(
    {f"{run['num_processes']} process{'es' if run['num_processes'] > 1 else ''} x batch {run['batch_size_per_process']}":
     [run["train_seconds"]] for run in timings.values()},
    title="The same training on 1 and on 2 CPU processes, one thread each",
);

# %% [markdown]
# Two processes have twice the cores for the same arithmetic, so the ideal ratio
# is 2. What they add is communication: at every step, each process sends its
# gradients and waits for the other's, whatever the size of the batch. Per step:

# %%
steps = timings["one"]["steps"]
gradient_bytes = sum(tensor.numel() for tensor in results[0].parameters.values()) * 4  # fp32
for name, run in timings.items():
    print(f"{run['num_processes']} process{'es' if run['num_processes'] > 1 else ''}: "
          f"{1000 * run['train_seconds'] / steps:.1f} ms per step")
print(f"gradients averaged at every step: {gradient_bytes / 1024**2:.2f} MiB from each process")

# %% [markdown]
# With this tiny model a step computes little, and the all-reduce (plus the two
# processes waiting for each other on a laptop's shared cores) costs about as
# much, often more: the gain is small or negative. Data
# parallelism pays off when a step's computation dwarfs its communication, and
# when each process brings hardware of its own, a GPU or a machine, with fast
# links between them: then *N* processes compute *N* shards at once. The point of
# this lesson is that the code does not change.
#
# A single process can also use several cores with threads (PyTorch's default:
# one per core). `benchmarks/bench_parallel.py` compares the three setups
# properly: one process with PyTorch's default threads, one process with one
# thread, two processes with one thread each (3 runs each, in rotating order,
# medians of the training loop's wall time).
#
# ## 6. When a launch goes wrong
#
# `parallel.launch` checks four traps before it calls `notebook_launcher`, and
# says what to do about each:
#
# - **An `Accelerator` already exists in the notebook.** The workers are copies of
#   the notebook's process; they must create their own. Restart the kernel.
# - **bitsandbytes is imported in the notebook.** It may initialise a GPU when
#   imported, so `notebook_launcher` refuses to fork after it. Import it inside
#   the launched function.
# - **More processes than CPU cores.** They would take turns on the cores and every
#   step would wait for the slowest.
# - **A busy port.** The processes meet on a TCP port (29500 by default in
#   torch); an earlier run that is still alive may hold it. `port=None` lets the
#   operating system pick a free one (on the command line:
#   `--main_process_port`, as in section 5).
#
# A busy port, for instance:

# %%
with socket.socket() as squatter:
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    busy_port = squatter.getsockname()[1]
    try:
        parallel.launch(train.train_on_this_process, args=(train.TrainConfig(cpu=True),), port=busy_port)
    except parallel.LaunchError as error:
        print(error)

# %%
try:
    parallel.launch(train.train_on_this_process, args=(train.TrainConfig(cpu=True),), num_processes=os.cpu_count() + 1)
except parallel.LaunchError as error:
    print(error)

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
# ## One last experiment: an `Accelerator` in the notebook
#
# Create an `Accelerator` here, in the notebook's own process, and try to launch:

# %%
accelerator = Accelerator(cpu=True)
try:
    parallel.launch(train.train_on_this_process, args=(train.TrainConfig(cpu=True),))
except parallel.LaunchError as error:
    print(error)

# %% [markdown]
# That is why this lesson never created one outside the launched function.
# From here on, this kernel cannot launch again until it is restarted.
#
# ## Summary
#
# - Data parallelism: a full model copy per process, a shard of the data each,
#   gradients averaged by `accelerator.backward`, the same step everywhere.
# - `notebook_launcher` (here through `parallel.launch`) starts the processes from
#   a notebook; without a GPU, the `Accelerator` inside must be created with
#   `cpu=True`, or each process silently trains alone. Ask each process for its
#   `num_processes` and `distributed_type` to be sure.
# - *N* processes with batches of *b* take the steps of one process with batches of
#   *N b*, exactly, when dropout is off, the shards are equal, the shuffle is seeded
#   and the scheduler is counted in batches before `prepare`.
# - Gather predictions with `gather_for_metrics` before computing a metric; print
#   on the main process only.
# - From the command line, only the launch changes between a laptop, eight GPUs and
#   several machines: `accelerate launch ... -m course_utils.train`.
