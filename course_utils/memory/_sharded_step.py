"""The planner per process (private; used by ``course_utils.memory.planner``): one process's training step under sharding, on fake tensors.

Lesson 7's planner. For FSDP2 (ZeRO-2: ``reshard_after_forward=False``;
ZeRO-3: ``True``) it follows the public recipe of torchtitan's
``scripts/estimate/estimation.py``: a *fake* process group
(``torch.testing._internal.distributed.fake_pg``: every collective returns at
once, nothing is sent) of ``world_size`` processes in this one process, as
process 0; a CPU device mesh built on it, outside fake mode; the model copied
to the meta device and sharded there (``fully_shard`` on each block, then the
root, as :func:`course_utils.sharding.train_with_strategy` does); then its
storage made fake (``to_empty`` inside ``FakeTensorMode``) and the step of
``training_memory.measure_training_step_peak`` run on it (a warm-up step, then
the measured step) under torch's ``FSDPMemTracker``.

Checked on torch 2.13 against real gloo runs of the same step (``tests/test_planner_sharding.py``).
"""

from __future__ import annotations

import copy
import gc
import torch

from course_utils.memory.fake_step import (
    PlannerRefused, an_unpadded_batch, _fake_optimizer, quietly, _refusing_what_needs_values,
)
from course_utils.memory.probes import config_with_layers, repeated_layers
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step import PHASES, default_loss, forward
from course_utils.memory.training_memory import TrainingMemory, training_batch

SHARDING = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")
"""The values ``estimate_training_memory(sharding=...)`` takes; "fsdp" is "zero3", "none" on one process is plain."""


def strategy_of(sharding: str, world_size: int) -> str:
    """Return the strategy that runs: "none" (one process), "zero2" or "zero3"."""
    if world_size == 1:
        return "none"
    return "zero3" if sharding == "fsdp" else sharding


def fsdp_probe(model: torch.nn.Module, step: TrainingSetup, layers: int | None, world_size: int,
               strategy: str) -> tuple[TrainingMemory, list]:
    """Return process 0's step under ``strategy`` ("zero2"/"zero3") on ``world_size`` processes, on the first ``layers`` blocks.

    The second element is each micro-batch's (forward peak, backward peak), for
    :func:`course_utils.memory.fake_step.extrapolate`.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise PlannerRefused(
            "the per-process planner runs its own fake process group, and this process is already in a process "
            "group (inside a launched worker?): plan from the notebook's own process"
        )
    return quietly(_fsdp_probe, model, step, layers, world_size, strategy)


def _fsdp_probe(model, step, layers, world_size, strategy):
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        meta = _meta_copy(model, layers)
        reshard = strategy == "zero3"
        _, blocks = repeated_layers(meta)
        for block in blocks if blocks is not None else _one_module_list(meta):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(meta, mesh=mesh, reshard_after_forward=reshard)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with _refusing_what_needs_values():
            with mode:
                meta.to_empty(device="cpu")
            optimizer = _fake_optimizer(meta, step, mode)
            with mode, an_unpadded_batch():
                batch = training_batch(meta, step.batch_size, step.seq_len)
                meta.train()
                _step(meta, optimizer, batch, step, None)  # warm-up: the optimizer state exists from here on
                tracker = FSDPMemTracker(meta, optimizer)
                with tracker:
                    seen = _step(meta, optimizer, batch, step, tracker)
    finally:
        dist.destroy_process_group()
    return _memory(seen), seen["micro_batch_peaks"]


def measure_fsdp_step(model, optimizer, batch, step: TrainingSetup) -> TrainingMemory:
    """Return the step of :func:`fsdp_probe`, measured for real on a model sharded in a launched process."""
    model.train()
    _step(model, optimizer, batch, step, None)
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        seen = _step(model, optimizer, batch, step, tracker)
    return _memory(seen)


def _memory(seen: dict) -> TrainingMemory:
    """Return the TrainingMemory of what :func:`_step` saw under FSDPMemTracker."""
    peaks = seen["peak_by_phase"]
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    after_step, after_backward = seen["after_step"], seen["after_backward"]
    return TrainingMemory(
        weights=after_step["Sharded Param"] + after_step["Unsharded Param"] + after_step["Buffer"],
        gradients=after_backward["Sharded Grad"] + after_backward["Unsharded Grad"],
        optimizer_state=after_step["OptState"], activations=seen["after_forward"]["Activation"],
        peak=peaks[phase_of_peak], phase_of_peak=phase_of_peak, peak_by_phase=peaks,
    )


def _step(model, optimizer, batch, step, tracker) -> dict:
    """Run one optimizer step over the step's micro-batches; with ``tracker``, return what it saw, phase by phase."""
    steps = step.gradient_accumulation_steps
    seen = {"peak_by_phase": dict.fromkeys(PHASES, 0), "micro_batch_peaks": []}

    def phase_ends(phase):
        peak = _snapshot(tracker, "peak")["Total"]
        seen["peak_by_phase"][phase] = max(seen["peak_by_phase"][phase], peak)
        _start_phase(tracker)
        return peak

    if tracker is not None:
        _start_phase(tracker)
    for _ in range(steps):
        if tracker is not None:
            tracker.reset_mod_stats()
        loss = forward(model, batch, default_loss, step.mixed_precision)
        if steps > 1:
            loss = loss / steps
        if tracker is not None:
            gc.collect()  # see step.training_step: outputs caught in the tracker's reference cycles
            seen["after_forward"] = _snapshot(tracker, "current")
            forward_peak = phase_ends("forward")
        loss.backward()
        del loss
        if tracker is not None:
            seen["after_backward"] = _snapshot(tracker, "current")
            seen["micro_batch_peaks"].append((forward_peak, phase_ends("backward")))
    optimizer.step()
    optimizer.zero_grad()
    if tracker is not None:
        phase_ends("optimizer step")
        seen["after_step"] = _snapshot(tracker, "current")
    return seen


