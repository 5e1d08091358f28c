"""Data parallelism on several processes, with or without a GPU (lesson 6).

Data parallelism runs one full copy of the model in each process. Every step,
each process trains on its own shard of the data; during the backward pass,
the ``DistributedDataParallel`` wrapper that ``accelerator.prepare(model)``
installs averages the gradients across processes (an all-reduce, started by
autograd hooks as each bucket of gradients is ready), so every copy takes the
same optimizer step and the copies stay identical.

This module holds the lesson's ideas:

- **sharding**: which examples each process gets (:func:`shards_of_each_process`,
  :func:`batches_per_process`), computed with Accelerate's own sampler;
- **evidence**: each process describes itself in a :class:`ProcessReport`
  (:func:`report_process`), the reports are gathered in rank order
  (:func:`gather_reports`), printed once (:func:`format_reports`) and judged
  (:func:`diagnose_launch`), which names the silent failure where every worker
  trains alone; :class:`AllReduceCounter` counts the gradient all-reduces;
- **equivalence**: :func:`without_dropout`, :func:`parameters_of`,
  :func:`parameter_differences` and :func:`max_parameter_difference` compare a
  run on N processes with a run on one (:data:`NOISE_ONLY_PARAMETERS` names the
  few parameters whose updates are pure rounding noise).

Starting the processes from a notebook is machinery, in :mod:`course_utils.launcher`;
:func:`launch` (the course's wrapper around ``accelerate.notebook_launcher``,
which brings each worker's return value back) and its errors are re-exported here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from course_utils.launcher import LaunchError, WorkerError, WorkerTimeout, launch
from course_utils.validation import (
    check_accelerator, check_bool, check_instance, check_int_in_range, check_positive_int, is_real_number,
)

__all__ = [
    "AllReduceCounter",
    "LaunchError",
    "NOISE_ONLY_PARAMETERS",
    "ProcessReport",
    "WorkerError",
    "WorkerTimeout",
    "batches_per_process",
    "diagnose_launch",
    "format_reports",
    "gather_reports",
    "gradient_checksum",
    "launch",
    "learning_rate_sweep",
    "max_parameter_difference",
    "parameter_differences",
    "parameters_of",
    "report_process",
    "shards_of_each_process",
    "train_small_classifier",
    "update_after_accumulation",
    "without_dropout",
]


# --------------------------------------------------------------------------- sharding


def batches_per_process(num_batches: int, num_processes: int) -> int:
    """Return how many batches each process takes from a dataloader of ``num_batches`` batches.

    With Accelerate's defaults (``split_batches=False``, ``even_batches=True``)
    process ``i`` takes batches ``i``, ``i + N``, ``i + 2N`` ...; when
    ``num_batches`` is not a multiple of ``N`` the last round is completed with
    examples from the start of the data, so every process takes the same number
    of steps: ``ceil(num_batches / N)``.
    """
    check_positive_int(num_batches, "num_batches")
    check_positive_int(num_processes, "num_processes")
    return math.ceil(num_batches / num_processes)


MAX_LISTED_EXAMPLES = 1_000_000
MAX_LISTED_PROCESSES = 1024


def shards_of_each_process(
    num_examples: int, batch_size: int, num_processes: int, split_batches: bool = False
) -> list[list[list[int]]]:
    """Return the example indices each process trains on: ``shards[process][step]`` is a list of ints.

    Computed with Accelerate's own ``BatchSamplerShard`` over the examples in
    order ``0 .. num_examples - 1`` (a shuffled dataloader shards its shuffled
    order the same way). With ``split_batches=False`` (the default) each process
    takes whole batches of ``batch_size`` in turn; with ``split_batches=True``
    every batch of ``batch_size`` is cut into ``num_processes`` equal pieces.
    """
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    # Every index is listed: past these sizes the lists take seconds to minutes and no figure can show them.
    check_int_in_range(num_examples, "num_examples", 1, MAX_LISTED_EXAMPLES)
    check_positive_int(batch_size, "batch_size")
    check_int_in_range(num_processes, "num_processes", 1, MAX_LISTED_PROCESSES)
    check_bool(split_batches, "split_batches")
    if split_batches and batch_size % num_processes:
        raise ValueError(
            f"with split_batches=True, batch_size must be a multiple of num_processes, "
            f"got batch_size={batch_size} and num_processes={num_processes}"
        )
    batches = BatchSampler(SequentialSampler(range(num_examples)), batch_size=batch_size, drop_last=False)
    return [
        [list(batch) for batch in BatchSamplerShard(batches, num_processes, index, split_batches=split_batches)]
        for index in range(num_processes)
    ]


# --------------------------------------------------------------------------- evidence from each process


@dataclass(frozen=True)
class ProcessReport:
    """What one worker process saw. Gathered from every process, the reports show whether they trained together.

    - ``worker``: the number the launcher gave this process (``RANK`` in its environment), 0 .. N-1;
    - ``process_index``, ``num_processes``, ``distributed_type``: its rank, the group size and the
      mode, as its ``Accelerator`` sees them (``"MULTI_CPU"`` for processes over gloo, ``"NO"`` alone);
    - ``num_batches``: batches this process trained on per epoch (its shard);
    - ``last_loss``: the loss of its last batch (each shard has its own);
    - ``gradient_checksum``: the sum of all its gradient elements after the last backward pass.
    """

    worker: int
    process_index: int
    num_processes: int
    distributed_type: str
    num_batches: int
    last_loss: float
    gradient_checksum: float


def gradient_checksum(model: torch.nn.Module) -> float:
    """Return the sum of every gradient element of ``model`` (float64); parameters without gradient count 0.

    Two processes whose gradients are equal give equal sums; gradients that
    differ almost surely give different sums.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.grad.double().sum().item() for p in model.parameters() if p.grad is not None)


