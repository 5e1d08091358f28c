"""Exercises of lesson 7: sharded data parallelism, checked against launched runs.

- ``q1``: the bytes of AdamW state one process holds under ZeRO-1 on 3 processes,
  checked against what each process of a launched run held;
- ``q2``: shard a DistilBERT with ``fully_shard`` per block, then the root;
  launched on 2 processes, checked by what each process held and that it
  trained the model one process trains.

Both checks launch processes (a few seconds each), so they need what any
launch needs: no ``Accelerator`` and no bitsandbytes in the notebook's own process.
"""

from __future__ import annotations

import functools
import math

from course_utils import parallel, sharding
from course_utils.validation import check_int_in_range
from course_utils.exercises.core import Exercise, Incorrect, as_number, describe_value

Q1_PROCESSES = 3
Q2_PROCESSES = 2
TOLERANCE = 1e-5  # largest parameter difference from one process that rounding explains (lesson: about 1e-6)


@functools.cache
def _zero1_run(num_processes: int) -> tuple:
    """Return the ProcessMemory of every process of a ZeRO-1 run on ``num_processes`` (launched once, then kept)."""
    return tuple(parallel.launch(sharding.train_with_strategy, ("zero1",), num_processes=num_processes, quiet=True,
                                 oversubscribe=True, timeout=120))


def zero1_assignment(num_processes: int = Q1_PROCESSES) -> list[list[tuple[int, ...]]]:
    """Return, per process of a launched ZeRO-1 run, the shapes of the parameters whose state it holds."""
    check_int_in_range(num_processes, "num_processes", 2, 16)  # ZeRO-1 shards over two or more; more would crowd the machine
    return [list(process.optimizer_shapes) for process in _zero1_run(num_processes)]


class LaunchedExercise(Exercise):
    """An exercise whose check launches processes, under a time limit; launch failures become ``Incorrect``."""

    time_limit_s = 120.0

    def launch_for_check(self, function, args=(), num_processes=2):
        try:
            return parallel.launch(function, args, num_processes=num_processes, quiet=True,
                                   timeout=self.time_limit_s, oversubscribe=True)
        except parallel.LaunchError as error:
            raise Incorrect(f"The check could not launch the workers: {error}") from error
        except parallel.WorkerTimeout:
            raise Incorrect(
                f"Your code was still running after {self.time_limit_s:g} s in the workers, so the check stopped "
                "them. Does every process call `fully_shard` on the same modules?"
            ) from None
        except parallel.WorkerError as error:
            raise Incorrect(f"Your function failed in a worker: {error}. Fix it, run the cell again, then check again.") from None


# --------------------------------------------------------------------------- q1


class Zero1OptimizerBytes(Exercise):
    title = "Exercise 1"
    variables = ["optimizer_bytes"]
    time_limit_s = 120.0
    hints = [
        "AdamW keeps, for every parameter tensor it updates, `exp_avg` and `exp_avg_sq` (shaped like the tensor) and "
        "a `step` counter.",
        "In fp32 each element takes 4 bytes; the `step` counter is a 0-d fp32 tensor: 4 bytes per tensor.",
        "`sum(2 * 4 * math.prod(shape) + 4 for shape in shapes)`",
    ]
    solution_code = """
        def optimizer_bytes(shapes):
            return sum(2 * 4 * math.prod(shape) + 4 for shape in shapes)
    """
    correct_message = (
        "Each process holds the state of its own tensors only: about a third of the whole, not exactly, because "
        "whole tensors are assigned."
    )

    def check_answer(self, optimizer_bytes):
        if not callable(optimizer_bytes):
            raise Incorrect(f"`optimizer_bytes` should be a function, but it is {describe_value(optimizer_bytes)}.")
        try:
            processes = _zero1_run(Q1_PROCESSES)
        except (parallel.LaunchError, parallel.WorkerError, parallel.WorkerTimeout) as error:
            raise Incorrect(f"The check could not launch the ZeRO-1 run it compares with: {error}") from None
        for process in processes:
            shapes = [tuple(shape) for shape in process.optimizer_shapes]
            got = self.call_learner(optimizer_bytes, [tuple(shape) for shape in shapes])
            number = as_number(got)
            if number is None:
                raise Incorrect(f"`optimizer_bytes` should return one number of bytes, but it returned {describe_value(got)}.")
            value = number[0]
            expected = process.optimizer_state
            if value == expected:  # exact: bytes are whole numbers, and a NaN equals nothing
                continue
            elements = sum(math.prod(shape) for shape in shapes)
            raise Incorrect(self._diagnose(value, expected, elements, len(shapes), process.rank))
        return None

    @staticmethod
    def _diagnose(value, expected, elements, tensors, rank) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return f"For process {rank}, your function gives {value}, which is no number of bytes."
        where = f"For process {rank} (its {tensors} tensors), your function gives {value:,}"
        if value == expected - 4 * tensors:
            return f"{where}: that leaves out AdamW's `step` counter, one 4-byte tensor per parameter tensor."
        if value == 4 * elements + 4 * tensors or value == 4 * elements:
            return f"{where}: that is one moment; AdamW keeps two (`exp_avg` and `exp_avg_sq`)."
        if value in (2 * elements + tensors, 2 * elements):
            return f"{where}: that counts elements; each fp32 element takes 4 bytes."
        if value in (16 * elements + 4 * tensors, 16 * elements, 12 * elements + 4 * tensors):
            return (f"{where}: that adds the parameters or gradients; the question is the optimizer state only "
                    "(ZeRO-1 does not shard the others).")
        return f"{where}, which is not the bytes of AdamW state the launched process held."