_CATEGORIES = ("Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad", "Activation", "Temp",
               "All Gather", "Reduce Scatter", "OptState", "Inputs", "Total")


def _snapshot(tracker, kind: str) -> dict[str, int]:
    """Return FSDPMemTracker's ``kind`` snapshot of the CPU as {category name: bytes}."""
    snapshot = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    by_name = {str(getattr(key, "value", key)): int(value) for key, value in snapshot.items()}
    return {name: by_name.get(name, 0) for name in _CATEGORIES}


def _start_phase(tracker) -> None:
    """Forget the tracker's peak so far (as ``_step_tracker.StepTracker.start_phase``, on torch 2.13's internals)."""
    current = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {device: snapshot["Total"] for device, snapshot in current.items()}
    tracker._peak_mem_snap = current


def _one_module_list(model) -> list:
    """Return the blocks of a model whose blocks differ (they are still one ModuleList), or refuse."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if len(lists) != 1:
        raise PlannerRefused(
            f"model: the per-process planner shards each block, and {type(model).__name__} has "
            f"{len(lists)} lists of modules instead of one list of blocks"
        )
    return list(lists[0])


def _meta_copy(model: torch.nn.Module, layers: int | None) -> torch.nn.Module:
    """Return a copy of ``model`` on the meta device, keeping only the first ``layers`` blocks (all if None)."""
    memo: dict[int, object] = {}
    if layers is not None:
        count, layer_list = repeated_layers(model)
        memo[id(model.config)] = config_with_layers(model.config, layers, count)
        kept = torch.nn.ModuleList(list(layer_list)[:layers])
        memo[id(layer_list)] = _meta_twin_module(kept, memo)
    return _meta_twin_module(model, memo)


def _meta_twin_module(module: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """Return ``copy.deepcopy(module)`` with every parameter and buffer replaced by a meta tensor (ties kept)."""
    for sub in module.modules():
        for name, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
                if isinstance(tensor, torch.nn.Parameter):
                    twin = torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = twin
    return copy.deepcopy(module, memo)
