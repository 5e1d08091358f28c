"""CPU offload under FSDP2 (``CPUOffloadPolicy``): what moves between the GPU and host memory each step (lesson 7).

With ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` each process keeps
its **sharded** parameters, their gradients and the optimizer state in host
memory, and the optimizer step runs on the CPU. What crosses to the GPU, per
step and per process (read in torch 2.13's ``_fsdp_param.py`` and
``_fsdp_collectives.py``):

- before every all-gather, the unit's padded shard is copied host to device
  (``all_gather_inputs``): once per unit in the forward pass, and once more in
  the backward pass for each unit resharded after its forward (not the root,
  which FSDP2 keeps gathered);
- after every reduce-scatter, the process's own gradient rows are copied device
  to host, where AdamW will read them.

:func:`planned_offload_bytes` plans those bytes from the model's shapes;
:class:`OffloadCopyCounter` counts the copies FSDP asks for in a real run, and
how many bytes they actually moved: on a CPU-only machine "device" and "host"
are the same memory, ``tensor.to("cpu")`` returns the tensor itself, and
nothing moves. The counts are what a GPU run copies over PCIe; their time is
the GPU's (:mod:`course_utils.comm_time`).

ZeRO-Offload (Ren et al., 2021) keeps the fp16 parameters on the GPU and moves
only the fp16 gradients down and the updated fp16 parameters up; FSDP2's
policy also keeps the parameters on the host, and copies them up at each
all-gather.
"""

from __future__ import annotations

import os
import sys

import torch

from course_utils.meta_init import shard_bytes
from course_utils.validation import check_bool, check_in_process_group, check_instance, check_positive_int, is_integer

__all__ = ["OffloadCopyCounter", "planned_offload_bytes", "train_with_offload"]

# Where FSDP2 makes each copy (torch 2.13): the file of the calling frame says which way it goes.
_COPY_SITES = {"_fsdp_param.py": "host_to_device", "_fsdp_collectives.py": "device_to_host"}


def _units(model: torch.nn.Module) -> list[tuple[list[torch.nn.Parameter], bool]]:
    """Return (parameters, is_root) for each FSDP unit of the lesson's sharding: every block, then the root's rest."""
    from course_utils import sharding

    blocks = [list(block.parameters()) for block in sharding.sharded_blocks(model)]
    in_blocks = {id(p) for block in blocks for p in block}
    return [(block, False) for block in blocks] + [([p for p in model.parameters() if id(p) not in in_blocks], True)]


def planned_offload_bytes(model: torch.nn.Module, world_size: int, rank: int = 0,
                          reshard_after_forward: bool = True) -> dict[str, int]:
    """Return the bytes process ``rank`` copies each step under ``CPUOffloadPolicy``: ``host_to_device``, ``device_to_host``.

    ``model`` is unsharded (its shapes are read), sharded as the lesson shards
    it (``fully_shard`` on each block, then the root). Host to device: each
    unit's padded shard per all-gather (two for a block resharded after the
    forward pass, one for the root); device to host: this process's own
    gradient rows of every parameter.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_positive_int(world_size, "world_size")
    if not is_integer(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int from 0 to {world_size - 1}, got {rank!r}")
    check_bool(reshard_after_forward, "reshard_after_forward")
    up = down = 0
    for parameters, is_root in _units(model):
        sizes = [shard_bytes(p.shape, p.element_size(), world_size, rank) for p in parameters]
        gathers = 2 if reshard_after_forward and not is_root else 1
        up += gathers * sum(padded for padded, _ in sizes)
        down += sum(own for _, own in sizes)
    return {"host_to_device": up, "device_to_host": down}


class OffloadCopyCounter:
    """Count the bytes FSDP2 copies between host and device while the block runs, in every thread.

    ``counted[direction]``: the bytes of each tensor FSDP's code hands to
    ``Tensor.to`` (``host_to_device`` before an all-gather,
    ``device_to_host`` after a reduce-scatter); ``moved``: the bytes of the
    copies that made a new tensor (0 when device and host are one memory, as
    on a CPU). ``Tensor.to`` is wrapped for the duration of the block.
    """

    def __init__(self):
        self.counted = {"host_to_device": 0, "device_to_host": 0}
        self.moved = 0
        self._original = None

    def __enter__(self):
        original = self._original = torch.Tensor.to

        def counting_to(tensor, *args, **kwargs):
            result = original(tensor, *args, **kwargs)
            direction = _COPY_SITES.get(os.path.basename(sys._getframe(1).f_code.co_filename))
            if direction is not None:
                size = tensor.numel() * tensor.element_size()
                self.counted[direction] += size
                self.moved += size if result is not tensor else 0
            return result

        torch.Tensor.to = counting_to
        return self

    def __exit__(self, *exc_info):
        torch.Tensor.to = self._original
        return False


def train_with_offload(steps: int = 3, batch_size: int = 6) -> dict:
    """Train the tiny model under ZeRO-3 with ``CPUOffloadPolicy`` in this launched process, in its process group.

    Call it inside :func:`course_utils.sharding.gloo_group` on every process
    of a launch. Trains as :func:`course_utils.sharding.train_with_strategy`
    does ("zero3", same batches and shares) and counts the copies of the last
    step. Returns ``{"counted": {direction: bytes}, "moved": bytes,
    "devices": the devices of the sharded parameters, "losses": [...],
    "final_parameters": whole parameters after the last step (rank 0 only)}``.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import DTensor

    from course_utils import sharding

    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_in_process_group("train_with_offload")
    # pin_memory needs CUDA; on GPUs it lets the copies overlap with compute (the default, True).
    model = sharding.zero3_course_model(offload_policy=CPUOffloadPolicy(pin_memory=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=sharding.LEARNING_RATE)
    batches, counter = sharding.course_batches(steps, batch_size), OffloadCopyCounter()
    losses = sharding.train_steps(model, optimizer, batches[:-1])
    with counter:  # the copies of one step: the last
        losses += sharding.train_steps(model, optimizer, batches[-1:])
    final = sharding.whole_parameters(model)
    return {"counted": dict(counter.counted), "moved": counter.moved, "losses": losses,
            "devices": sorted({str(p.to_local().device) for p in model.parameters() if isinstance(p, DTensor)}),
            "final_parameters": final if dist.get_rank() == 0 else {}}
