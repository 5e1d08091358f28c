"""Sharded checkpoints: each process saves and loads its own shards, on any number of processes (lesson 7).

``torch.distributed.checkpoint`` (DCP) saves a state dict of DTensors as one
file per process plus a ``.metadata`` file that records which slice of which
tensor each file holds. Loading reads that map: a process asks for the slices
its own shards cover, whatever the number of processes that saved them, so a
run saved on 2 processes resumes on 3 (*resharding*). The state dicts come
from ``torch.distributed.checkpoint.state_dict``: ``get_model_state_dict`` and
``get_optimizer_state_dict`` (the optimizer's state keyed by parameter names,
not by positions, so that it survives a new sharding); ``set_model_state_dict``
and ``set_optimizer_state_dict`` put them back.

To share a model, one file is handier: ``StateDictOptions(full_state_dict=True,
cpu_offload=True)`` gathers every tensor whole, and process 0 writes it with
``safetensors.torch.save_file`` (:func:`save_full_safetensors`).

:func:`train_and_save` and :func:`resume_from` are what the launched workers
run; :func:`resume_from` builds its model with :mod:`course_utils.meta_init`
and measures what building and loading cost each process.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from course_utils.validation import check_in_process_group, check_instance, check_positive_int

__all__ = [
    "checkpoint_files",
    "load_sharded",
    "resume_from",
    "save_full_safetensors",
    "save_sharded",
    "train_and_save",
]


def _check_directory(directory, name: str) -> Path:
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or pathlib.Path), got {type(directory).__name__}")
    return Path(directory)


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory) -> None:
    """Save ``model``'s and ``optimizer``'s state, each process its own shards, under ``directory`` (every process calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    directory = _check_directory(directory, "directory")
    check_in_process_group("save_sharded")
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(directory))


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, directory) -> None:
    """Load ``model``'s (and ``optimizer``'s, unless None) state from a DCP checkpoint, each process reading its shards.

    The state dicts of the model as it is sharded now give DCP the slices to
    read; ``get_optimizer_state_dict`` first creates the optimizer's state
    (zeros) so that it has tensors to load into.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if optimizer is not None:
        check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer or None")
    directory = _check_directory(directory, "directory")
    if not (directory / ".metadata").is_file():
        raise FileNotFoundError(f"directory {str(directory)!r} holds no DCP checkpoint (no .metadata file)")
    check_in_process_group("load_sharded")
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    dcp.load(state, checkpoint_id=str(directory))
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def save_full_safetensors(model: torch.nn.Module, path) -> int | None:
    """Gather ``model``'s state whole and write it from process 0 as one safetensors file; return its bytes (None elsewhere).

    Every process calls it (the gathering is collective); only process 0
    holds the whole tensors (``cpu_offload=True`` puts them in host memory
    and keeps them on process 0 alone).
    """
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    path = _check_directory(path, "path")
    check_in_process_group("save_full_safetensors")
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    save_file({name: tensor.contiguous() for name, tensor in whole.items()}, str(path))
    return path.stat().st_size


def checkpoint_files(directory) -> dict[str, int]:
    """Return {file name: bytes} of a checkpoint directory, sorted by name."""
    directory = _check_directory(directory, "directory")
    if not directory.is_dir():
        raise FileNotFoundError(f"directory {str(directory)!r} does not exist")
    return {path.name: path.stat().st_size for path in sorted(directory.iterdir()) if path.is_file()}


def _checkpoint_mesh(world_size: int):
    """Return a 1-D CPU mesh over the launch's processes, named so that no mesh this process inherited can stand in for it.

    A worker forked from a notebook that ran the planner (``memory.estimate_training_memory``
    on a fake process group) inherits DTensor's caches, where an equal unnamed mesh of the
    same size belongs to fake process 0. FSDP2 then gives every process's shards that mesh,
    every process places its shard at row 0, and DCP refuses the plan ("invalid fill").
    A mesh name of its own keeps this run's mesh apart.
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,), mesh_dim_names=("checkpointed_shards",))


