"""Fine-tune the course classifier, on one process or several: one training function, like Accelerate's examples (lesson 6).

From a notebook, every process runs :func:`training_function`::

    from accelerate import notebook_launcher
    notebook_launcher(training_function, (TrainConfig(cpu=True),), num_processes=2)

From the command line, one process::

    python -m course_utils.train

Two processes on this machine's CPU (torch.distributed over gloo)::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no -m course_utils.train --cpu

``--multi_gpu`` selects Accelerate's multi-process launcher (the one behind
torchrun); ``--cpu`` is the script's own flag, for ``Accelerator(cpu=True)``.
Beware ``accelerate launch --cpu --num_processes 2``: Accelerate 1.x then
starts a single process (its CPU launcher expects MPI to start the others).
``torchrun --nproc_per_node 2 -m course_utils.train --cpu`` works too.

Eight GPUs: ``accelerate launch --multi_gpu --num_processes 8 -m course_utils.train``
(no ``--cpu``). Two machines of 8 GPUs: on each, ``accelerate launch --multi_gpu
--num_machines 2 --machine_rank 0 --main_process_ip <address of machine 0>
--main_process_port 29500 --num_processes 16 -m course_utils.train``, with
``--machine_rank 1`` on the second (``--num_processes`` counts all machines).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from course_utils import data, models, parallel
from course_utils.schedules import linear_warmup_then_decay

__all__ = ["TrainConfig", "TrainingResult", "build_parser", "main", "training_function"]


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run. ``batch_size`` is per process, as Accelerate counts it.

    ``limit`` keeps the first ``limit`` training examples (None: all);
    ``dropout=False`` turns dropout off, which makes runs on different numbers
    of processes comparable number for number (see ``parallel.without_dropout``).
    """

    batch_size: int = 16
    num_epochs: int = 2
    lr: float = 1e-3
    seed: int = 0
    cpu: bool = False
    limit: int | None = None
    dropout: bool = True

    def __post_init__(self):
        from course_utils.validation import check_bool, check_non_negative_int, check_positive_int, check_positive_number

        check_positive_int(self.batch_size, "batch_size")
        check_positive_int(self.num_epochs, "num_epochs")
        check_positive_number(self.lr, "lr")
        check_non_negative_int(self.seed, "seed")
        check_bool(self.cpu, "cpu")
        check_bool(self.dropout, "dropout")
        if self.limit is not None:
            check_positive_int(self.limit, "limit")


@dataclass
class TrainingResult:
    """What one process returns from :func:`training_function` (the lesson's evidence).

    - ``report``: this process's ``parallel.ProcessReport``; ``reports``: those of every process, in rank order;
    - ``accuracy``: validation accuracy over the whole split, predictions gathered from every process (fraction);
    - ``shard_accuracy``: the accuracy of this process's own shard of the validation split, *not* gathered (the
      number a script that forgets to gather prints);
    - ``baseline``: the accuracy of always predicting the validation split's most frequent label (fraction);
    - ``losses``: the loss of every step on this process; ``train_seconds``: wall time of the training loop (s);
    - ``parameters``: the trained parameters of this process's copy (``parallel.parameters_of``).
    """

    report: parallel.ProcessReport
    reports: list
    accuracy: float
    shard_accuracy: float
    baseline: float
    losses: list[float]
    train_seconds: float
    parameters: dict = field(repr=False)


