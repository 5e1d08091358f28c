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

import torch

from course_utils import parallel, sharding
from course_utils.validation import check_instance, check_int_in_range
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


def _not_a_function(name: str, arguments: str, value: object) -> str:
    """Return the diagnosis of an exercise answer that should be a function ``name(arguments)`` but is ``value``."""
    if isinstance(value, str):
        return (f"`{name}` is a string ({describe_value(value)}), not code that runs: define it with "
                f"`def {name}({arguments}):` and run the cell.")
    return f"`{name}` should be a function `{name}({arguments})`, but it is {describe_value(value)}."


def _not_a_number_of_bytes(got: object) -> str:
    """Return the diagnosis of ``optimizer_bytes`` returning ``got``, which is not one number."""
    if got is None:
        return "`optimizer_bytes` returned None: end it with `return` and the number of bytes."
    if isinstance(got, str):
        return (f"`optimizer_bytes` returned a string ({describe_value(got)}): return the number of bytes itself, "
                "an int, not text.")
    return f"`optimizer_bytes` should return one number of bytes, but it returned {describe_value(got)}."


class LaunchedExercise(Exercise):
    """An exercise whose check launches processes, under a time limit; launch failures become ``Incorrect``."""

    time_limit_s = 120.0
    launch_cause = "Does every process call `fully_shard` on the same modules?"  # the likely cause of a hang

    def launch_for_check(self, function, args=(), num_processes=2):
        try:
            return parallel.launch(function, args, num_processes=num_processes, quiet=True,
                                   timeout=self.time_limit_s, oversubscribe=True)
        except parallel.LaunchError as error:
            raise Incorrect(f"The check could not launch the workers: {error}") from error
        except parallel.WorkerTimeout:
            raise Incorrect(
                f"Your code was still running after {self.time_limit_s:g} s in the workers, so the check stopped "
                f"them. {self.launch_cause}"
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
            raise Incorrect(_not_a_function("optimizer_bytes", "shapes", optimizer_bytes))
        try:
            processes = _zero1_run(Q1_PROCESSES)
        except (parallel.LaunchError, parallel.WorkerError, parallel.WorkerTimeout) as error:
            raise Incorrect(f"The check could not launch the ZeRO-1 run it compares with: {error}") from None
        for process in processes:
            shapes = [tuple(shape) for shape in process.optimizer_shapes]
            got = self.call_learner(optimizer_bytes, [tuple(shape) for shape in shapes])
            number = as_number(got)
            if number is None:
                raise Incorrect(_not_a_number_of_bytes(got))
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
    """What each worker of exercise 2 runs: ZeRO-3 training with the learner's ``shard``.

    Returns (the process's ``ProcessMemory``, a description of what ``shard``
    returned when that was not a module, else None). A ``shard`` that shards in
    place but forgets ``return model`` still trains, on the model it sharded.
    """
    returned = []

    def recording(model, mesh):
        result = shard(model, mesh)
        returned.append(result)
        return result if isinstance(result, torch.nn.Module) else model

    held = sharding.train_with_strategy("zero3", shard_function=recording)
    return held, None if isinstance(returned[0], torch.nn.Module) else describe_value(returned[0])


def blocks_without_a_unit(unit_names, model: torch.nn.Module) -> list[int]:
    """Return the indices of ``model``'s blocks whose parameters are not all gathered by a unit inside the block.

    ``unit_names``: the names of the modules ``fully_shard`` was applied to
    (``""``: the root). A parameter is gathered by the innermost unit that
    contains it; a block passes when that unit is the block or one of its
    submodules, for every parameter of the block, so it is gathered apart from
    the root and from every other block.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if (isinstance(unit_names, (str, bytes)) or not hasattr(unit_names, "__iter__")
            or not all(isinstance(n, str) for n in unit_names)):
        raise TypeError(f"unit_names must be a collection of module names (str), got {unit_names!r}")
    names = {id(module): name for name, module in model.named_modules()}
    units = sorted(unit_names, key=len, reverse=True)  # the innermost unit first

    def unit_of(parameter_name: str) -> str | None:
        return next((unit for unit in units if unit == "" or parameter_name.startswith(unit + ".")), None)

    missing = []
    for index, block in enumerate(sharding.sharded_blocks(model)):
        prefix = names[id(block)]
        gathered_by = {unit_of(f"{prefix}.{name}") for name, _ in block.named_parameters()}
        if not all(unit is not None and (unit == prefix or unit.startswith(prefix + ".")) for unit in gathered_by):
            missing.append(index)
    return missing


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
            raise Incorrect(_not_a_function("shard", "model, mesh", shard))
        launched = self.launch_for_check(_train_with, (shard,), num_processes=Q2_PROCESSES)
        processes = [held for held, _ in launched]
        returned = launched[0][1]
        if returned is not None:
            raise Incorrect(f"`shard` returned {returned}, not the model: end it with `return model`, so that the "
                            "caller trains the model you sharded.")
        model = sharding.course_model()
        blocks = sharding.sharded_blocks(model)
        whole = 4 * sum(p.numel() for p in model.parameters())
        units = processes[0].fsdp_unit_names
        if not units:
            raise Incorrect("No module was sharded: call `fully_shard` in `shard`, on the blocks and then on the model.")
        held = max(process.parameters for process in processes)
        # Sharded, each process holds 1/N of the parameters, plus the padding of dim 0 (well under 1 % here).
        if not held * Q2_PROCESSES <= whole * 1.01:
            if not blocks_without_a_unit(units, model):
                raise Incorrect(
                    "The blocks are sharded, but the parameters outside them (embeddings, classifier) are whole in "
                    "every process: apply `fully_shard` to the model itself too, after the blocks."
                )
            raise Incorrect(
                f"A process still holds {held / whole:.0%} of the parameters: some parameters are outside every "
                "module you sharded. Shard the root model too."
            )
        if units == ("",):
            raise Incorrect(
                "Only one unit: the whole model is gathered at once in the forward and backward passes, so the peak "
                "holds every parameter. Shard each block first, then the root."
            )
        missing = blocks_without_a_unit(units, model)
        if missing:
            which = ", ".join(str(index) for index in missing)
            others = [name for name in units if name != ""]
            raise Incorrect(
                f"Block{'s' if len(missing) > 1 else ''} {which} of the {len(blocks)} in "
                "`model.distilbert.transformer.layer` "
                f"{'are not units' if len(missing) > 1 else 'is not a unit'} of its own (you sharded "
                f"{', '.join(f'`{name}`' for name in others) or 'only the root'}, then the root): its parameters are "
                "gathered with the root's, for the whole forward and backward pass. Apply `fully_shard` to every "
                "block, then to the model."
            )
        reference = _one_process()
        gap = parallel.max_parameter_difference(reference, processes[0].final_parameters,
                                                skip=parallel.NOISE_ONLY_PARAMETERS)
        if not math.isfinite(gap):
            raise Incorrect(
                "The processes held their shards, but the trained parameters are not finite numbers (NaN or inf): "
                "did `shard` change the parameters' values?"
            )
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
