"""Every collective a process runs, counted by kind, bytes and process group, whoever calls it (lesson 9).

Lesson 7's :class:`course_utils.sharding.CollectiveCounter` wraps the Python
functions of ``torch.distributed``; DTensor (tensor and sequence parallelism)
does not call them: it runs torch's *functional* collectives
(``torch.ops._c10d_functional``), and FSDP2 and ``dist.all_reduce`` reach the
``torch.ops.c10d`` operators. Both kinds pass through torch's dispatcher, so a
``TorchDispatchMode`` sees every one of them, with the process group it runs
on: :class:`CollectiveLog` records them, and :meth:`CollectiveLog.by_group`
splits them per dimension of a device mesh (lesson 9's 2-D meshes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.validation import check_instance

__all__ = ["Collective", "CollectiveLog"]

# Operator name (its packet's name) -> (the collective's name, the position of the tensor handed in).
# c10d's in-place operators take lists of tensors; the functional ones take one tensor and a group name.
_OPERATORS = {
    "allreduce_": ("all_reduce", 0), "all_reduce": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 1), "allgather_": ("all_gather", 1),
    "all_gather_into_tensor": ("all_gather", 0), "allgather_into_tensor_coalesced_": ("all_gather", 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 0), "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0), "alltoall_base_": ("all_to_all", 1), "all_to_all_single": ("all_to_all", 0),
}


@dataclass(frozen=True)
class Collective:
    """One collective call: ``kind`` (all_reduce, all_gather, ...), ``group`` (its process group's name), ``bytes`` handed in."""

    kind: str
    group: str
    bytes: int


def _bytes(value) -> int:
    tensors = value if isinstance(value, (list, tuple)) else [value]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _group_name(args) -> str:
    """Return the name of the process group among an operator's arguments (an object or, functional, a string)."""
    from torch.distributed import ProcessGroup

    for arg in args:
        if isinstance(arg, ProcessGroup):
            return arg.group_name
        # The c10d operators receive the group boxed for TorchScript.
        if isinstance(arg, torch.ScriptObject) and str(arg._type()).endswith("c10d.ProcessGroup"):
            return ProcessGroup.unbox(arg).group_name
    strings = [arg for arg in args if isinstance(arg, str)]
    return strings[-1] if strings else "?"


class CollectiveLog(TorchDispatchMode):
    """Within ``with CollectiveLog() as log:``, ``log.calls`` lists every collective this process ran, in order.

    Bytes are those of the tensor this process hands in (for an all-gather, its
    own shard). The backward pass is seen too: on CPU it runs in the thread
    that called ``backward()``.
    """

    def __init__(self):
        super().__init__()
        self.calls: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _OPERATORS:
            kind, position = _OPERATORS[name]
            self.calls.append(Collective(kind, _group_name(args), _bytes(args[position])))
        return func(*args, **(kwargs or {}))

    def counts(self) -> dict[str, int]:
        """Return {kind: number of calls}."""
        return dict(Counter(call.kind for call in self.calls))

    def payload(self) -> dict[str, int]:
        """Return {kind: bytes handed in}, summed over the calls."""
        total: Counter = Counter()
        for call in self.calls:
            total[call.kind] += call.bytes
        return dict(total)

    def by_group(self, mesh) -> dict[str, dict[str, int]]:
        """Return {mesh dimension name: {kind: bytes handed in}} for the calls on ``mesh``'s dimensions.

        A call on a group that is no dimension of ``mesh`` is listed under its group's name.
        """
        from torch.distributed.device_mesh import DeviceMesh

        check_instance(mesh, "mesh", DeviceMesh, "a torch DeviceMesh with named dimensions")
        names = {mesh.get_group(dim).group_name: dim for dim in mesh.mesh_dim_names or ()}
        split: dict[str, Counter] = {}
        for call in self.calls:
            split.setdefault(names.get(call.group, call.group), Counter())[call.kind] += call.bytes
        return {dim: dict(kinds) for dim, kinds in split.items()}
