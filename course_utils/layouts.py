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

Tensor parallelism (lesson 9) is a layout's ``tp`` (its degree) and
``sequence_parallel``: :func:`apply_layout` splits each block's layers over
the mesh's "tp" dimension with DTensor's ``parallelize_module``, by the plan
:func:`tensor_parallel_plan` reads for the model (the transformers config's
``base_model_tp_plan`` where its family has one, the course's own DistilBERT
plan otherwise); the strategy (data parallelism) applies over the other
processes, the mesh's "dp" dimension (:attr:`Layout.dp`).

A later layout is a new entry: its
strategy in :data:`STRATEGIES` or its degree in :class:`Layout`, its rules in
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

import copy
import functools
from dataclasses import dataclass

import torch

from course_utils.validation import check_choice, check_instance, check_int_in_range, check_positive_int

__all__ = [
    "PIPELINE_SCHEDULES", "SHARDING", "STRATEGIES", "Layout", "apply_layout", "block_lists", "context_batch",
    "device_mesh",
    "distilbert_plan", "layout_optimizer", "pipeline_schedule", "pipeline_stage", "stage_blocks",
    "tensor_parallel_plan",
]

STRATEGIES = ("none", "ddp", "zero1", "zero2", "zero3")
"""The strategies a :class:`Layout` takes, from one process to everything sharded."""

SHARDING = (*STRATEGIES, "fsdp")
"""The values ``memory.estimate_training_memory(sharding=...)`` takes; "fsdp" is "zero3", "none" on one process is plain."""

_ALIASES = {"fsdp": "zero3"}

PIPELINE_SCHEDULES = ("gpipe", "1f1b")
"""The pipeline schedules a :class:`Layout` takes: torch's ``ScheduleGPipe`` and ``Schedule1F1B``."""

_SPLITS = ("tp", "pp", "cp")
"""The degrees that split the model or its sequences rather than the data (lesson 9)."""


@dataclass(frozen=True)
class Layout:
    """How ``world_size`` processes divide a model: ``strategy`` (one of :data:`STRATEGIES`) over its :attr:`dp` data-parallel processes.

    The other processes split the model or its sequences (lesson 9):

    - ``tp``: the tensor-parallel degree (each block's layers split over ``tp``
      processes); ``sequence_parallel``: the norms and the residual stream
      split along the sequence too (needs ``tp`` > 1).
    - ``pp``: pipeline stages, each process running one stage of consecutive
      blocks (:func:`pipeline_stage`); the batch is cut into ``microbatches``
      that ``schedule`` ("gpipe" or "1f1b", :data:`PIPELINE_SCHEDULES`) runs
      through the stages.
    - ``cp``: the context-parallel degree (each sequence split over ``cp``
      processes); ``ep``: the expert-parallel degree, which divides the
      data-parallel x context processes (as torchtitan's does).

    The data-parallel degree :attr:`dp` is ``world_size // (tp * pp * cp)``:
    ``strategy`` applies over those processes, and is "none" when there is one.
    """

    strategy: str
    world_size: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    pp: int = 1
    schedule: str = "gpipe"
    microbatches: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        check_choice(self.strategy, "strategy", STRATEGIES)
        check_positive_int(self.world_size, "world_size")
        for degree in (*_SPLITS, "ep", "microbatches"):
            check_positive_int(getattr(self, degree), degree)
        check_choice(self.schedule, "schedule", PIPELINE_SCHEDULES)
        if not isinstance(self.sequence_parallel, bool):
            raise TypeError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if self.world_size % self.tp:
            raise ValueError(f"tp must divide world_size: {self.world_size} processes do not split into groups of "
                             f"tp={self.tp}")
        if self.world_size % self.pp:
            raise ValueError(f"pp must divide world_size: {self.pp} pipeline stages do not divide "
                             f"{self.world_size} processes")
        if self.world_size % self.cp:
            raise ValueError(f"cp must divide world_size={self.world_size}, got cp={self.cp}")
        split = self.tp * self.pp * self.cp
        if self.world_size % split:
            raise ValueError(f"tp x pp x cp must divide world_size: {self.tp} x {self.pp} x {self.cp} = {split} "
                             f"does not divide {self.world_size} processes")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True splits the sequence over the tensor-parallel processes: it needs "
                             "tp >= 2, got tp=1")
        if self.schedule == "1f1b" and self.pp > 1 and self.microbatches < self.pp:
            # torch's Schedule1F1B refuses it too: its warm-up needs a micro-batch per stage.
            raise ValueError(f"microbatches must be at least pp ({self.pp}) under schedule='1f1b', "
                             f"got {self.microbatches}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep must divide the {self.dp * self.cp} data-parallel x context processes, got ep={self.ep}")
        _check_processes(self.strategy, "strategy", self.dp, self.splits)

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
    def dp(self) -> int:
        """The data-parallel degree: the processes ``strategy`` applies over, ``world_size // (tp * pp * cp)``."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def splits(self) -> dict[str, int]:
        """The degrees above 1 that split the model or its sequences, by name ("tp", "pp", "cp"): empty for data parallelism alone."""
        return {name: getattr(self, name) for name in _SPLITS if getattr(self, name) > 1}

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


def _check_processes(strategy: str, argument: str, dp: int, splits: dict[str, int] | None = None) -> None:
    """Refuse a strategy that divides the state on one data-parallel process, or "none" on several.

    ``splits``: the layout's degrees that split the model otherwise
    (:attr:`Layout.splits`), so that "none" on one data-parallel process is allowed.
    """
    splits = splits or {}
    over = next(iter(splits)) if len(splits) == 1 else f"({' * '.join(splits)})"
    if dp == 1 and strategy != "none":
        if splits:
            raise ValueError(f"{argument}={strategy!r} divides the state between data-parallel processes: it needs "
                             f"world_size // {over} >= 2, got 1 (use strategy 'none' for "
                             f"{' x '.join(f'{name}={degree}' for name, degree in splits.items())} alone)")
        raise ValueError(f"{argument}={strategy!r} divides the state between processes: it needs world_size >= 2, "
                         f"got world_size=1")
    if dp > 1 and strategy == "none":
        others = "'zero3'/'fsdp'" if argument == "sharding" else "'zero3'"
        if splits:
            raise ValueError(f"{argument}='none' leaves {dp} data-parallel copies: with world_size // {over} = "
                             f"{dp}, pass {argument}='ddp', 'zero1', 'zero2' or {others}")
        raise ValueError(f"{argument}='none' is one process: with world_size={dp}, pass {argument}='ddp', "
                         f"'zero1', 'zero2' or {others}")


def block_lists(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """Return every non-empty ModuleList of ``model``: a transformers model has one, its repeated blocks (the units FSDP shards)."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    return [module for module in model.modules() if isinstance(module, torch.nn.ModuleList) and len(module) > 0]


