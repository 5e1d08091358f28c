"""Building a model too big for one process: on the meta device, sharded, then given storage shard by shard (lesson 7).

``model.to("cuda")`` or a plain ``from_pretrained`` first makes the **whole**
model in every process, and only then does ``fully_shard`` cut it: each process
peaks at the full model, whatever *N*. The recipe that never holds it whole:

1. build the model on the ``meta`` device (shapes, no storage);
2. ``fully_shard`` each block, then the root: the parameters become DTensors
   whose local shards are still on ``meta``;
3. ``model.to_empty(device=...)``: each process allocates **its shards only**,
   uninitialised (buffers too: the ones no checkpoint holds are set again here);
4. load the weights per shard: ``torch.distributed.checkpoint.load`` reads only
   the slices of a sharded checkpoint that each process owns
   (:mod:`course_utils.sharded_checkpoints`), or
   ``set_model_state_dict(..., StateDictOptions(full_state_dict=True,
   broadcast_from_rank0=True))`` sends each process its shards from the one
   process that read a full file.

:func:`shard_bytes` and :func:`planned_parameter_bytes` plan what step 3
allocates in one process; :func:`full_copies_per_node` computes what loading
the whole model in every process of a node would take.
"""

from __future__ import annotations

import math

import torch

from course_utils.validation import check_instance, check_positive_int, is_integer

__all__ = [
    "NODE_HOST_MEMORY",
    "build_sharded_on_meta",
    "full_copies_per_node",
    "planned_parameter_bytes",
    "shard_bytes",
]

NODE_HOST_MEMORY = {
    "DGX H100 (8 GPUs)": (2 * 1024**4, "NVIDIA DGX H100 data sheet: system memory 2 TB (32 x 64 GB DIMMs, "
                                       "MLCommons system description of a DGX H100)"),
    "DGX A100 (8 GPUs)": (1024**4, "NVIDIA DGX A100 data sheet: system memory 1 TB (2 TB optional)"),
}
"""Host memory of one node, in bytes, with its source: name -> (bytes, source)."""


def shard_bytes(shape, element_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """Return (padded, own): the bytes FSDP2 allocates for process ``rank``'s shard of a parameter, and its real rows.

    FSDP2 cuts dim 0 into ``world_size`` chunks of ``ceil(rows / world_size)``
    rows (``torch.chunk``); every process allocates a full chunk (``padded``,
    the last processes' padding included), while its own rows (``own``) can be
    fewer, or none. A 0-d parameter counts as one row.
    """
    check_positive_int(element_size, "element_size")
    check_positive_int(world_size, "world_size")
    if not is_integer(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int from 0 to {world_size - 1}, got {rank!r}")
    shape = tuple(shape)
    if not all(is_integer(size) and size >= 0 for size in shape):
        raise ValueError(f"shape must be a sequence of non-negative ints, got {shape!r}")
    rows = shape[0] if shape else 1
    per_row = math.prod(shape[1:]) * element_size
    chunk = -(-rows // world_size)
    own = max(0, min(chunk, rows - rank * chunk))
    return chunk * per_row, own * per_row


def planned_parameter_bytes(model: torch.nn.Module, world_size: int, rank: int = 0) -> int:
    """Return the parameter bytes process ``rank`` of ``world_size`` allocates at ``to_empty`` (its padded shards)."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    return sum(shard_bytes(p.shape, p.element_size(), world_size, rank)[0] for p in model.parameters())


def full_copies_per_node(num_parameters: int, bytes_per_parameter: int, ranks_per_node: int) -> int:
    """Return the bytes a node needs when each of its ``ranks_per_node`` processes loads the whole model first."""
    check_positive_int(num_parameters, "num_parameters")
    check_positive_int(bytes_per_parameter, "bytes_per_parameter")
    check_positive_int(ranks_per_node, "ranks_per_node")
    return num_parameters * bytes_per_parameter * ranks_per_node


def build_sharded_on_meta(config, mesh, reshard_after_forward: bool = True) -> torch.nn.Module:
    """Return a sequence classifier of ``config`` sharded over ``mesh``, holding only this process's shards (uninitialised).

    Built on the meta device (buffers excepted: they are small, and those that
    are not persistent, DistilBERT's ``position_ids``, are in no checkpoint),
    sharded with ``fully_shard`` per block then on the root (``layouts.apply_layout``), given storage
    with ``to_empty(device="cpu")``, its buffers put back (``to_empty`` empties
    them too), dropout off as in :func:`course_utils.sharding.course_model`.
    Load its weights next (:func:`course_utils.sharded_checkpoints.load_sharded`).
    """
    from accelerate import init_empty_weights
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import AutoModelForSequenceClassification, PretrainedConfig

    from course_utils import layouts, parallel, sharding

    check_instance(config, "config", PretrainedConfig, "a transformers configuration (model.config)")
    check_instance(mesh, "mesh", DeviceMesh, "a torch.distributed DeviceMesh (init_device_mesh)")
    with init_empty_weights(include_buffers=False):
        model = parallel.without_dropout(AutoModelForSequenceClassification.from_config(config))
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    layouts.apply_layout(model, layouts.Layout("zero3", mesh.size()), sharding.sharded_blocks(model), mesh,
                         reshard_after_forward=reshard_after_forward)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    return model
