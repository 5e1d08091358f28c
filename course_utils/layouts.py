"""Layouts: how the processes of a run divide a model between them, and that division applied to a model (lesson 7).

A :class:`Layout` names a strategy and the number of processes it runs on,
checked when made: "none" (one process), "ddp" (every process holds the whole
model, its gradients averaged through DDP's buckets), "zero1" (DDP, and the
optimizer state divided: torch's ``ZeroRedundancyOptimizer``), "zero2"
(FSDP2 with ``reshard_after_forward=False``: gradients and state divided, the
parameters gathered from the forward pass to the end of the backward pass) and
"zero3" (FSDP2: parameters divided too, each block gathered just before it
runs). :meth:`Layout.of` reads the planner's arguments (``sharding=``, with
its alias "fsdp" for "zero3", and ``world_size=``) into one.

:func:`apply_layout` applies a layout to a model, and :func:`layout_optimizer`
to its optimizer, in a process group: the one place where a model is wrapped
in DDP or sharded with ``fully_shard``, called by the lessons' launched runs
(``course_utils.sharding``, ``meta_init``, ``offload``, ``sharded_checkpoints``) and by the planner's
fake pass (``course_utils.memory.per_process``, on a fake process group)
alike, as torchtitan's ``apply_fsdp`` serves its training and its memory
estimator. What each process then holds through a step is planned in
``memory.per_process``.

A later layout (tensor, pipeline, context or expert parallelism, or a mesh of
several) is a new entry: its strategy in :data:`STRATEGIES`, its rules in
:class:`Layout`'s checks, its mesh in :func:`device_mesh`, its application in
:func:`apply_layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.validation import check_choice, check_instance, check_positive_int

__all__ = ["SHARDING", "STRATEGIES", "Layout", "apply_layout", "block_lists", "device_mesh", "layout_optimizer"]

STRATEGIES = ("none", "ddp", "zero1", "zero2", "zero3")
"""The strategies a :class:`Layout` takes, from one process to everything sharded."""

SHARDING = (*STRATEGIES, "fsdp")
"""The values ``memory.estimate_training_memory(sharding=...)`` takes; "fsdp" is "zero3", "none" on one process is plain."""

_ALIASES = {"fsdp": "zero3"}


@dataclass(frozen=True)
class Layout:
    """How ``world_size`` processes divide a model: ``strategy`` (one of :data:`STRATEGIES`) on ``world_size`` processes."""

    strategy: str
    world_size: int = 1

    def __post_init__(self) -> None:
        check_choice(self.strategy, "strategy", STRATEGIES)
        check_positive_int(self.world_size, "world_size")
        _check_processes(self.strategy, "strategy", self.world_size)

    @classmethod
    def of(cls, sharding: str, world_size: int) -> Layout:
        """Return the layout ``estimate_training_memory(sharding=..., world_size=...)`` plans: "fsdp" is "zero3", "ddp" on one process is one process."""
        check_positive_int(world_size, "world_size")
        check_choice(sharding, "sharding", SHARDING)
        if world_size == 1 and sharding in ("none", "ddp"):
            return cls("none")
        _check_processes(sharding, "sharding", world_size)
        return cls(_ALIASES.get(sharding, sharding), world_size)

    @property
    def wraps_in_ddp(self) -> bool:
        """Whether every process holds the whole model in DDP (its gradients averaged through DDP's buckets)."""
        return self.strategy in ("ddp", "zero1")

    @property
    def shards_with_fsdp(self) -> bool:
        """Whether the model is sharded with FSDP2's ``fully_shard`` (gradients and optimizer state divided)."""
        return self.strategy in ("zero2", "zero3")

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP2's ``reshard_after_forward`` for this layout: parameters freed after each block's forward pass (ZeRO-3)."""
        return self.strategy == "zero3"


def _check_processes(strategy: str, argument: str, world_size: int) -> None:
    """Refuse a strategy that divides the state on one process, or one process's step on several."""
    if world_size == 1 and strategy != "none":
        raise ValueError(f"{argument}={strategy!r} divides the state between processes: it needs world_size >= 2, "
                         f"got world_size=1")
    if world_size > 1 and strategy == "none":
        others = "'zero3'/'fsdp'" if argument == "sharding" else "'zero3'"
        raise ValueError(f"{argument}='none' is one process: with world_size={world_size}, pass {argument}='ddp', "
                         f"'zero1', 'zero2' or {others}")


def block_lists(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """Return every non-empty ModuleList of ``model``: a transformers model has one, its repeated blocks (the units FSDP shards)."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    return [module for module in model.modules() if isinstance(module, torch.nn.ModuleList) and len(module) > 0]


def device_mesh(layout: Layout):
    """Return the CPU device mesh ``layout`` runs on, in this process's (real or fake) process group of as many processes."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    check_instance(layout, "layout", Layout, "a Layout")
    if not dist.is_initialized() or dist.get_world_size() != layout.world_size:
        found = f"{dist.get_world_size()} processes" if dist.is_initialized() else "none"
        raise RuntimeError(f"layout: a mesh of {layout.world_size} processes needs a process group of as many "
                           f"(a launched worker in sharding.gloo_group(), or the planner's fake group); found {found}")
    return init_device_mesh("cpu", (layout.world_size,))


def apply_layout(model: torch.nn.Module, layout: Layout, blocks=None, mesh=None, **fsdp_options) -> torch.nn.Module:
    """Return ``model`` laid out as ``layout`` says, in this process: the model to train.

    "none": the model; "ddp" and "zero1": the model in DistributedDataParallel
    (its defaults); "zero2" and "zero3": FSDP2's ``fully_shard`` on each of
    ``blocks`` (the model's repeated blocks, each one unit gathered and freed
    at a time), then on the root (what is left: embeddings, head), over
    ``mesh`` (:func:`device_mesh` of the layout if None), with the layout's
    ``reshard_after_forward`` unless ``fsdp_options`` sets it (None: FSDP2's
    own choice, every unit but the root), and any other option of
    ``fully_shard`` (``mp_policy``, ``offload_policy``).
    """
    fsdp_options = _checked_application(model, layout, blocks, fsdp_options)
    if layout.wraps_in_ddp:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if not layout.shards_with_fsdp:
        return model
    from torch.distributed.fsdp import fully_shard

    options = {"reshard_after_forward": layout.reshard_after_forward, **fsdp_options}
    mesh = device_mesh(layout) if mesh is None else mesh
    for block in blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def _checked_application(model, layout, blocks, fsdp_options: dict) -> dict:
    """Refuse what :func:`apply_layout` cannot apply; return ``fsdp_options``."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(layout, "layout", Layout, "a Layout")
    if not layout.shards_with_fsdp:
        if fsdp_options:
            raise ValueError(f"fsdp_options ({', '.join(sorted(fsdp_options))}) are fully_shard's: layout "
                             f"{layout.strategy!r} does not shard with FSDP")
        return fsdp_options
    if blocks is None or isinstance(blocks, torch.nn.Module) or not all(
            isinstance(block, torch.nn.Module) for block in blocks):
        raise TypeError(f"blocks must be the model's blocks, a list of torch.nn.Modules (layout {layout.strategy!r} "
                        f"shards each), got {type(blocks).__name__}")
    return fsdp_options


def layout_optimizer(layout: Layout, parameters, optimizer_class, **options: object) -> torch.optim.Optimizer:
    """Return the optimizer of ``layout`` over ``parameters``: ``optimizer_class(parameters, **options)``, or under ZeRO-1 torch's ``ZeroRedundancyOptimizer`` of it.

    ZeRO-1 with torch's defaults: whole tensors assigned to processes (largest
    first, each to the process with the fewest elements so far), each process
    updating its own, then broadcasting them one tensor at a time. Under FSDP
    the parameters are already this process's shards: the optimizer is the plain one.
    """
    check_instance(layout, "layout", Layout, "a Layout")
    if not callable(optimizer_class):
        raise TypeError(f"optimizer_class must build an optimizer from parameters (torch.optim.AdamW), "
                        f"got {type(optimizer_class).__name__}")
    parameters = list(parameters)
    if not parameters:
        raise ValueError("parameters must hold at least one parameter, got none")
    if layout.strategy != "zero1":
        return optimizer_class(parameters, **options)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(parameters, optimizer_class=optimizer_class, **options)