def device_mesh(layout: Layout):
    """Return the CPU device mesh ``layout`` runs on, in this process's (real or fake) process group of as many processes.

    One dimension of ``world_size`` processes, unnamed, without tensor
    parallelism; with it, a dimension named "tp" of ``tp`` processes (neighbours
    in rank), after one named "dp" of ``dp`` processes when ``dp`` > 1.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    check_instance(layout, "layout", Layout, "a Layout")
    if not dist.is_initialized() or dist.get_world_size() != layout.world_size:
        found = f"{dist.get_world_size()} processes" if dist.is_initialized() else "none"
        raise RuntimeError(f"layout: a mesh of {layout.world_size} processes needs a process group of as many "
                           f"(a launched worker in sharding.gloo_group(), or the planner's fake group); found {found}")
    if layout.tp == 1:
        return init_device_mesh("cpu", (layout.world_size,))
    if layout.dp == 1:
        return init_device_mesh("cpu", (layout.tp,), mesh_dim_names=("tp",))
    return init_device_mesh("cpu", (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def apply_layout(model: torch.nn.Module, layout: Layout, blocks=None, mesh=None, plan=None,
                 **fsdp_options) -> torch.nn.Module:
    """Return ``model`` laid out as ``layout`` says, in this process: the model to train.

    With ``layout.tp`` > 1, first each block's layers split over the mesh's
    "tp" dimension by DTensor's ``parallelize_module``, with ``plan`` (a plan
    of ``parallelize_module``; :func:`tensor_parallel_plan` of the model if
    None). Then the strategy, over the data-parallel processes (the mesh's
    "dp" dimension, or all of it without tensor parallelism; with tensor
    parallelism "zero2" or "zero3", DDP refused). "none": the
    model; "ddp" and "zero1": the model in DistributedDataParallel (its
    defaults); "zero2" and "zero3": FSDP2's ``fully_shard`` on each of
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
    if layout.pp > 1:
        raise ValueError(f"layout: pp={layout.pp} is applied stage by stage: build process rank's stage with "
                         f"pipeline_stage(model, layout, rank) and run it with pipeline_schedule")
    if layout.cp > 1 and (layout.tp > 1 or layout.pp > 1):
        raise NotImplementedError(f"layout: context parallelism with tensor or pipeline parallelism (cp={layout.cp}, "
                                  f"tp={layout.tp}, pp={layout.pp}) is not applied yet")
    if layout.ep > 1 and layout.ep != layout.cp:
        raise NotImplementedError(f"layout: expert parallelism is applied over the context-parallel processes only "
                                  f"(ep == cp), got ep={layout.ep}, cp={layout.cp}")
    if layout.cp > 1:
        return _context_parallel(model, layout)
    if layout.tp > 1 and layout.wraps_in_ddp:
        raise ValueError(f"layout: strategy {layout.strategy!r} with tp={layout.tp} is not applied by the course (DDP "
                         f"over DTensor parameters); shard the data-parallel dimension with 'zero2' or 'zero3'")
    if plan is not None and layout.tp == 1:
        raise ValueError(f"plan splits layers over tensor-parallel processes: layout has tp=1")
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = device_mesh(layout) if mesh is None else mesh
        plan = tensor_parallel_plan(model, layout.sequence_parallel) if plan is None else plan
        parallelize_module(model, _mesh_dim(mesh, "tp"), plan)
    if layout.wraps_in_ddp:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if not layout.shards_with_fsdp:
        return model
    from torch.distributed.fsdp import fully_shard

    options = {"reshard_after_forward": layout.reshard_after_forward, **fsdp_options}
    mesh = device_mesh(layout) if mesh is None else mesh
    mesh = _mesh_dim(mesh, "dp") if layout.tp > 1 else mesh
    for block in blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def _mesh_dim(mesh, name: str):
    """Return ``mesh``'s dimension ``name`` ("dp" or "tp"), or ``mesh`` itself when it has one dimension only, of that name."""
    names = mesh.mesh_dim_names or ()
    if mesh.ndim == 1 and (not names or names == (name,)):
        return mesh
    if name not in names:
        raise ValueError(f"mesh must have a dimension named {name!r} (device_mesh(layout) makes one), got {names}")
    return mesh[name]