# --------------------------------------------------------------------------- q2


def _train_with(shard):
    """What each worker of exercise 2 runs: ZeRO-3 training with the learner's ``shard`` function."""
    return sharding.train_with_strategy("zero3", shard_function=shard)


class ShardPerBlock(LaunchedExercise):
    title = "Exercise 2"
    variables = ["shard"]
    hints = [
        "FSDP2 gathers and frees parameters one *unit* at a time, and a unit is a module `fully_shard` was applied to.",
        "Apply `fully_shard(block, mesh=mesh)` to each block of `model.distilbert.transformer.layer`, then "
        "`fully_shard(model, mesh=mesh)` once, for what is left (embeddings, classifier).",
        "```python\nfor block in model.distilbert.transformer.layer:\n    fully_shard(block, mesh=mesh)\n"
        "fully_shard(model, mesh=mesh)\n```",
    ]
    solution_code = """
        def shard(model, mesh):
            for block in model.distilbert.transformer.layer:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model
    """
    correct_message = (
        "Each process holds half of the parameters between steps, each block is gathered only while it runs, "
        "and the training matches one process's."
    )

    def check_answer(self, shard):
        if not callable(shard):
            raise Incorrect(f"`shard` should be a function, but it is {describe_value(shard)}.")
        processes = self.launch_for_check(_train_with, (shard,), num_processes=Q2_PROCESSES)
        blocks = len(sharding.sharded_blocks(sharding.course_model()))
        whole = 4 * sum(p.numel() for p in sharding.course_model().parameters())
        units = processes[0].fsdp_units
        if units == 0:
            raise Incorrect("No module was sharded: call `fully_shard` in `shard`, on the blocks and then on the model.")
        held = max(process.parameters for process in processes)
        # Sharded, each process holds 1/N of the parameters, plus the padding of dim 0 (well under 1 % here).
        if not held * Q2_PROCESSES <= whole * 1.01:
            if units == blocks:
                raise Incorrect(
                    "The blocks are sharded, but the parameters outside them (embeddings, classifier) are whole in "
                    "every process: apply `fully_shard` to the model itself too, after the blocks."
                )
            raise Incorrect(
                f"A process still holds {held / whole:.0%} of the parameters: some parameters are outside every "
                "module you sharded. Shard the root model too."
            )
        if units == 1:
            raise Incorrect(
                "Only one unit: the whole model is gathered at once in the forward and backward passes, so the peak "
                "holds every parameter. Shard each block first, then the root."
            )
        reference = _one_process()
        gap = parallel.max_parameter_difference(reference, processes[0].final_parameters,
                                                skip=parallel.NOISE_ONLY_PARAMETERS)
        if not gap <= TOLERANCE:
            raise Incorrect(
                f"The processes held their shards, but their training differs from one process's by {gap:.2g}: "
                "did `shard` change the model or its parameters?"
            )
        return None


@functools.cache
def _one_process() -> dict:
    """Return the final parameters of the one-process reference run (launched once, then kept)."""
    return parallel.launch(sharding.train_one_process, num_processes=1, quiet=True)[0]["final_parameters"]


q1 = Zero1OptimizerBytes()
q2 = ShardPerBlock()
