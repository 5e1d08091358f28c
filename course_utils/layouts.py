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

from course_utils.validation import check_choice, check_instance, check_int_in_range, check_positive_int

__all__ = [
    "PIPELINE_SCHEDULES", "SHARDING", "STRATEGIES", "Layout", "apply_layout", "block_lists", "device_mesh",
    "layout_optimizer", "pipeline_schedule", "pipeline_stage", "stage_blocks",
]

STRATEGIES = ("none", "ddp", "zero1", "zero2", "zero3")
"""The strategies a :class:`Layout` takes, from one process to everything sharded."""

SHARDING = (*STRATEGIES, "fsdp")
"""The values ``memory.estimate_training_memory(sharding=...)`` takes; "fsdp" is "zero3", "none" on one process is plain."""

_ALIASES = {"fsdp": "zero3"}

PIPELINE_SCHEDULES = ("gpipe", "1f1b")
"""The pipeline schedules a :class:`Layout` takes: torch's ``ScheduleGPipe`` and ``Schedule1F1B``."""


@dataclass(frozen=True)
class Layout:
    """How ``world_size`` processes divide a model: ``strategy`` (one of :data:`STRATEGIES`) over its data-parallel processes.

    ``pp``: pipeline stages (lesson 9), each process running one stage of
    consecutive blocks (:func:`pipeline_stage`); the batch is cut into
    ``microbatches`` that ``schedule`` ("gpipe" or "1f1b",
    :data:`PIPELINE_SCHEDULES`) runs through the stages. The data-parallel
    degree :attr:`dp` is ``world_size // pp``: ``strategy`` applies over those
    processes, and is "none" when there is one.
    """

    strategy: str
    world_size: int = 1
    pp: int = 1
    schedule: str = "gpipe"
    microbatches: int = 1

    def __post_init__(self) -> None:
        check_choice(self.strategy, "strategy", STRATEGIES)
        check_positive_int(self.world_size, "world_size")
        check_positive_int(self.pp, "pp")
        check_choice(self.schedule, "schedule", PIPELINE_SCHEDULES)
        check_positive_int(self.microbatches, "microbatches")
        if self.world_size % self.pp:
            raise ValueError(f"pp must divide world_size: {self.pp} pipeline stages do not divide "
                             f"{self.world_size} processes")
        if self.schedule == "1f1b" and self.pp > 1 and self.microbatches < self.pp:
            # torch's Schedule1F1B refuses it too: its warm-up needs a micro-batch per stage.
            raise ValueError(f"microbatches must be at least pp ({self.pp}) under schedule='1f1b', "
                             f"got {self.microbatches}")
        _check_processes(self.strategy, "strategy", self.dp, self.pp)

    @property
    def dp(self) -> int:
        """The data-parallel degree: the processes ``strategy`` divides the state between (``world_size // pp``)."""
        return self.world_size // self.pp

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


def _check_processes(strategy: str, argument: str, dp: int, pp: int = 1) -> None:
    """Refuse a strategy that divides the state on one data-parallel process, or one process's step on several."""
    if dp == 1 and strategy != "none":
        if pp > 1:
            raise ValueError(f"{argument}={strategy!r} divides the state between data-parallel processes: it needs "
                             f"world_size // pp >= 2, got world_size={pp} with pp={pp}")
        raise ValueError(f"{argument}={strategy!r} divides the state between processes: it needs world_size >= 2, "
                         f"got world_size=1")
    if dp > 1 and strategy == "none":
        others = "'zero3'/'fsdp'" if argument == "sharding" else "'zero3'"
        if pp > 1:
            raise ValueError(f"{argument}='none' is one data-parallel process: with world_size // pp = {dp}, pass "
                             f"{argument}='ddp', 'zero1', 'zero2' or {others}")
        raise ValueError(f"{argument}='none' is one process: with world_size={dp}, pass {argument}='ddp', "
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