# --------------------------------------------------------------------------- tensor parallelism's plans


def tensor_parallel_plan(model: torch.nn.Module, sequence_parallel: bool = False) -> dict:
    """Return the ``parallelize_module`` plan that splits ``model``'s layers over tensor-parallel processes.

    From the transformers config's ``base_model_tp_plan`` where the family has
    one (Llama, Qwen, Mistral, Gemma...: "colwise" and "rowwise" layers,
    prefixed with the base model's name inside ``model``); for DistilBERT,
    the course's own (:func:`distilbert_plan`); any other model is refused,
    named. With ``sequence_parallel``: each row-split layer reduce-scatters its
    partial outputs to this process's tokens (``output_layouts=Shard(1)``),
    the norms inside the blocks run on those tokens (``SequenceParallel``), each
    row-split layer's parent (attention, MLP) all-gathers the tokens first, the
    first block takes this process's tokens of the embeddings (no
    communication: every process has them all), and the base model's last
    norm gathers them back (the head and the loss see the whole sequence).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    config = getattr(model, "config", None)
    entries = getattr(config, "base_model_tp_plan", None)
    if entries:
        return _plan_from_config(model, dict(entries), sequence_parallel)
    if getattr(config, "model_type", None) == "distilbert":
        if sequence_parallel:
            raise ValueError(f"sequence_parallel: the course's DistilBERT plan splits no sequence ({type(model).__name__}"
                             f"'s norms follow each residual sum); pass sequence_parallel=False")
        return distilbert_plan(model)
    raise ValueError(f"model: {type(model).__name__} has no tensor-parallel plan: its config has no "
                     f"base_model_tp_plan (transformers gives one to Llama, Qwen, Mistral, Gemma and others) and the "
                     f"course has none for it (DistilBERT); pass apply_layout(..., plan=) a parallelize_module plan")


_STYLES = ("colwise", "rowwise")


def _plan_from_config(model: torch.nn.Module, entries: dict, sequence_parallel: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    )

    unknown = sorted({style for style in entries.values() if style not in _STYLES})
    if unknown:
        raise ValueError(f"model: {type(model).__name__}'s base_model_tp_plan uses {unknown}; the course applies "
                         f"{list(_STYLES)} only (DTensor's ColwiseParallel and RowwiseParallel)")
    base = getattr(model, "base_model", model)
    prefix = next(name for name, module in model.named_modules() if module is base)
    prefix = f"{prefix}." if prefix else ""
    rowwise = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
    plan = {prefix + pattern: ColwiseParallel() if style == "colwise" else copy.deepcopy(rowwise)
            for pattern, style in entries.items()}
    if not sequence_parallel:
        return plan
    blocks = [(name, module) for name, module in base.named_children() if isinstance(module, torch.nn.ModuleList)]
    if len(blocks) != 1:
        raise ValueError(f"model: {type(model).__name__}'s base model has {len(blocks)} lists of blocks; "
                         f"sequence_parallel needs one")
    blocks_name, block_list = blocks[0]
    for pattern, style in entries.items():
        if style == "rowwise":
            plan[prefix + pattern.rsplit(".", 1)[0]] = _gathered_tokens()
    for name, module in block_list[0].named_children():
        if "norm" in name.lower() and not list(module.children()):
            plan[f"{prefix}{blocks_name}.*.{name}"] = SequenceParallel()
    plan[f"{prefix}{blocks_name}.0"] = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1),
                                                          use_local_output=True)
    for name, module in base.named_children():
        if "norm" in name.lower() and not list(module.children()):
            plan[prefix + name] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(),
                                                     use_local_output=True)
    return plan


def _gathered_tokens():
    """Return a ParallelStyle: the module's input (its first positional argument, else ``hidden_states``) all-gathered.

    Its input is this process's tokens (a DTensor sharded on the sequence, or
    its local part); the module gets them all, a replicated DTensor, so that
    the column-split layers inside it see the whole sequence and autograd
    reduce-scatters the gradient back (``PrepareModuleInput`` takes either
    positional or keyword inputs: transformers' attention takes keywords, its MLP a positional).
    """
    return _gathered_tokens_class()()


@functools.cache
def _gathered_tokens_class() -> type:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class GatheredTokens(ParallelStyle):
        def _apply(self, module, device_mesh):
            def gathered(tokens):
                if not isinstance(tokens, DTensor):
                    tokens = DTensor.from_local(tokens, device_mesh, (Shard(1),), run_check=False)
                return tokens.redistribute(placements=(Replicate(),))

            def hook(_, args, kwargs):
                if args:
                    return (gathered(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": gathered(kwargs["hidden_states"])}

            module.register_forward_pre_hook(hook, with_kwargs=True)
            return module

    return GatheredTokens


def distilbert_plan(model: torch.nn.Module) -> dict:
    """Return the ``parallelize_module`` plan of a transformers DistilBERT: each block's attention and FFN split."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    check_instance(model, "model", torch.nn.Module, "a transformers DistilBERT model")
    if not hasattr(getattr(model, "distilbert", None), "transformer"):
        raise ValueError(f"model: expected a DistilBERT (with .distilbert.transformer), got {type(model).__name__}")
    plan = {}
    for index in range(len(model.distilbert.transformer.layer)):
        prefix = f"distilbert.transformer.layer.{index}"
        for name in ("attention.q_lin", "attention.k_lin", "attention.v_lin", "ffn.lin1"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        for name in ("attention.out_lin", "ffn.lin2"):
            plan[f"{prefix}.{name}"] = RowwiseParallel()
    return plan


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


# --------------------------------------------------------------------------- pipeline stages (lesson 9)


def stage_blocks(num_blocks: int, pp: int) -> list[range]:
    """Return the blocks each of ``pp`` pipeline stages holds, as torchtitan divides them: one range per stage.

    torchtitan's ``generate_llm_fqn_per_model_part`` (input and output weight
    1): the embeddings and the final norm and head count as one block each,
    the ``num_blocks + 2`` divided evenly, the remainder to the first stages;
    the first stage holds the embeddings and one block fewer, the last the
    head and one block fewer.
    """
    check_positive_int(num_blocks, "num_blocks")
    check_positive_int(pp, "pp")
    if pp == 1:
        return [range(num_blocks)]
    per_stage, extra = divmod(num_blocks + 2, pp)
    if per_stage < 2:
        raise ValueError(f"pp: {pp} stages leave a stage without a block of the model's {num_blocks} "
                         f"(each stage needs at least one, the first and last one beside the embeddings and the head)")
    ranges, start = [], 0
    for stage in range(pp):
        count = per_stage + (stage < extra) - (stage == 0) - (stage == pp - 1)
        ranges.append(range(start, start + count))
        start += count
    return ranges


def pipeline_stage(model: torch.nn.Module, layout: Layout, stage: int, blocks: range | None = None) -> torch.nn.Module:
    """Return stage ``stage`` of ``layout.pp`` of ``model`` (a transformers decoder-only causal LM, Llama's family): a module of its parts.

    The first stage holds the token embeddings, every stage a contiguous range
    of the blocks (``blocks``, else the stage's share, :func:`stage_blocks`)
    and the rotary embedding (no parameters), the last the final norm and the
    head. Its ``forward`` takes what the stage before sent (the first stage:
    ``input_ids``) and returns what it sends on (the last stage: the logits),
    as ``model``'s own forward computes it; the modules are ``model``'s own, not copies.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(layout, "layout", Layout, "a Layout")
    check_int_in_range(stage, "stage", 0, layout.pp - 1)
    inner = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, part) for part in parts) or not hasattr(model, "lm_head"):
        raise TypeError(f"model must be a decoder-only causal LM of Llama's family (model.embed_tokens, .layers, "
                        f".norm, .rotary_emb, and lm_head), got {type(model).__name__}")
    if layout.pp > 1 and getattr(model.config, "tie_word_embeddings", False):
        raise ValueError(f"model: {type(model).__name__} ties its head to its embeddings, which would live on two "
                         f"stages (the first and the last); untie them (tie_word_embeddings=False) to pipeline it")
    if blocks is None:
        blocks = stage_blocks(len(inner.layers), layout.pp)[stage]
    if not isinstance(blocks, range) or not blocks or blocks.step != 1 or blocks.start < 0 or blocks.stop > len(
            inner.layers):
        raise ValueError(f"blocks must be a non-empty range of consecutive blocks of the model's {len(inner.layers)}, "
                         f"got {blocks!r}")
    return _DecoderStage(model, first=stage == 0, last=stage == layout.pp - 1, blocks=blocks)


class _DecoderStage(torch.nn.Module):
    """One pipeline stage of a Llama-family causal LM: its embeddings (first), its blocks, its norm and head (last)."""

    def __init__(self, model, first: bool, last: bool, blocks: range) -> None:
        super().__init__()
        inner = model.model
        self.config = model.config
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(inner.layers[index] for index in blocks)
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
        # As LlamaModel.forward: positions from 0, the causal mask, the rotary angles, then the blocks.
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=position_ids)
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for block in self.layers:
            hidden = block(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids)
        if self.lm_head is None:
            return hidden
        return self.lm_head(self.norm(hidden))


def pipeline_schedule(stage_module: torch.nn.Module, layout: Layout, stage: int, loss_fn, micro_batch_input,
                      micro_batch_output):
    """Return torch's schedule of ``layout`` (``ScheduleGPipe`` or ``Schedule1F1B``) running ``stage_module`` as stage ``stage``.

    A ``torch.distributed.pipelining.PipelineStage`` on the CPU, told the
    shapes it receives and sends (``micro_batch_input``, ``micro_batch_output``:
    tensors, on the meta device is enough, of one micro-batch), so that no
    stage infers them by sending objects; ``layout.microbatches`` micro-batches,
    ``loss_fn(output, target)`` on the last stage, the gradients those of the
    mean over the micro-batches (``scale_grads``), as one process's. Call it
    in a process group of ``layout.pp`` processes (a launched worker, or the
    planner's fake group). ``schedule.step(batch, target=labels, return_outputs=False)``
    runs one step on the first stage (``step(target=labels, ...)`` on the
    last, ``step()`` between).
    """
    from torch.distributed import pipelining

    check_instance(stage_module, "stage_module", torch.nn.Module, "a torch.nn.Module")
    check_instance(layout, "layout", Layout, "a Layout")
    check_int_in_range(stage, "stage", 0, layout.pp - 1)
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function of (output, target), got {type(loss_fn).__name__}")
    for value, name in ((micro_batch_input, "micro_batch_input"), (micro_batch_output, "micro_batch_output")):
        check_instance(value, name, torch.Tensor, "a tensor shaped as one micro-batch")
    piped = pipelining.PipelineStage(stage_module, stage, layout.pp, torch.device("cpu"),
                                     input_args=micro_batch_input, output_args=micro_batch_output)
    kind = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[layout.schedule]
    return kind(piped, n_microbatches=layout.microbatches, loss_fn=loss_fn, scale_grads=True)
