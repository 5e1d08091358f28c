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

Context parallelism (lesson 9, ``cp``): each of ``cp`` processes holds a
contiguous ``1/cp`` of every sequence (:func:`context_batch`: its tokens,
their position ids and their labels, shifted on the whole sequence), and
attention is ``course_utils.ring_attention``'s ring, put into a transformers
model through transformers' own attention registry; the processes hold the
whole model, and every gradient is averaged over them as it is accumulated
(:func:`apply_layout`). Expert parallelism (``ep``), over the same processes
(``ep == cp``): a transformers mixture-of-experts model's experts divided
between them by transformers' own expert parallelism (its
``apply_expert_parallelism``: each process keeps ``1/ep`` of the experts, and
every (token, expert) pair goes to its expert's process and back by two
all-to-alls); each process's expert gradients are its own, not averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.validation import check_choice, check_instance, check_int_in_range, check_positive_int

__all__ = ["SHARDING", "STRATEGIES", "Layout", "apply_layout", "block_lists", "context_batch", "device_mesh",
           "layout_optimizer"]

STRATEGIES = ("none", "ddp", "zero1", "zero2", "zero3")
"""The strategies a :class:`Layout` takes, from one process to everything sharded."""

SHARDING = (*STRATEGIES, "fsdp")
"""The values ``memory.estimate_training_memory(sharding=...)`` takes; "fsdp" is "zero3", "none" on one process is plain."""

_ALIASES = {"fsdp": "zero3"}