def report_process(accelerator, model: torch.nn.Module, num_batches: int, last_loss: float) -> ProcessReport:
    """Return this process's :class:`ProcessReport`, for a ``model`` just trained with ``accelerator``."""
    check_accelerator(accelerator)
    check_positive_int(num_batches, "num_batches")
    # A NaN loss is news to report (training diverged), not an error; a string is a mistake.
    if not (is_real_number(last_loss) or isinstance(last_loss, torch.Tensor) and last_loss.numel() == 1):
        raise ValueError(f"last_loss must be a number (the loss of the last batch), got {last_loss!r}")
    return ProcessReport(
        worker=int(os.environ.get("RANK", "0")),
        process_index=accelerator.process_index,
        num_processes=accelerator.num_processes,
        distributed_type=accelerator.distributed_type.value,
        num_batches=num_batches,
        last_loss=float(last_loss),
        gradient_checksum=gradient_checksum(model),
    )


def gather_reports(accelerator, report: ProcessReport) -> list[ProcessReport]:
    """Return the reports of every process in the group, in rank order (the same list on every process).

    A collective operation: every process of the group must call it. A process
    that is alone (``num_processes == 1``) gets its own report only.
    """
    from accelerate.utils import gather_object

    check_accelerator(accelerator)
    if not isinstance(report, ProcessReport):
        raise TypeError(f"report must be a ProcessReport, got {type(report).__name__}")
    reports = gather_object([report]) if accelerator.num_processes > 1 else [report]
    return sorted(reports, key=lambda r: r.process_index)


def format_reports(reports: list[ProcessReport]) -> str:
    """Return the reports as a table, one line per process, in the order given."""
    _check_reports(reports)
    lines = [
        f"{'worker':>6}  {'rank':>4}  {'world size':>10}  {'mode':<10}  {'batches':>7}  "
        f"{'last loss':>9}  {'gradient checksum':>17}"
    ]
    for r in reports:
        lines.append(
            f"{r.worker:>6}  {r.process_index:>4}  {r.num_processes:>10}  {r.distributed_type:<10}  "
            f"{r.num_batches:>7}  {r.last_loss:>9.4f}  {r.gradient_checksum:>17.9f}"
        )
    return "\n".join(lines)


