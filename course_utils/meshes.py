"""Device meshes: processes arranged on a grid, one parallelism per dimension (lesson 9).

Four processes on a 2 x 2 mesh (``init_device_mesh("cpu", (2, 2), mesh_dim_names=...)``):
each row and each column is a process group of its own, and each parallelism
talks only inside its own dimension.

- **2-D, FSDP x TP** (:data:`LAYOUTS` ``"FSDP x TP"``): ``parallelize_module`` on the
  ``"tp"`` dimension splits each block's heads and hidden units between the two
  processes of a row, then ``fully_shard`` on the ``"dp"`` dimension shards what
  each holds between the two rows. Each process holds a quarter of each block; the
  all-reduces of tensor parallelism run inside a row (inside a node, on a
  cluster), the all-gathers and reduce-scatters of FSDP across the rows.
- **HSDP** (``"HSDP"``): ``fully_shard`` on a 2-D mesh ``("replicate", "shard")``
  shards inside each row and replicates across the rows: the parameters are
  gathered inside a row only, and the gradients, once reduce-scattered there, are
  all-reduced across the rows.

:func:`run_mesh` runs one step of a layout on four launched processes, checked
against one process, and counts each dimension's traffic
(:class:`course_utils.collectives.CollectiveLog`). :func:`accelerate_parallelism_config`
shows, as a run, what Accelerate's ``ParallelismConfig`` maps to and what it refuses on CPU.
"""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.validation import check_choice, check_positive_int

__all__ = ["LAYOUTS", "MeshRun", "lay_out_on_mesh", "accelerate_parallelism_config", "run_mesh", "two_blocks"]

LAYOUTS = {"FSDP x TP": ("dp", "tp"), "HSDP": ("replicate", "shard")}
"""The layouts :func:`run_mesh` runs, with the names of their mesh's two dimensions."""


def two_blocks(seed: int = 0) -> nn.Sequential:
    """Return two of lesson 9's tiny transformer blocks in a row, weights drawn from ``seed``."""
    from course_utils.tensor_parallel import tiny_block
    from course_utils.validation import check_non_negative_int

    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    check_non_negative_int(seed, "seed")
    return nn.Sequential(tiny_block(seed=seed), tiny_block(seed=seed + 1))


@dataclass(frozen=True)
class MeshRun:
    """One process of a mesh run, measured in that process. Bytes.

    - ``layout``, ``rank``, ``coordinate`` (this process's place on the mesh), ``dims`` (the dimensions' names);
    - ``forward_gap``, ``gradient_gap``: largest differences from one process's output and gradients;
    - ``held``, ``one_process``: {"weights", "gradients", "optimizer_state"} here and on one process;
    - ``traffic``: {dimension: {collective: bytes handed in}} over the step (forward, backward, optimizer).
    """

    layout: str
    rank: int
    coordinate: tuple
    dims: tuple
    forward_gap: float
    gradient_gap: float
    held: dict
    one_process: dict
    traffic: dict


def _held(model, optimizer) -> dict:
    from course_utils.sharding import held_bytes

    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"weights": held_bytes(model.parameters()), "gradients": held_bytes(p.grad for p in model.parameters()),
            "optimizer_state": held_bytes(states)}


