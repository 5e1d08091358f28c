"""One process's step under tensor parallelism, followed on fake tensors (lesson 9).

Under tensor parallelism (:class:`course_utils.layouts.Layout`'s ``tp``, with
or without ``sequence_parallel``) each process holds its share of every
split layer (DTensor's ``parallelize_module``, by the plan
``layouts.tensor_parallel_plan`` reads for the model) and all of what is not
split (embeddings, norms, head), and runs the whole batch. What it holds
through a step is followed as torchtitan's estimator follows it: in a *fake*
process group of ``world_size`` processes in this one process, as process
``rank`` (collectives return at once, nothing is sent), the model copied to
the meta device and laid out there by ``layouts.apply_layout``, the
function the lesson's launched runs call (``per_process.sharded_fake_copy``),
then given fake storage, and the step of
``training_memory.measure_training_step_peak`` (a warm-up step, then the
measured step under the course's MemTracker) run on it: the real run's
measurement, on tensors with no data. A deep model is followed as the probes'
copies with its first blocks and extrapolated (``probes``), as for one process.

Checked to the byte against real gloo runs of the same step (``tests/memory/test_planner_tensor_parallel.py``).
"""

from __future__ import annotations

import torch

from course_utils.layouts import Layout, tensor_parallel_plan
from course_utils.memory.fake_tensors import an_unpadded_batch, fake_optimizer, quietly
from course_utils.memory.plan_cache import Fingerprint, PlannerRefused, cache
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import default_loss
from course_utils.memory.training_memory import TrainingMemory, _measure_step_and_micro_batches, training_batch
from course_utils.validation import check_instance, check_int_in_range

__all__ = ["refuse_what_is_not_split", "tensor_parallel_probe"]


def tensor_parallel_probe(model: torch.nn.Module, setup: TrainingSetup, layers: int | None, layout: Layout,
                          rank: int = 0, fingerprint: Fingerprint | None = None) -> tuple[TrainingMemory, list]:
    """Return process ``rank``'s step under ``layout`` (``tp`` > 1) on the first ``layers`` blocks of ``model`` (all if None).

    In bytes; the second element is each micro-batch's (forward peak, backward
    peak), for :func:`course_utils.memory.probes.extrapolate`. Cached by
    ``fingerprint`` (the model's, taken by the caller) when given.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(setup, "setup", TrainingSetup, "a TrainingSetup")
    check_instance(layout, "layout", Layout, "a Layout")
    if layout.tp == 1:
        raise ValueError("layout must split layers over processes (tp >= 2), got tp=1")
    check_int_in_range(rank, "rank", 0, layout.world_size - 1)
    refuse_what_is_not_split(model, layout)
    if fingerprint is None:
        return quietly(_follow, model, setup, layers, layout, rank)
    key = ("tensor parallel step", fingerprint.passes, setup, layout, rank, layers)
    if key not in cache:
        cache[key] = quietly(_follow, model, setup, layers, layout, rank)
    return cache[key]


def refuse_what_is_not_split(model: torch.nn.Module, layout: Layout) -> None:
    """Raise :class:`PlannerRefused`, with the reason, where ``layout``'s tensor parallelism does not apply to ``model``.

    A model with no plan (``layouts.tensor_parallel_plan``), or data parallelism by DDP over its split layers.
    """
    if layout.wraps_in_ddp:
        raise PlannerRefused(f"layout: strategy {layout.strategy!r} with tp={layout.tp} is not planned (the course does "
                             f"not wrap split layers in DDP); plan 'zero2' or 'zero3' over the data-parallel processes")
    try:
        tensor_parallel_plan(model, layout.sequence_parallel)
    except ValueError as error:
        raise PlannerRefused(str(error)) from error


def _follow(model, setup, layers, layout, rank):
    # Imported here: per_process imports this module (its branch for tensor parallelism).
    from course_utils.memory.per_process import sharded_fake_copy

    with sharded_fake_copy(model, layout, rank, layers) as (copy, mode):
        optimizer = fake_optimizer(copy, setup, mode)
        with mode, an_unpadded_batch():
            batch = training_batch(copy, setup.batch_size, setup.seq_len)
            return _measure_step_and_micro_batches(copy, optimizer, batch, default_loss, setup.mixed_precision,
                                                   setup.gradient_accumulation_steps)
