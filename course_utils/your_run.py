"""The training script lesson 10 writes for a learner's own run: one model from a config.json, one layout, the course's loop.

Every process runs :func:`training_function`, as in :mod:`course_utils.train`
(lesson 6): build the accelerator, the model, the optimizer, prepare, the loop.
On GPUs the layout is Accelerate's: the config file lesson 10 writes
(:func:`course_utils.launch_files.accelerate_config`) tells ``accelerate launch``
DDP or FSDP2, and ``prepare`` applies it. On CPU processes Accelerate 1.15 does
not shard (it gives plain DDP and says nothing), so there, for a sharded layout,
the script calls torch's ``fully_shard`` itself (``layouts.apply_layout``), as lesson 7 does: the same FSDP2
that Accelerate's plugin applies on GPUs.

Eight GPUs, the config file lesson 10 wrote::

    accelerate launch --config_file accelerate_config.yaml -m course_utils.your_run --model "Llama 3.1 8B"

The batches are token ids drawn at random in the model's vocabulary, shaped as
the plan's (``memory.training_batch``): a run's memory and speed do not depend on
which tokens it reads. Your own data goes where the comment says. The weights
start random (``from_config``); to fine-tune, ``from_pretrained`` the checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from course_utils import memory, plan, sharding
from course_utils.validation import check_bool, check_choice, check_non_negative_int, check_positive_int

__all__ = ["RunConfig", "training_function", "main"]

SHARDED = ("zero2", "zero3", "fsdp")
"""The layouts FSDP2 runs: ZeRO-2 keeps the gathered weights after the forward pass, ZeRO-3 (FSDP) frees them."""


@dataclass(frozen=True)
class RunConfig:
    """One run: ``model`` (a shipped name or a config.json), ``layout`` (``ddp`` or a layout of :data:`SHARDED`),
    ``batch_size`` sequences per process of ``seq_len`` tokens, ``steps`` optimizer steps; ``cpu``: CPU processes
    over gloo; ``measure``: before the loop, measure two steps' memory per process, as the planner plans them;
    ``checkpointing``: activation checkpointing on every block."""

    model: str
    layout: str = "zero3"
    batch_size: int = 1
    seq_len: int = 512
    steps: int = 2
    lr: float = 1e-5
    seed: int = 0
    cpu: bool = False
    measure: bool = False
    checkpointing: bool = False

    def __post_init__(self) -> None:
        check_choice(self.layout, "layout", ("ddp", *SHARDED))
        check_positive_int(self.batch_size, "batch_size")
        check_positive_int(self.seq_len, "seq_len")
        check_positive_int(self.steps, "steps")
        check_non_negative_int(self.seed, "seed")
        check_bool(self.cpu, "cpu")
        check_bool(self.measure, "measure")
        check_bool(self.checkpointing, "checkpointing")


def training_function(run: RunConfig):
    """Train ``run`` on this process; return its losses and, with ``run.measure``, its measured ``memory.TrainingMemory``."""
    accelerator = Accelerator(cpu=run.cpu)
    set_seed(run.seed)  # the same random weights in every process
    # Built whole on each process, then sharded: for weights that fit one device. To fine-tune a checkpoint larger
    # than that: AutoModelForCausalLM.from_pretrained(<repository>) with the config file's
    # fsdp_cpu_ram_efficient_loading (process 0 reads the weights, prepare() hands each process its shard).
    # Under Accelerate's FSDP the config file's fsdp_activation_checkpointing turns checkpointing on; elsewhere, here.
    checkpointing = run.checkpointing and accelerator.distributed_type != DistributedType.FSDP
    model = plan.load_model(run.model, "fp32", checkpointing).to_empty(device=accelerator.device)
    model.init_weights()
    if run.cpu and run.layout in SHARDED and accelerator.distributed_type == DistributedType.MULTI_CPU:
        # Accelerate 1.15 does not shard on CPU: shard each block, then the root, with torch's FSDP2 (lesson 7),
        # through the course's one way of laying a model out, which the planner follows too.
        from course_utils.layouts import Layout, apply_layout

        layout = Layout.of(run.layout, accelerator.num_processes)  # ZeRO-2 keeps the gathered weights, ZeRO-3 frees them
        model = apply_layout(model, layout, sharding.sharded_blocks(model))
        optimizer = memory.make_optimizer("adamw", list(model.parameters()), lr=run.lr)
    else:
        # On GPUs prepare() applies the config file's layout (DDP, or FSDP2 with its options).
        optimizer = memory.make_optimizer("adamw", list(model.parameters()), lr=run.lr)
        model, optimizer = accelerator.prepare(model, optimizer)

    model.train()
    measured = None
    if run.measure:
        # Two steps under torch's memory trackers first (a warm-up, then the measured one), as the planner follows
        # them (lesson 7's measurement). First, because DDP builds its gradient buckets anew in its second forward
        # pass: later, the tracker would start after they were made and never see them.
        batch = memory.training_batch(accelerator.unwrap_model(model), run.batch_size, run.seq_len,
                                      torch.Generator().manual_seed(run.seed + accelerator.process_index))
        batch = {name: tensor.to(accelerator.device) for name, tensor in batch.items()}
        torch_optimizer = getattr(optimizer, "optimizer", optimizer)
        if run.layout in SHARDED:
            measured = memory.measure_fsdp_step(model, torch_optimizer, batch,
                                                memory.TrainingSetup("adamw", run.batch_size, run.seq_len))
        else:
            measured = memory.measure_training_step_peak(model, torch_optimizer, batch)
    losses = []
    for step in range(run.steps):
        # Your data here: a prepared DataLoader of tokenised text, `for step, batch in enumerate(train_dataloader)`.
        # Each process draws its own batch, as a prepared DataLoader would give each its own shard.
        generator = torch.Generator().manual_seed(run.seed + step * accelerator.num_processes + accelerator.process_index)
        batch = memory.training_batch(accelerator.unwrap_model(model), run.batch_size, run.seq_len, generator)
        batch = {name: tensor.to(accelerator.device) for name, tensor in batch.items()}
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(outputs.loss.item())

    return {"losses": losses, "memory": measured, "rank": accelerator.process_index,
            "processes": accelerator.num_processes}


def main(argv: list[str] | None = None) -> int:
    """Run the script with ``argv`` (default ``sys.argv[1:]``) on this process; return its exit status."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.your_run", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a shipped model name or a config.json")
    parser.add_argument("--layout", default="zero3", choices=("ddp", *SHARDED))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on every block")
    arguments = parser.parse_args(argv)
    result = training_function(RunConfig(arguments.model, arguments.layout, arguments.batch_size, arguments.seq_len,
                                         arguments.steps, cpu=arguments.cpu, checkpointing=arguments.checkpointing))
    if result["rank"] == 0:
        print(f"{result['processes']} processes, losses {', '.join(f'{loss:.4f}' for loss in result['losses'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