def training_function(config):
    """Fine-tune the tiny checkpoint with ``config`` (a :class:`TrainConfig`) on this process; return its :class:`TrainingResult`."""
    accelerator = Accelerator(cpu=config.cpu)
    # The model copies start identical whatever the seed: prepare() wraps the model in
    # DistributedDataParallel, which broadcasts rank 0's parameters to every process.
    # The same seed in every process makes the seeded shuffles agree, so that the
    # processes take their shards from one order of the examples.
    set_seed(config.seed)
    train_dataloader, eval_dataloader = data.make_dataloaders(
        batch_size=config.batch_size, seed=config.seed, limit=config.limit
    )
    model = models.load_pretrained_classifier()  # with internet: from_pretrained("distilbert-base-cased")
    if not config.dropout:
        parallel.without_dropout(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    # Counted in batches before prepare(): on N processes the prepared scheduler
    # steps N times per optimizer step, so the schedule spans the same examples whatever N.
    num_training_steps = config.num_epochs * len(train_dataloader)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_then_decay(num_warmup_steps=int(0.1 * num_training_steps), num_training_steps=num_training_steps)
    )
    # prepare() wraps the model for data parallelism and gives each process its shard of the data.
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    losses = []
    start = time.perf_counter()
    for epoch in range(config.num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            # zero_grad first, so that the last step's gradients are still there for the reports below.
            optimizer.zero_grad()
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
    train_seconds = time.perf_counter() - start

    model.eval()
    correct, total = 0, 0
    for step, batch in enumerate(eval_dataloader):
        with torch.no_grad():
            outputs = model(**batch)
        predictions = outputs.logits.argmax(dim=-1)
        # Each process scored its own shard: collect every process's predictions (without the repeats) first.
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        correct += (predictions == references).sum().item()
        total += references.numel()
    accuracy = correct / total
    accelerator.print(f"validation accuracy {accuracy:.4f} after {config.num_epochs} epochs")

    # ---- Lesson 6's evidence: what each process saw (a training script would end above) ----
    unwrapped = accelerator.unwrap_model(model)
    report = parallel.report_process(accelerator, unwrapped, num_batches=len(train_dataloader), last_loss=losses[-1])
    reports = parallel.gather_reports(accelerator, report)
    shard_accuracy = _accuracy_without_gathering(model, eval_dataloader)
    baseline = _majority_class_accuracy(eval_dataloader.dataset["labels"])
    return TrainingResult(
        report, reports, accuracy, shard_accuracy, baseline, losses, train_seconds, parallel.parameters_of(unwrapped)
    )


@torch.no_grad()
def _accuracy_without_gathering(model, eval_dataloader) -> float:
    """Return the accuracy of ``model`` on this process's shard of ``eval_dataloader`` only (fraction)."""
    correct = total = 0
    for batch in eval_dataloader:
        predictions = model(**batch).logits.argmax(dim=-1)
        correct += (predictions == batch["labels"]).sum().item()
        total += batch["labels"].numel()
    return correct / total


def _majority_class_accuracy(labels) -> float:
    """Return the accuracy of always predicting the most frequent of ``labels`` (fraction)."""
    labels = torch.tensor(list(labels))
    return labels.bincount().max().item() / labels.numel()


# --------------------------------------------------------------------------- the command line


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser of ``python -m course_utils.train``."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.train",
        description=(
            "Fine-tune the course's tiny DistilBERT on the paraphrase data, on one process or several. "
            "Several processes: accelerate launch --multi_gpu --num_processes 2 --num_machines 1 "
            "--mixed_precision no --dynamo_backend no -m course_utils.train --cpu"
        ),
    )
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size,
                        help=f"examples per batch on each process (default {defaults.batch_size})")
    parser.add_argument("--epochs", type=int, default=defaults.num_epochs,
                        help=f"passes over the training data (default {defaults.num_epochs})")
    parser.add_argument("--limit", type=int, default=0,
                        help="train on the first LIMIT examples only (default 0: all)")
    parser.add_argument("--lr", type=float, default=defaults.lr, help=f"peak learning rate (default {defaults.lr})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"random seed (default {defaults.seed})")
    parser.add_argument("--cpu", action="store_true",
                        help="train on the CPU even if a GPU is present; needed for several processes without a GPU")
    parser.add_argument("--no-dropout", action="store_true",
                        help="turn dropout off, so that runs on different numbers of processes can be compared exactly")
    measuring = parser.add_argument_group("measurements (used by the course's tests and benchmarks)")
    measuring.add_argument("--threads", type=int, default=None,
                           help="threads each process computes with (default: PyTorch's choice; launchers of "
                                "several processes set 1)")
    measuring.add_argument("--save-parameters", type=Path, default=None, metavar="PATH",
                           help="save the trained parameters (a dict of tensors, torch.save) to PATH")
    measuring.add_argument("--metrics-json", type=Path, default=None, metavar="PATH",
                           help="write the validation accuracy, the training time and the settings to PATH (JSON)")
    return parser


def main(argv: list[str] | None = None) -> TrainingResult:
    """Run the command line: parse ``argv``, train, print the reports and accuracy once; return the result."""
    from course_utils import command_line, launcher

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be a positive int, got {args.threads}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    launcher.silence_library_progress_bars()  # one bar per process would interleave
    config = TrainConfig(
        batch_size=args.batch_size, num_epochs=args.epochs, limit=args.limit or None, lr=args.lr,
        seed=args.seed, cpu=args.cpu, dropout=not args.no_dropout,
    )
    # The Accelerator of training_function() is the one this process will have (Accelerate's
    # state is shared by every Accelerator of a process): check it before training alone.
    accelerator = Accelerator(cpu=config.cpu)
    command_line.check_process_group(accelerator)
    result = training_function(config)
    # accelerator.print prints on the main process only: one copy of each line.
    accelerator.print(parallel.format_reports(result.reports))
    accelerator.print(parallel.diagnose_launch(result.reports, accelerator.num_processes))
    epochs, processes = config.num_epochs, accelerator.num_processes
    accelerator.print(
        f"trained {epochs} epoch{'s' if epochs != 1 else ''} in {result.train_seconds:.1f} s on {processes} "
        f"process{'es' if processes != 1 else ''}, {config.batch_size} examples per batch per process; "
        f"majority-class baseline {result.baseline:.4f}"
    )
    if accelerator.is_main_process:
        _save_measurements(args, config, result, accelerator.num_processes)
    # A worker was once seen to abort at exit, after its work was done
    # ("terminate called without an active exception": a C++ thread destroyed
    # unjoined, likely one of the process group's). So the teardown happens in
    # a fixed order while Python still runs: all processes get here, the
    # Accelerator lets go of the model, optimizer and dataloaders, and only then
    # is the group destroyed.
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    accelerator.end_training()
    return result


def _save_measurements(args, config: TrainConfig, result: TrainingResult, num_processes: int) -> None:
    """Write what --save-parameters and --metrics-json ask for (the tests' and benchmarks' options)."""
    if args.save_parameters is not None:
        torch.save(result.parameters, args.save_parameters)
    if args.metrics_json is not None:
        summary = {
            "accuracy": result.accuracy,
            "baseline": result.baseline,
            "train_seconds": result.train_seconds,
            "num_processes": num_processes,
            "threads_per_process": torch.get_num_threads(),
            "batch_size_per_process": config.batch_size,
            "num_epochs": config.num_epochs,
            "steps": len(result.losses),
        }
        args.metrics_json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    try:
        main()
    except Exception as error:
        from course_utils.launcher import LaunchError

        if isinstance(error, LaunchError):
            # A known mistake in how the processes were launched: the message says what to do.
            sys.exit(f"error: {error}")
        raise
