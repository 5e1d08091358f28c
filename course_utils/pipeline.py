"""Pipeline parallelism: a model cut into stages, fed micro-batches by a schedule; its bubble measured (lesson 9).

Stage *s* of *p* holds a contiguous slice of the layers. A batch is cut into *m*
micro-batches; stage *s* computes micro-batch *i* once stage *s - 1* has sent
it, and sends its output on; the backward pass runs the other way. A
*schedule* is the order in which each stage runs its forward (F) and backward
(B) passes:

- **GPipe** (:func:`gpipe`): every forward, then every backward. Each stage
  keeps the activations of all *m* micro-batches until their backward pass.
- **1F1B** (:func:`one_f_one_b`): stage *s* runs ``p - s - 1`` forwards to fill
  the pipe, then alternates one forward and one backward, then drains. It
  frees each micro-batch's activations sooner, and so keeps at most a few in
  flight.

With every pass of a stage taking the same time, both leave each stage idle for
``p - 1`` of the ``m + p - 1`` slots of a step: the *bubble*,
:func:`bubble_formula`. :func:`run_pipeline` runs a schedule written here on
launched processes (sends and receives over gloo) and records when each stage
computed; :func:`bubble_fraction` measures the idle share from those spans, and
:func:`replay_schedule` replays the schedule with the measured pass times and
no time for messages: the bubble the schedule itself leaves.
:func:`run_torch_schedule` runs torch's own ``torch.distributed.pipelining``
schedules on the same stages. Both are checked against one process.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.validation import check_choice, check_int_in_range, check_positive_int

__all__ = [
    "PipelineRun",
    "SCHEDULES",
    "TORCH_SCHEDULES",
    "bubble_formula",
    "bubble_fraction",
    "gpipe",
    "layer_stack",
    "measure_stage_memory",
    "one_f_one_b",
    "replay_schedule",
    "run_stage",
    "run_pipeline",
    "run_torch_schedule",
    "stage_of",
]


# --------------------------------------------------------------------------- the model and its stages


def layer_stack(depth: int = 8, dim: int = 256, seed: int = 0) -> nn.Sequential:
    """Return ``depth`` layers of (Linear ``dim`` to ``dim``, GELU), weights drawn from ``seed``: the same in every process."""
    check_positive_int(depth, "depth")
    check_positive_int(dim, "dim")
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(depth)))


def stage_of(model: nn.Sequential, stage: int, num_stages: int) -> nn.Sequential:
    """Return stage ``stage``'s layers of ``model``: the ``stage``-th of ``num_stages`` equal contiguous slices."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be a torch.nn.Sequential of layers, got {type(model).__name__}")
    check_positive_int(num_stages, "num_stages")
    check_int_in_range(stage, "stage", 0, num_stages - 1)
    if len(model) % num_stages:
        raise ValueError(f"num_stages: {num_stages} stages do not divide the model's {len(model)} layers")
    per_stage = len(model) // num_stages
    return nn.Sequential(*list(model)[stage * per_stage:(stage + 1) * per_stage])


# --------------------------------------------------------------------------- schedules


def _check_schedule_arguments(stage, num_stages, num_microbatches):
    check_positive_int(num_stages, "num_stages")
    check_int_in_range(stage, "stage", 0, num_stages - 1)
    check_positive_int(num_microbatches, "num_microbatches")