def lay_out_on_mesh(model: nn.Sequential, mesh, layout: str) -> nn.Sequential:
    """Apply ``layout`` (:data:`LAYOUTS`) to ``model`` (blocks in a row) on the 2-D ``mesh``, in place; return it.

    The FSDP part is the course's one way of sharding a model, ``layouts.apply_layout``
    (the planner's too), given the mesh dimension it shards over.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    from course_utils.layouts import Layout, apply_layout
    from course_utils.tensor_parallel import block_plan

    check_choice(layout, "layout", tuple(LAYOUTS))
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be a torch.nn.Sequential of blocks, got {type(model).__name__}")
    blocks = list(model)
    if layout == "FSDP x TP":
        for block in blocks:
            parallelize_module(block, mesh["tp"], block_plan())  # heads and hidden units split inside a row
        shard_over = mesh["dp"]  # what each holds, sharded across the rows
    else:
        shard_over = mesh  # HSDP, a 2-D mesh: shard on the last dimension, replicate on the first
    # reshard_after_forward=None: fully_shard's own default (every unit but the root resharded after the forward pass)
    return apply_layout(model, Layout("zero3", shard_over.size()), blocks, shard_over, reshard_after_forward=None)


def run_mesh(layouts=tuple(LAYOUTS), batch: int = 8, seq: int = 16, seed: int = 0, apply=None) -> dict[str, MeshRun]:
    """In each of four launched processes: one AdamW step of :func:`two_blocks` under each of ``layouts`` (:data:`LAYOUTS`).

    Returns {layout: :class:`MeshRun`}. ``apply(model, mesh)``, when given,
    lays the model out instead of :func:`lay_out_on_mesh` (lesson 9's exercise 3).
    Each data-parallel replica takes its equal share of the ``batch`` (the
    processes of one tensor-parallel row take the same share); the one-process
    step takes the whole batch.
    """
    from course_utils.sharding import gloo_group
    from course_utils.validation import check_in_launch

    if isinstance(layouts, str) or not isinstance(layouts, (list, tuple)) or not layouts:
        raise ValueError(f"layouts must be a non-empty list of names among {tuple(LAYOUTS)}, got {layouts!r}")
    for layout in layouts:
        check_choice(layout, "layouts", tuple(LAYOUTS))
    check_positive_int(batch, "batch")
    check_positive_int(seq, "seq")
    if apply is not None and not callable(apply):
        raise TypeError(f"apply must be a function (model, mesh) or None, got {type(apply).__name__}")
    check_in_launch("run_mesh")
    import torch.distributed as dist

    with gloo_group():
        if dist.get_world_size() != 4:
            raise ValueError(f"run_mesh runs on 4 processes (a 2 x 2 mesh), not {dist.get_world_size()}")
        return {layout: _one_layout(layout, batch, seq, seed, apply) for layout in layouts}


def _one_layout(layout, batch, seq, seed, apply) -> MeshRun:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torch.distributed.tensor import DTensor

    from course_utils.collectives import CollectiveLog

    dims = LAYOUTS[layout]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=dims)
    model = two_blocks(seed)
    torch.manual_seed(seed + 2)
    x, target = torch.randn(batch, seq, 64), torch.randn(batch, seq, 64)
    reference = copy.deepcopy(model)
    ref_out = reference(x)
    nn.functional.mse_loss(ref_out, target).backward()
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    ref_optimizer.step()
    # Which share of the batch this process trains on: its data-parallel replica's.
    replicas = 2 if layout == "FSDP x TP" else 4
    replica = mesh.get_local_rank("dp") if layout == "FSDP x TP" else dist.get_rank()
    rows = slice(replica * batch // replicas, (replica + 1) * batch // replicas)
    if apply is None:
        lay_out_on_mesh(model, mesh, layout)
    else:
        apply(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with CollectiveLog() as log:
        out = model(x[rows])
        nn.functional.mse_loss(out, target[rows]).backward()
        optimizer.step()
    # Gathered whole for the comparison only; DTensor logs that a 2-D gather runs as two, which is no matter here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    gradients = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
    gradient_gap = max(float((g - r.grad).abs().max()) for g, r in zip(gradients, reference.parameters()))
    forward_gap = float((out - ref_out[rows]).detach().abs().max())
    return MeshRun(layout, dist.get_rank(), tuple(mesh.get_coordinate()), dims, forward_gap, gradient_gap,
                   _held(model, optimizer), _held(reference, ref_optimizer), log.by_group(mesh))


def _has_dimension(mesh, name: str) -> bool:
    # torch warns that slicing a flattened dimension from the root mesh will change; Accelerate slices so itself.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            mesh[name]
        except (KeyError, RuntimeError, ValueError):
            return False
    return True


def accelerate_parallelism_config(dp_shard_size: int = 2, tp_size: int = 2) -> dict:
    """In each launched process: build ``accelerate.ParallelismConfig(dp_shard_size, tp_size)``'s mesh, then try it.

    Returns {"mesh_dims", "mesh_shape", "coordinate": this process's place on the mesh Accelerate builds;
    "flattened": the names of the joint dimensions it adds; "distributed_type": what
    ``Accelerator(cpu=True)`` is here; "refusal": what ``Accelerator(cpu=True, parallelism_config=...)``
    raised (None when it accepted)}.
    """
    from accelerate import Accelerator, ParallelismConfig, PartialState

    from course_utils.validation import check_in_launch

    check_positive_int(dp_shard_size, "dp_shard_size")
    check_positive_int(tp_size, "tp_size")
    check_in_launch("accelerate_parallelism_config")
    config = ParallelismConfig(dp_shard_size=dp_shard_size, tp_size=tp_size)
    refusal = None
    try:
        Accelerator(cpu=True, parallelism_config=config)
    except ValueError as error:  # the refusal is the result this run shows
        refusal = f"{type(error).__name__}: {error}"
    mesh = config.device_mesh  # built by the constructor before it refused
    flattened = [name for name in ("dp", "dp_shard_cp", "dp_cp") if _has_dimension(mesh, name)]
    return {"mesh_dims": tuple(mesh.mesh_dim_names), "mesh_shape": tuple(mesh.shape),
            "coordinate": tuple(mesh.get_coordinate()), "flattened": flattened,
            "distributed_type": str(PartialState().distributed_type), "refusal": refusal}