def diagnose_launch(reports: list[ProcessReport], num_processes: int) -> str:
    """Return a plain-language verdict on a launch of ``num_processes`` workers, from their reports.

    The cases: one process alone, as launched; the workers formed one group of
    ``num_processes`` and their gradients agree (data parallelism works); every
    worker is alone (the silent failure: usually ``Accelerator()`` without
    ``cpu=True`` on a machine without a GPU); anything else (a group of the
    wrong size, gradients that disagree).
    """
    _check_reports(reports)
    check_positive_int(num_processes, "num_processes")
    if len(reports) != num_processes:
        return f"Expected {num_processes} reports, one per worker, but got {len(reports)}."
    sizes = sorted({r.num_processes for r in reports})
    modes = sorted({r.distributed_type for r in reports})
    checksums = [r.gradient_checksum for r in reports]
    spread = max(checksums) - min(checksums)
    if num_processes == 1 and sizes == [1]:
        return (
            f"One process (mode {modes[0]}): no group to form and no gradient to share; it trained on "
            f"all {reports[0].num_batches} batches per epoch."
        )
    if num_processes > 1 and sizes == [1]:
        batches = sorted({r.num_batches for r in reports})
        return (
            f"Silent failure: {num_processes} workers ran, but each one's Accelerator says num_processes=1 "
            f"(mode {', '.join(modes)}). They never formed a group: each trained alone on the whole dataset "
            f"({', '.join(map(str, batches))} batches per epoch), and no gradient was shared. Their gradients agree "
            f"(checksums differ by {spread:.1e}) only because each repeated the same work from the same seed: "
            f"{num_processes} times the compute for the training of one. On a machine without a GPU, an "
            f"Accelerator joins the other processes only when it is allowed to run on the CPU."
        )
    if sizes == [num_processes] and sorted(r.process_index for r in reports) == list(range(num_processes)):
        shares = sorted({r.num_batches for r in reports})
        agree = spread <= 1e-6 * max(1.0, max(abs(c) for c in checksums))
        verdict = "agree" if agree else "DISAGREE"
        return (
            f"Data parallel: the {num_processes} workers formed one group (mode {', '.join(modes)}), each trained "
            f"on its own shard ({', '.join(map(str, shares))} batches per epoch), and their gradients after "
            f"the last backward pass {verdict} (checksums differ by {spread:.1e})."
        )
    return (
        f"Unexpected: {num_processes} workers were launched, but they report group sizes {sizes} and modes {modes}. "
        f"Every worker should create its Accelerator the same way, inside the launched function."
    )


# --------------------------------------------------------------------------- equivalence


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set the probability of every ``torch.nn.Dropout`` in ``model`` to 0; return the same model.

    Dropout draws a random mask in each process from that process's own random
    generator, so N processes cannot draw the masks one process would: only
    without dropout can their training be compared number for number.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def parameters_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return a copy of every parameter of ``model`` (name -> detached CPU float32 tensor)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return {name: p.detach().to("cpu", torch.float32).clone() for name, p in model.named_parameters()}


NOISE_ONLY_PARAMETERS = ("attention.k_lin.bias",)
"""Name parts of DistilBERT parameters whose gradient is zero in exact arithmetic.

The bias of the attention keys adds the same number to every score of a
query, and softmax ignores a constant added to all its inputs. So its gradient
is rounding noise (about 1e-11 to 1e-10). Adam does not blow that noise up to steps of
size lr: its eps (1e-8) sits far above sqrt(v_hat) there, so each step moves
these biases by a tiny fraction of lr (below the eps floor Adam acts
like SGD with learning rate lr / eps). What makes two runs that differ only in
rounding disagree on these parameters, and only on these, is that their
updates are pure noise, uncorrelated between the runs, step after step; where
the gradient is real, both runs follow it and rounding only nudges their steps.
"""


def parameter_differences(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> dict[str, float]:
    """Return, for each parameter name, the largest absolute difference between its elements in ``first`` and ``second``.

    Both dicts must have the same names and shapes, as :func:`parameters_of` gives
    for two copies of one architecture.
    """
    if not isinstance(first, dict) or not isinstance(second, dict):
        raise TypeError("first and second must be dicts of name -> tensor, as parameters_of returns")
    if first.keys() != second.keys():
        differing = sorted(set(first) ^ set(second))[:3]
        raise ValueError(f"first and second must have the same parameter names; they differ on {differing}")
    differences = {}
    for name, tensor in first.items():
        check_instance(tensor, f"first[{name!r}]", torch.Tensor, "a torch.Tensor")
        check_instance(second[name], f"second[{name!r}]", torch.Tensor, "a torch.Tensor")
        if tensor.shape != second[name].shape:
            raise ValueError(
                f"parameter {name!r} has shape {tuple(tensor.shape)} in first and {tuple(second[name].shape)} in second"
            )
        differences[name] = (tensor.float() - second[name].float()).abs().max().item()
    return differences


def max_parameter_difference(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], skip: tuple[str, ...] = ()
) -> float:
    """Return the largest absolute difference between matching elements of two parameter dicts.

    Parameters whose name contains one of the strings in ``skip`` are left out
    (e.g. :data:`NOISE_ONLY_PARAMETERS`).
    """
    if isinstance(skip, str) or not all(isinstance(part, str) for part in skip):
        raise TypeError(f"skip must be a tuple of strings, got {skip!r}")
    differences = parameter_differences(first, second)
    kept = [gap for name, gap in differences.items() if not any(part in name for part in skip)]
    return max(kept, default=0.0)


# --------------------------------------------------------------------------- counting the all-reduces