def train_and_save(directory, safetensors_path, steps_before: int = 2, total_steps: int = 3,
                   batch_size: int = 6) -> dict:
    """Train the tiny model under ZeRO-3 for ``steps_before`` steps, save a sharded checkpoint and a safetensors file.

    Call it inside :func:`course_utils.sharding.gloo_group` on every process
    of a launch. The steps are the first ``steps_before`` of the
    ``total_steps`` batches of :func:`course_utils.sharding.course_batches`
    (a run that goes on to ``total_steps`` continues from there). Returns
    ``{"losses": [...], "saved_parameters": whole parameters as saved (rank 0
    only), "safetensors_bytes": the file's size (rank 0 only)}``.
    """
    import torch.distributed as dist

    from course_utils import sharding

    check_positive_int(steps_before, "steps_before")
    check_positive_int(total_steps, "total_steps")
    if steps_before >= total_steps:
        raise ValueError(f"steps_before must be below total_steps ({total_steps}), got {steps_before}")
    check_positive_int(batch_size, "batch_size")
    directory = _check_directory(directory, "directory")
    safetensors_path = _check_directory(safetensors_path, "safetensors_path")
    check_in_process_group("train_and_save")
    model = sharding.zero3_course_model(_checkpoint_mesh(dist.get_world_size()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=sharding.LEARNING_RATE)
    losses = sharding.train_steps(model, optimizer, sharding.course_batches(total_steps, batch_size)[:steps_before])
    save_sharded(model, optimizer, directory)
    size = save_full_safetensors(model, safetensors_path)
    saved = sharding.whole_parameters(model)
    return {"losses": losses, "saved_parameters": saved if dist.get_rank() == 0 else {}, "safetensors_bytes": size}


def resume_from(directory, steps_before: int = 2, total_steps: int = 3, batch_size: int = 6) -> dict:
    """Build the tiny model on meta, shard it here, load the checkpoint of :func:`train_and_save`, train to ``total_steps``.

    Call it inside :func:`course_utils.sharding.gloo_group` on every process
    of a launch of any size. The allocator (``memory.recording_allocator``)
    records building and loading the model (``build_rise``) and, for
    comparison, building a whole copy first and sharding it
    (``whole_first_rise``). A second model loads the weights but not the
    optimizer state and takes the same steps with a fresh AdamW. Returns
    bytes and parameters: ``build_rise``, ``whole_first_rise``,
    ``planned_parameters`` (:func:`course_utils.meta_init.planned_parameter_bytes`),
    ``held_parameters``, ``losses``, and on rank 0 only ``loaded_parameters``
    (whole, right after loading), ``final_parameters`` and
    ``final_without_optimizer_state``.
    """
    import torch.distributed as dist

    from course_utils import memory, meta_init, sharding

    check_positive_int(steps_before, "steps_before")
    check_positive_int(total_steps, "total_steps")
    if steps_before >= total_steps:
        raise ValueError(f"steps_before must be below total_steps ({total_steps}), got {steps_before}")
    check_positive_int(batch_size, "batch_size")
    directory = _check_directory(directory, "directory")
    check_in_process_group("resume_from")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = _checkpoint_mesh(world_size)
    config = sharding.course_model().config
    with memory.recording_allocator() as built:
        model = meta_init.build_sharded_on_meta(config, mesh)
        load_sharded(model, None, directory)
    with memory.recording_allocator() as whole_first:
        naive = sharding.zero3_course_model(mesh)
    del naive
    optimizer = torch.optim.AdamW(model.parameters(), lr=sharding.LEARNING_RATE)
    load_sharded(model, optimizer, directory)
    loaded = sharding.whole_parameters(model)
    rest = sharding.course_batches(total_steps, batch_size)[steps_before:]
    losses = sharding.train_steps(model, optimizer, rest)
    fresh = meta_init.build_sharded_on_meta(config, mesh)
    load_sharded(fresh, None, directory)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=sharding.LEARNING_RATE)
    sharding.train_steps(fresh, fresh_optimizer, rest)
    final, without_state = sharding.whole_parameters(model), sharding.whole_parameters(fresh)
    return {
        "build_rise": built.rise, "whole_first_rise": whole_first.rise,
        "planned_parameters": meta_init.planned_parameter_bytes(sharding.course_model(), world_size, rank),
        "held_parameters": sharding.held_bytes(model.parameters()), "losses": losses,
        "loaded_parameters": loaded if rank == 0 else {}, "final_parameters": final if rank == 0 else {},
        "final_without_optimizer_state": without_state if rank == 0 else {},
    }