@dataclass(frozen=True)
class Layout:
    """How ``world_size`` processes divide a model: ``strategy`` (one of :data:`STRATEGIES`) over the :attr:`dp` data-parallel processes.

    ``cp``: the context-parallel degree (each sequence split over ``cp``
    processes); ``ep``: the expert-parallel degree, which divides the
    data-parallel x context processes (as torchtitan's does).
    """

    strategy: str
    world_size: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        check_choice(self.strategy, "strategy", STRATEGIES)
        check_positive_int(self.world_size, "world_size")
        for degree in ("cp", "ep"):
            check_positive_int(getattr(self, degree), degree)
        if self.world_size % self.cp:
            raise ValueError(f"cp must divide world_size={self.world_size}, got cp={self.cp}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep must divide the {self.dp * self.cp} data-parallel x context processes, got ep={self.ep}")
        if self.dp == self.world_size:
            _check_processes(self.strategy, "strategy", self.world_size)
        elif (self.dp == 1) != (self.strategy == "none"):  # "none": one data-parallel process, the others its parts
            raise ValueError(f"strategy applies over the dp={self.dp} data-parallel processes (world_size / cp): "
                             f"{'pass strategy=' + repr('none') if self.dp == 1 else 'none is one process'}, "
                             f"got strategy={self.strategy!r}")

    @property
    def dp(self) -> int:
        """The data-parallel degree: the processes ``strategy`` applies over (world_size over the model-parallel degrees)."""
        return self.world_size // self.cp

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
    ``fully_shard`` (``mp_policy``, ``offload_policy``). With ``cp > 1`` (and
    every process one data-parallel process's part, ``dp == 1``): the model
    (a transformers model) attending by ``ring_attention``'s ring, each
    trainable parameter's gradient averaged over the processes in place as it
    is accumulated (a hook; no buckets); give each process its
    :func:`context_batch`.
    """
    fsdp_options = _checked_application(model, layout, blocks, fsdp_options)
    if layout.ep > 1 and layout.ep != layout.cp:
        raise NotImplementedError(f"layout: expert parallelism is applied over the context-parallel processes only "
                                  f"(ep == cp), got ep={layout.ep}, cp={layout.cp}")
    if layout.cp > 1:
        return _context_parallel(model, layout)
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


def _context_parallel(model: torch.nn.Module, layout: Layout) -> torch.nn.Module:
    """Return ``model`` (a transformers model) with ring attention, its gradients averaged over the ``cp`` processes."""
    import torch.distributed as dist

    from course_utils.ring_attention import use_ring_attention

    if layout.dp > 1:
        raise NotImplementedError(f"layout: context parallelism with data parallelism (cp={layout.cp}, "
                                  f"dp={layout.dp}) is not applied yet; use world_size == cp")
    if not dist.is_initialized() or dist.get_world_size() != layout.world_size:
        found = f"{dist.get_world_size()} processes" if dist.is_initialized() else "none"
        raise RuntimeError(f"layout: cp={layout.cp} needs a process group of {layout.world_size} processes "
                           f"(a launched worker in sharding.gloo_group(), or the planner's fake group); found {found}")
    use_ring_attention(model)
    own = _divide_experts(model, layout.ep) if layout.ep > 1 else set()

    def average(parameter: torch.Tensor) -> None:
        # In place, as the gradient is accumulated: the processes' gradients become their mean. (A mean
        # of accumulated gradients is right: what was accumulated before is the same on every process.)
        dist.all_reduce(parameter.grad)
        parameter.grad.div_(layout.cp)

    def own_experts(parameter: torch.Tensor) -> None:
        # This process's experts: their gradient already sums every process's tokens (the all-to-all's backward).
        parameter.grad.div_(layout.cp)

    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.register_post_accumulate_grad_hook(own_experts if id(parameter) in own else average)
    return model


def _divide_experts(model: torch.nn.Module, ep: int) -> set[int]:
    """Divide ``model``'s experts over the ``ep`` processes with transformers' own expert parallelism; return the ids of this process's expert parameters.

    transformers 5.24's ``apply_expert_parallelism`` with the model's
    ``base_model_ep_plan``: each expert tensor (experts x ...) keeps this
    process's ``1/ep`` of the experts (a DTensor sharded on dim 0), and each
    experts module sends every (token, expert) pair to its expert's process
    and back by two all-to-alls (``AllToAllEP``).
    """
    import re

    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    rules = getattr(model.config, "base_model_ep_plan", None)
    if not rules:
        raise ValueError(f"model: {type(model).__name__} has no expert-parallel plan (config.base_model_ep_plan): "
                         f"expert parallelism divides a transformers mixture-of-experts model's experts")
    base = model.base_model
    prefix = "" if base is model else f"{model.base_model_prefix}."
    patterns = {re.compile(re.escape(rule).replace(r"\*", r"\d+")): style for rule, style in rules.items()}
    names = [*(name for name, _ in base.named_parameters()), *(name for name, _ in base.named_modules())]
    plan = {f"{prefix}{name}": style for name in names for pattern, style in patterns.items() if pattern.fullmatch(name)}
    mesh = init_device_mesh("cpu", (ep, 1), mesh_dim_names=("ep", "tp"))  # no tensor parallelism inside it
    apply_expert_parallelism(model, mesh["ep"], mesh["tp"], plan)
    sharded = {name for name, style in plan.items() if style == "grouped_gemm"}
    return {id(parameter) for name, parameter in model.named_parameters() if name in sharded}


def context_batch(batch: dict, layout: Layout, rank: int) -> dict:
    """Return process ``rank``'s part of a causal language model's ``batch`` under ``layout``'s context parallelism.

    ``batch``: ``input_ids`` (batch, seq) and ``labels`` (the model shifts
    them), as ``memory.training_batch`` makes it. Process ``rank`` gets the
    ``rank``-th contiguous ``seq/cp`` of each sequence: its ``input_ids``,
    their ``position_ids`` (where they sit in the whole sequence), its
    ``labels``, and ``shift_labels``, its part of the labels shifted on the
    whole sequence (each token predicts the next one, even across the cut),
    which the model's loss then takes as they are. ``num_items_in_batch``
    makes each process's loss its tokens' sum over the whole batch's
    predicted tokens, times ``cp``: the mean over processes (what the
    gradient average makes of it) is the one-process loss.
    """
    check_instance(layout, "layout", Layout, "a Layout")
    check_int_in_range(rank, "rank", 0, layout.world_size - 1)
    if not isinstance(batch, dict) or set(batch) != {"input_ids", "labels"}:
        raise ValueError(f"batch must be a dict of input_ids and labels (a causal language model's batch), got "
                         f"{sorted(batch) if isinstance(batch, dict) else type(batch).__name__}")
    ids, labels = batch["input_ids"], batch["labels"]
    if ids.dim() != 2 or labels.shape != ids.shape or ids.shape[1] % layout.cp:
        raise ValueError(f"batch's input_ids and labels must be one shape (batch, seq) with seq divisible by "
                         f"cp={layout.cp}, got {tuple(ids.shape)} and {tuple(labels.shape)}")
    chunk = ids.shape[1] // layout.cp
    part = slice(rank * chunk, (rank + 1) * chunk)
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)  # the last token predicts nothing
    positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return {
        "input_ids": ids[:, part], "position_ids": positions[:, part], "labels": labels[:, part],
        "shift_labels": shifted[:, part].contiguous(), "num_items_in_batch": (shifted != -100).sum() / layout.cp,
    }


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