class AllReduceCounter:
    """Count the gradient all-reduces of a model that ``accelerator.prepare`` wrapped in ``DistributedDataParallel``.

    Registers a DDP communication hook that does DDP's usual all-reduce (its
    default hook) and counts it: ``calls`` is the number of all-reduces so far,
    one per bucket of gradients per synchronised backward pass. A backward pass
    inside ``accelerator.no_sync(model)`` (which ``accelerator.accumulate`` uses
    on the micro-batches that do not step) all-reduces nothing.
    """

    def __init__(self, model: torch.nn.Module):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(
                f"model must be the DistributedDataParallel model accelerator.prepare returns on several processes, "
                f"got {type(model).__name__}"
            )
        self.calls = 0

        def counting_allreduce(process_group, bucket):
            self.calls += 1
            return allreduce_hook(process_group, bucket)

        model.register_comm_hook(None, counting_allreduce)


# --------------------------------------------------------------------------- argument checks


def _check_reports(reports) -> None:
    if not isinstance(reports, (list, tuple)) or not reports or not all(isinstance(r, ProcessReport) for r in reports):
        raise TypeError("reports must be a non-empty list of ProcessReport, as gather_reports or launch return")


# ----- the effective batch and the learning rate


def _teacher_task(num_examples: int, seed: int = 1234, num_features: int = 16):
    """Return (inputs, labels, validation inputs, validation labels): random inputs that a fixed random network labels."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_examples + 1024, num_features, generator=generator)
    hidden = torch.randn(num_features, 32, generator=generator)
    output = torch.randn(32, 1, generator=generator)
    labels = ((torch.tanh(inputs @ hidden) @ output).squeeze(1) > 0).long()
    return inputs[:num_examples], labels[:num_examples], inputs[num_examples:], labels[num_examples:]


def train_small_classifier(batch_size: int, lr: float, seed: int, num_epochs: int = 3, num_examples: int = 1024) -> float:
    """Train a two-layer network with AdamW on the synthetic task; return its validation loss (nats per example).

    The task is the same for every call (its own seed); ``seed`` sets the
    network's initial weights and the order of the batches. Every run sees the
    same ``num_epochs`` passes over the data, so a larger ``batch_size`` takes
    fewer, larger steps: what moving a script from 1 device to N does.
    """
    check_positive_int(batch_size, "batch_size")
    check_positive_int(num_epochs, "num_epochs")
    check_positive_int(num_examples, "num_examples")
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < math.inf):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    inputs, labels, validation_inputs, validation_labels = _teacher_task(num_examples)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(inputs.shape[1], 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    for _ in range(num_epochs):
        permutation = torch.randperm(num_examples, generator=order)
        for start in range(0, num_examples, batch_size):
            batch = permutation[start:start + batch_size]
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(validation_inputs), validation_labels).item()


def learning_rate_sweep(batch_sizes, learning_rates, seeds, progress=None) -> dict[tuple[int, float], list[float]]:
    """Return ``{(batch_size, lr): [validation loss of each seed]}`` of :func:`train_small_classifier`.

    ``progress`` (optional) is called with no argument after each run, e.g. a progress bar's ``update``.
    """
    for name, values in (("batch_sizes", batch_sizes), ("learning_rates", learning_rates), ("seeds", seeds)):
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{name} must be a non-empty list, got {values!r}")
    if not all(is_real_number(lr) and math.isfinite(lr) and lr > 0 for lr in learning_rates):
        raise ValueError(f"learning_rates must be positive finite numbers, got {learning_rates!r}")
    losses = {}
    for batch_size in batch_sizes:
        for lr in learning_rates:
            losses[batch_size, lr] = []
            for seed in seeds:
                losses[batch_size, lr].append(train_small_classifier(batch_size, lr, seed))
                if progress is not None:
                    progress()
    return losses


def update_after_accumulation(optimizer_class, lr, micro_batches, accumulation_steps, divide_loss) -> torch.Tensor:
    """Return how far gradient accumulation moves the tiny checkpoint's parameters (float64, flattened).

    From seed 0, dropout off, an ``optimizer_class(parameters, lr=lr)`` steps once every
    ``accumulation_steps`` of ``micro_batches``, after summing their gradients; each
    micro-batch's loss is divided by ``accumulation_steps`` first when ``divide_loss``
    (what ``accelerator.backward`` does), as is when not (a plain ``loss.backward()``).
    """
    from course_utils import models  # the model is only needed here

    check_positive_int(accumulation_steps, "accumulation_steps")
    check_bool(divide_loss, "divide_loss")
    torch.manual_seed(0)
    model = without_dropout(models.load_pretrained_classifier())
    before = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    optimizer = optimizer_class(model.parameters(), lr=lr)
    for step, batch in enumerate(micro_batches, start=1):
        loss = model(**batch).loss
        (loss / accumulation_steps if divide_loss else loss).backward()
        if step % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return torch.cat([p.detach().double().flatten() for p in model.parameters()]) - before