def gpipe(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Return GPipe's order for ``stage``: every forward ``("F", i)``, then every backward ``("B", i)``."""
    _check_schedule_arguments(stage, num_stages, num_microbatches)
    return [("F", i) for i in range(num_microbatches)] + [("B", i) for i in range(num_microbatches)]


def one_f_one_b(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Return 1F1B's order for ``stage``: fill with ``num_stages - stage - 1`` forwards, alternate, then drain."""
    _check_schedule_arguments(stage, num_stages, num_microbatches)
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(num_microbatches - warmup, num_microbatches)]


SCHEDULES = {"GPipe": gpipe, "1F1B": one_f_one_b}
"""The schedules written here, by name: ``schedule(stage, num_stages, num_microbatches)`` -> order of passes."""


def bubble_formula(num_stages: int, num_microbatches: int) -> float:
    """Return the idle share of each stage when every pass takes the same time: (p - 1) / (m + p - 1)."""
    check_positive_int(num_stages, "num_stages")
    check_positive_int(num_microbatches, "num_microbatches")
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def bubble_fraction(spans: list) -> float:
    """Return the idle share of the stages from when they computed: ``spans[s]`` = [(start, end), ...] of stage ``s``.

    The step lasts from the first start to the last end, on any stage (one
    clock: ``time.perf_counter`` is the machine's monotonic clock, shared by its
    processes); each stage is idle for what it did not compute of it. Returns
    the mean over the stages.
    """
    if not isinstance(spans, (list, tuple)) or not spans or not all(isinstance(s, (list, tuple)) and s for s in spans):
        raise ValueError("spans must be a non-empty list, per stage, of non-empty lists of (start, end) times")
    try:
        pairs = [[(float(start), float(end)) for start, end in stage] for stage in spans]
    except (TypeError, ValueError):
        raise ValueError("spans: every span must be a pair of times (start, end), in seconds") from None
    if any(end < start for stage in pairs for start, end in stage):
        raise ValueError("spans: a span ends before it starts")
    begin = min(start for stage in pairs for start, _ in stage)
    finish = max(end for stage in pairs for _, end in stage)
    if finish <= begin:
        raise ValueError("spans: the step takes no time")
    busy = [sum(end - start for start, end in stage) for stage in pairs]
    return sum(1 - b / (finish - begin) for b in busy) / len(busy)


def replay_schedule(orders: list, durations: list) -> list[list[tuple[float, float]]]:
    """Return the spans each stage would compute in if its passes took ``durations`` and messages took no time.

    ``orders[s]``: stage ``s``'s schedule (:data:`SCHEDULES`); ``durations[s][k]``:
    the seconds of its ``k``-th pass. A forward waits for the previous stage's
    forward of the same micro-batch, a backward for the next stage's backward
    (the last stage's, for its own forward). With equal durations the bubble is
    :func:`bubble_formula`'s; with a run's measured durations, it is the bubble
    the schedule itself leaves, without the waits for messages. Raises
    ValueError if the orders wait for each other forever.
    """
    if not isinstance(orders, (list, tuple)) or not orders or not isinstance(durations, (list, tuple)) or len(
            durations) != len(orders) or any(len(d) != len(o) for d, o in zip(durations, orders)):
        raise ValueError("orders and durations must be lists with one entry per stage, a duration per pass")
    stages = len(orders)
    done, free, position = {}, [0.0] * stages, [0] * stages
    spans = [[] for _ in range(stages)]
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            needs = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (
                ("B", s + 1, i) if s < stages - 1 else ("F", s, i))
            if needs is not None and needs not in done:
                continue
            start = max(free[s], done[needs] if needs else 0.0)
            free[s] = done[kind, s, i] = start + float(durations[s][position[s]])
            spans[s].append((start, free[s]))
            position[s] += 1
            progressed = True
        if not progressed:
            raise ValueError("orders: the stages wait for each other forever (a schedule that would hang)")
    return spans


# --------------------------------------------------------------------------- one stage running a schedule


def run_stage(module, stage, num_stages, order, inputs, targets, shape):
    """Run ``order`` (a schedule's) as stage ``stage`` of ``num_stages``; return the (start, end) of every pass.

    ``inputs``, ``targets``: the micro-batches (read by the first and the last
    stage); ``shape``: of the activations passed between stages. Sends are
    asynchronous, receives wait.

    Gloo runs a send as a send, so a stage that sent its output can go on
    computing; every receive names its partner, and each pair of stages sends
    and receives in the same order, so nothing waits forever.
    """
    import torch.distributed as dist

    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be this stage's torch.nn.Module, got {type(module).__name__}")
    _check_schedule_arguments(stage, num_stages, len(inputs))
    first, last = stage == 0, stage == num_stages - 1
    kept, spans, pending = {}, [], []
    for kind, i in order:
        if kind == "F":
            x = inputs[i] if first else torch.empty(shape)
            if not first:
                dist.recv(x, src=stage - 1)
                x.requires_grad_(True)
            start = time.perf_counter()
            y = module(x)
            if last:
                y = nn.functional.mse_loss(y, targets[i]) / len(inputs)  # the mean over the micro-batches
            spans.append((start, time.perf_counter()))
            kept[i] = (x, y)  # this micro-batch's activations stay alive until its backward pass
            if not last:
                pending.append(dist.isend(y.detach(), dst=stage + 1))
        else:
            x, y = kept.pop(i)
            grad = None
            if not last:
                grad = torch.empty(shape)
                dist.recv(grad, src=stage + 1)
            start = time.perf_counter()
            y.backward(grad)
            spans.append((start, time.perf_counter()))
            if not first:
                pending.append(dist.isend(x.grad, dst=stage - 1))
    for work in pending:
        work.wait()
    return spans


@dataclass(frozen=True)
class PipelineRun:
    """One stage of a pipeline run on launched processes, measured in its process.

    - ``schedule``, ``stage``, ``num_stages``, ``num_microbatches``;
    - ``spans``: per repeat, the (start, end) of each pass this stage computed (seconds, ``time.perf_counter``);
    - ``activation_peak``: the most bytes of activations this stage held at once (a repeat's peak);
    - ``microbatch_activations``: the bytes of activations one micro-batch leaves on this stage;
    - ``gradient_gap``: the largest difference between this stage's gradients and one process's;
    - ``weights``: bytes of this stage's parameters.
    """

    schedule: str
    stage: int
    num_stages: int
    num_microbatches: int
    spans: list
    activation_peak: int
    microbatch_activations: int
    gradient_gap: float
    weights: int


def _data(rows: int, dim: int, num_microbatches: int, seed: int):
    torch.manual_seed(seed + 1)
    x, target = torch.randn(rows * num_microbatches, dim), torch.randn(rows * num_microbatches, dim)
    # Each micro-batch in storage of its own, as it would arrive from a data loader.
    return [part.clone() for part in x.chunk(num_microbatches)], [part.clone() for part in target.chunk(num_microbatches)]


def _one_process_gradients(model, inputs, targets) -> list[torch.Tensor]:
    """The reference: the mean loss of the micro-batches on the whole model, in one process."""
    reference = copy.deepcopy(model)
    loss = sum(nn.functional.mse_loss(reference(x), t) for x, t in zip(inputs, targets)) / len(inputs)
    loss.backward()
    return [p.grad for p in reference.parameters()]


def _stage_gradient_gap(module, model, reference_gradients) -> float:
    position = {id(p): i for i, p in enumerate(model.parameters())}
    return max(float((p.grad - reference_gradients[position[id(p)]]).abs().max()) for p in module.parameters())


def run_pipeline(configs=(("GPipe", 4),), repeats: int = 5, rows: int = 128, dim: int = 512, depth: int = 8,
                 seed: int = 0) -> list[PipelineRun]:
    """In each launched process (one stage each): run each (schedule, micro-batches) of ``configs``, timed; one
    :class:`PipelineRun` per config, in order.

    Each config runs once to warm up (its gradients are checked against one
    process), then ``repeats + 1`` times after a barrier; the first of those is
    dropped too (the stages leave the barrier at different moments).
    """
    from course_utils.sharding import gloo_group
    from course_utils.validation import check_in_launch

    if not isinstance(configs, (list, tuple)) or not configs or not all(
            isinstance(c, (list, tuple)) and len(c) == 2 for c in configs):
        raise ValueError(f"configs must be a non-empty list of (schedule, num_microbatches) pairs, got {configs!r}")
    for schedule, num_microbatches in configs:
        check_choice(schedule, "schedule", tuple(SCHEDULES))
        check_positive_int(num_microbatches, "num_microbatches")
    for value, name in ((repeats, "repeats"), (rows, "rows"), (dim, "dim"), (depth, "depth")):
        check_positive_int(value, name)
    check_in_launch("run_pipeline")
    import torch.distributed as dist

    with gloo_group():
        stage, num_stages = dist.get_rank(), dist.get_world_size()
        return [_timed_runs(stage, num_stages, schedule, m, repeats, rows, dim, depth, seed) for schedule, m in configs]


def _timed_runs(stage, num_stages, schedule, num_microbatches, repeats, rows, dim, depth, seed) -> PipelineRun:
    import torch.distributed as dist

    from course_utils.saved_activations import ActivationMeter
    from course_utils.sharding import held_bytes

    model = layer_stack(depth, dim, seed)
    module = stage_of(model, stage, num_stages)
    inputs, targets = _data(rows, dim, num_microbatches, seed)
    order = SCHEDULES[schedule](stage, num_stages, num_microbatches)
    shape = (rows, dim)
    run_stage(module, stage, num_stages, order, inputs, targets, shape)
    gap = _stage_gradient_gap(module, model, _one_process_gradients(model, inputs, targets))
    runs, peak = [], 0
    for _ in range(repeats + 1):
        module.zero_grad()
        dist.barrier()
        with ActivationMeter(module) as meter:
            runs.append(run_stage(module, stage, num_stages, order, inputs, targets, shape))
        peak = max(peak, meter.peak)
    return PipelineRun(schedule, stage, num_stages, num_microbatches, runs[1:], peak,
                       meter.saved // num_microbatches, gap, held_bytes(module.parameters()))


# --------------------------------------------------------------------------- torch's own schedules

TORCH_SCHEDULES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B")
"""``torch.distributed.pipelining`` schedules :func:`run_torch_schedule` runs (the interleaved one: two stages per process)."""


def run_torch_schedule(schedules=TORCH_SCHEDULES, num_microbatches: int = 4, rows: int = 16, dim: int = 64,
                       depth: int = 8, seed: int = 0) -> dict[str, dict]:
    """In each launched process: run one step of each of torch's ``schedules`` (:data:`TORCH_SCHEDULES`).

    Returns {schedule: {"gradient_gap": largest difference from one process's gradients, "loss": the step's
    loss on the last stage (None elsewhere), "stages": the stage indices this process held}}.
    """
    from course_utils.sharding import gloo_group
    from course_utils.validation import check_in_launch

    if isinstance(schedules, str) or not isinstance(schedules, (list, tuple)) or not schedules:
        raise ValueError(f"schedules must be a non-empty list of names among {TORCH_SCHEDULES}, got {schedules!r}")
    for schedule in schedules:
        check_choice(schedule, "schedules", TORCH_SCHEDULES)
    for value, name in ((num_microbatches, "num_microbatches"), (rows, "rows"), (dim, "dim"), (depth, "depth")):
        check_positive_int(value, name)
    check_in_launch("run_torch_schedule")
    import torch.distributed as dist

    with gloo_group():
        rank, world = dist.get_rank(), dist.get_world_size()
        return {schedule: _torch_step(schedule, rank, world, num_microbatches, rows, dim, depth, seed)
                for schedule in schedules}


def _torch_step(schedule, rank, world, num_microbatches, rows, dim, depth, seed) -> dict:
    from torch.distributed import pipelining

    per_process = 2 if schedule == "ScheduleInterleaved1F1B" else 1
    num_stages = world * per_process
    model = layer_stack(depth, dim, seed)
    x, target = (torch.cat(part) for part in _data(rows, dim, num_microbatches, seed))
    reference = _one_process_gradients(model, x.chunk(num_microbatches), target.chunk(num_microbatches))
    # Looped schedules give process r the stages r, r + world, ...: the model goes round the processes twice.
    indices = [rank + k * world for k in range(per_process)]
    stages = [pipelining.PipelineStage(stage_of(model, i, num_stages), i, num_stages, torch.device("cpu"))
              for i in indices]
    kind = getattr(pipelining, schedule)
    loss_fn = nn.functional.mse_loss
    runner = kind(stages if per_process > 1 else stages[0], n_microbatches=num_microbatches, loss_fn=loss_fn,
                  scale_grads=True)  # gradients of the mean over micro-batches, as one process computes them
    losses = []
    holds_first, holds_last = 0 in indices, num_stages - 1 in indices
    args = (x,) if holds_first else ()
    runner.step(*args, target=target if holds_last else None, losses=losses if holds_last else None)
    gap = max(_stage_gradient_gap(stage.submod, model, reference) for stage in stages)
    loss = float(sum(loss.detach() for loss in losses) / len(losses)) if losses else None
    return {"gradient_gap": gap, "loss": loss, "stages": indices}


# --------------------------------------------------------------------------- a transformer's stages, measured


def measure_stage_memory(config, layout, batch_size: int, seq_len: int, optimizer: str = "adamw", seed: int = 0):
    """In each launched process (one stage each): return this process's stage's step, measured (a ``TrainingMemory``, bytes).

    The causal LM of ``config`` (a transformers Llama-family config, fp32,
    weights drawn from ``seed``: the same in every process), cut into
    ``layout.pp`` stages by ``layouts.pipeline_stage``, run by torch's schedule
    of ``layout`` (``layouts.pipeline_schedule``) on ``batch_size`` sequences
    of ``seq_len`` tokens in ``layout.microbatches`` micro-batches, trained by
    ``optimizer``: the step ``memory.estimate_training_memory(..., layout=layout, rank=stage)``
    plans (``memory.pipeline_stages.measure_stage_step``).
    """
    from transformers import AutoModelForCausalLM, PretrainedConfig

    from course_utils.layouts import Layout
    from course_utils.memory.pipeline_stages import measure_stage_step
    from course_utils.memory.setup import TrainingSetup
    from course_utils.sharding import gloo_group
    from course_utils.validation import check_in_launch, check_instance

    check_instance(config, "config", PretrainedConfig, "a transformers config (LlamaConfig(...))")
    check_instance(layout, "layout", Layout, "a Layout")
    setup = TrainingSetup(optimizer, batch_size, seq_len)
    check_in_launch("measure_stage_memory")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with gloo_group():
        return measure_stage_step(model, layout, setup, seed)
