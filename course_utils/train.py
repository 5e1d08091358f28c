"""Fine-tune the course classifier from the command line, on one process or several (lesson 4).

One process::

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

Every process runs :func:`train_on_this_process`; the main process prints the
per-process reports and the validation metrics, once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrainConfig", "TrainingResult", "train_on_this_process", "build_parser", "main"]


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run. ``batch_size`` is per process, as Accelerate counts it.

    ``limit`` keeps the first ``limit`` training examples (None: all);
    ``dropout=False`` turns dropout off, which makes runs on different numbers
    of processes comparable number for number (see ``parallel.without_dropout``).
    """

    batch_size: int = 16
    num_epochs: int = 2
    limit: int | None = 512
    lr: float = 1e-3
    seed: int = 0
    cpu: bool = False
    dropout: bool = True
    show_progress: bool = False

    def __post_init__(self):
        for name in ("batch_size", "num_epochs", "seed"):
            value = getattr(self, name)
            minimum = 0 if name == "seed" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1):
            raise ValueError(f"limit must be a positive int or None, got {self.limit!r}")
        if not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")


@dataclass
class TrainingResult:
    """What one process returns after :func:`train_on_this_process`.

    - ``report``: this process's ``parallel.ProcessReport``;
    - ``reports``: the reports of every process of its group, in rank order;
    - ``metrics``: validation ``{"accuracy", "f1"}`` (fractions) over the whole split;
    - ``losses``: the loss of every step on this process;
    - ``train_seconds``: wall time of the training loop (seconds), the same on every process;
    - ``parameters``: the trained parameters of this process's copy (``parallel.parameters_of``).
    """

    report: object
    reports: list
    metrics: dict
    losses: list[float]
    train_seconds: float
    parameters: dict = field(repr=False)


def train_on_this_process(config: TrainConfig, accelerator=None) -> TrainingResult:
    """Fine-tune the tiny checkpoint on the paraphrase data with ``config``; return this process's result.

    Every process of a launch runs this same function; Accelerate gives each
    one its shard of the data and averages the gradients. Without
    ``accelerator``, it creates ``Accelerator(cpu=config.cpu)``.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from course_utils import data, loops, models, parallel

    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    accelerator = accelerator or Accelerator(cpu=config.cpu)
    # Same seed in every process: the model copies start identical, and the
    # seeded shuffle gives every process the same order to take its shard from.
    set_seed(config.seed)
    model = models.load_pretrained_classifier()
    if not config.dropout:
        parallel.without_dropout(model)
    train_dataloader, eval_dataloader = data.make_dataloaders(
        batch_size=config.batch_size, seed=config.seed, limit=config.limit
    )
    # Counted in batches of the dataloader before prepare(): on N processes the
    # prepared scheduler steps N times per optimizer step, so the schedule
    # spans the same examples whatever N.
    num_training_steps = config.num_epochs * len(train_dataloader)
    optimizer, lr_scheduler = loops.make_optimizer_and_scheduler(model, num_training_steps, lr=config.lr)

    accelerator.wait_for_everyone()
    start = time.perf_counter()
    losses = loops.train_accelerate(
        model, optimizer, lr_scheduler, train_dataloader, config.num_epochs,
        accelerator=accelerator, show_progress=config.show_progress,
    )
    accelerator.wait_for_everyone()
    train_seconds = time.perf_counter() - start

    report = parallel.report_process(
        accelerator, model, num_batches=len(losses) // config.num_epochs, last_loss=losses[-1]
    )
    reports = parallel.gather_reports(accelerator, report)
    # Each process scores its own shard of the validation split;
    # evaluate() gathers the predictions (gather_for_metrics) before scoring.
    metrics = loops.evaluate(model, accelerator.prepare(eval_dataloader), accelerator)
    return TrainingResult(report, reports, metrics, losses, train_seconds, parallel.parameters_of(model))


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
    parser.add_argument("--limit", type=int, default=defaults.limit,
                        help=f"train on the first LIMIT examples only (default {defaults.limit}; 0 for all)")
    parser.add_argument("--lr", type=float, default=defaults.lr, help=f"peak learning rate (default {defaults.lr})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"random seed (default {defaults.seed})")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads each process computes with (default: PyTorch's choice; launchers of several "
                             "processes set 1)")
    parser.add_argument("--cpu", action="store_true",
                        help="train on the CPU even if a GPU is present; needed for several processes without a GPU")
    parser.add_argument("--no-dropout", action="store_true",
                        help="turn dropout off, so that runs on different numbers of processes can be compared exactly")
    parser.add_argument("--save-parameters", type=Path, default=None, metavar="PATH",
                        help="save the trained parameters (a dict of tensors, torch.save) to PATH")
    parser.add_argument("--metrics-json", type=Path, default=None, metavar="PATH",
                        help="write the validation metrics, the training time and the settings to PATH (JSON)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    return parser


def main(argv: list[str] | None = None) -> TrainingResult:
    """Run the command line: parse ``argv``, train, print the reports and metrics once; return the result."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be a positive int, got {args.threads}")
    # Imported after parsing, so that --help answers without loading torch.
    import torch
    from accelerate import Accelerator

    from course_utils import parallel

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    parallel.silence_library_progress_bars()  # one bar per process would interleave
    config = TrainConfig(
        batch_size=args.batch_size, num_epochs=args.epochs, limit=args.limit or None, lr=args.lr,
        seed=args.seed, cpu=args.cpu, dropout=not args.no_dropout, show_progress=args.progress,
    )
    accelerator = Accelerator(cpu=config.cpu)
    parallel.check_process_group(accelerator)
    result = train_on_this_process(config, accelerator)
    # accelerator.print prints on the main process only: one copy of each line.
    accelerator.print(parallel.format_reports(result.reports))
    accelerator.print(parallel.diagnose_launch(result.reports, accelerator.num_processes))
    accelerator.print(
        f"trained {config.num_epochs} epochs in {result.train_seconds:.1f} s on {accelerator.num_processes} "
        f"process(es), {config.batch_size} examples per batch per process"
    )
    accelerator.print(
        f"validation accuracy {result.metrics['accuracy']:.4f}, F1 {result.metrics['f1']:.4f}"
    )
    if accelerator.is_main_process:
        if args.save_parameters is not None:
            torch.save(result.parameters, args.save_parameters)
        if args.metrics_json is not None:
            summary = {
                **result.metrics,
                "train_seconds": result.train_seconds,
                "num_processes": accelerator.num_processes,
                "threads_per_process": torch.get_num_threads(),
                "batch_size_per_process": config.batch_size,
                "num_epochs": config.num_epochs,
                "steps": len(result.losses),
            }
            args.metrics_json.write_text(json.dumps(summary, indent=2))
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


if __name__ == "__main__":
    try:
        main()
    except Exception as error:
        from course_utils.parallel import LaunchError

        if isinstance(error, LaunchError):
            # A known mistake in how the processes were launched: the message says what to do.
            sys.exit(f"error: {error}")
        raise
