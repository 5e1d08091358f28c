"""Sharded data parallelism on CPU processes: DDP, ZeRO-1, ZeRO-2 and ZeRO-3/FSDP, run and measured (lesson 7).

Under data parallelism (lesson 6) every process holds the whole training state:
parameters, gradients and optimizer state. ZeRO ("Zero Redundancy Optimizer")
cuts that state into N shards, one per process, in three stages:

- **ZeRO-1** shards the optimizer state: torch's ``ZeroRedundancyOptimizer``
  gives each process the state (and the update) of about 1/N of the parameter
  tensors, then broadcasts the updated parameters;
- **ZeRO-2** shards the gradients too: each process keeps only the averaged
  gradients of its shard (a reduce-scatter instead of an all-reduce). Here it is
  FSDP2 with ``reshard_after_forward=False``: parameters stay gathered from the
  forward pass to the end of the backward pass, as ZeRO-2 keeps them;
- **ZeRO-3 / FSDP** shards the parameters as well: FSDP2's ``fully_shard`` on
  each block, then on the root; a block's parameters are all-gathered just
  before it runs and freed just after.

:func:`train_with_strategy` is the function each worker runs (through
:func:`course_utils.launcher.launch`): it trains the course's tiny DistilBERT
for a few steps under one strategy and returns a :class:`ProcessMemory`, what
that process held, measured in the process. :func:`train_one_process` trains the
same model on the whole batch in one process, the reference every strategy must
reproduce.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import warnings
from dataclasses import dataclass, field

import torch

from course_utils import layouts
from course_utils.loopback import gloo_on_loopback
from course_utils.validation import (
    check_choice, check_in_launch, check_in_process_group, check_instance, check_non_negative_int, check_positive_int,
)

__all__ = [
    "CATEGORIES",
    "agrees_with_plan",
    "course_batches",
    "share_of_batch",
    "largest_unit_bytes",
    "CollectiveCounter",
    "ring_wire_bytes",
    "PRECISIONS",
    "STRATEGIES",
    "ProcessMemory",
    "held_bytes",
    "measure_laid_out_step",
    "measure_planned_step",
    "measure_planned_step_rise",
    "prepare",
    "sharded_blocks",
    "train_one_process",
    "train_steps",
    "whole_parameters",
    "zero3_course_model",
    "class_prior_loss",
    "drift",
    "train_with_local_sgd",
    "train_with_strategy",
]

STRATEGIES = tuple(strategy for strategy in layouts.STRATEGIES if strategy != "none")
"""The strategies :func:`train_with_strategy` runs, from nothing sharded to everything sharded: ("ddp", "zero1", "zero2", "zero3")."""

STRATEGY_NAMES = {
    "none": "one process",
    "ddp": "DDP",
    "zero1": "ZeRO-1 (ZeroRedundancyOptimizer)",
    "zero2": "ZeRO-2 (fully_shard, reshard_after_forward=False)",
    "zero3": "ZeRO-3 / FSDP (fully_shard)",
}

CATEGORIES = ("parameters", "gradients", "optimizer_state", "buckets")
"""What each process holds between steps, as :class:`ProcessMemory` reports it (bytes)."""

LEARNING_RATE = 1e-3

PRECISIONS = ("fp32", "autocast", "autocast, no cache", "policy")
"""How :func:`train_with_strategy` runs the step: fp32; the forward pass under bf16 autocast (with its weight cast
cache, torch's default, or without it: ``cache_enabled=False``); or FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` (ZeRO-2/3 only): parameters gathered in bf16, gradients reduced in fp32."""

_LEFT_GROUPS: list = []


@contextlib.contextmanager
def gloo_group():
    """Within this block, this launched process is in the launch's process group, over gloo (on loopback); it leaves it after.

    The group's C++ object is kept until the process exits, not freed when the
    last model or optimizer holding it goes (a forked worker exits without
    freeing it). Freeing it joins gloo's worker threads while holding Python's
    lock, and a worker thread still releasing a finished collective's tensors
    waits for that lock: both wait forever (torch 2.13). It happened when a
    ZeRO-1 run returned (its broadcasts hand Python's tensors to gloo), more
    often the busier the machine.
    """
    import torch.distributed as dist

    # gloo's sockets on the loopback interface, whoever launched this process (without it,
    # they bind to the address the hostname resolves to: often the machine's LAN address).
    os.environ.update(gloo_on_loopback())
    dist.init_process_group("gloo")
    try:
        yield
    finally:
        _LEFT_GROUPS.append(dist.group.WORLD)
        dist.destroy_process_group()


@dataclass(frozen=True)
class ProcessMemory:
    """What one process held during a training run, measured in that process. All sizes in bytes.

    - ``strategy``, ``rank``, ``world_size``: which run and which process;
    - ``parameters``: the parameter storage this process holds between steps
      (its shard under ZeRO-3, padded to a multiple of ``world_size`` rows);
    - ``gradients``: the gradient storage it holds after the backward pass;
    - ``optimizer_state``: AdamW's state it holds after a step (``exp_avg``,
      ``exp_avg_sq``, and one 0-d ``step`` per parameter tensor it updates);
    - ``optimizer_scalars``: the part of ``optimizer_state`` in 0-d tensors
      (AdamW's ``step`` counts), which no strategy here divides;
    - ``buckets``: DDP's gradient buckets (flat copies of the gradients that DDP
      all-reduces), 0 without DDP;
    - ``peak``, ``peak_by_category``: the peak of the last step seen by torch's
      MemTracker (FSDPMemTracker under FSDP), and its split at that moment;
      DDP's buckets, allocated before the step, are not in it;
    - ``passes_peak``: the tracker's peak over the last step's forward and backward
      passes only (below ``peak`` when the optimizer step sets the peak);
    - ``activations``: what the forward pass kept for the backward pass (MemTracker);
    - ``optimizer_shapes``: the shapes of the (local) tensors whose AdamW state
      this process holds, largest first;
    - ``communicated``: bytes this process handed to each kind of collective
      during the last step (see :class:`CollectiveCounter`);
    - ``fsdp_units``: how many modules ``fully_shard`` was applied to (0 without FSDP);
    - ``fsdp_unit_names``: their names in the model (``""`` for the root), in the model's order;
    - ``precision``: the run's :data:`PRECISIONS` entry;
    - ``parameter_casts``: bytes of the copies of parameters in another dtype
      (``aten._to_copy`` of a parameter: autocast's bf16 casts) still alive when
      the last forward pass ends;
    - ``dtypes``: the dtype of this process's (sharded) parameters, of their
      gradients, of AdamW's moments and of the gathered parameters, by those names;
    - ``losses``: the loss of every step, averaged over the processes (the loss
      of the whole batch);
    - ``final_parameters``: every parameter after the last step, whole (gathered
      from the shards), as name -> float32 tensor; filled on rank 0 only.
    """

    strategy: str
    rank: int
    world_size: int
    parameters: int
    gradients: int
    optimizer_state: int
    optimizer_scalars: int
    buckets: int
    activations: int
    peak: int
    peak_by_category: dict = field(default_factory=dict)
    passes_peak: int = 0
    optimizer_shapes: tuple = ()
    fsdp_units: int = 0
    fsdp_unit_names: tuple = ()
    precision: str = "fp32"
    parameter_casts: int = 0
    dtypes: dict = field(default_factory=dict)
    communicated: dict = field(default_factory=dict)
    losses: tuple = ()
    final_parameters: dict = field(default_factory=dict, repr=False)

    def held(self) -> dict[str, int]:
        """Return {category: bytes} for :data:`CATEGORIES` plus ``activations``."""
        return {name: getattr(self, name) for name in (*CATEGORIES, "activations")}


# --------------------------------------------------------------------------- counting what a process holds


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """Return the part of ``tensor`` this process holds: a DTensor's local shard, else the tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def held_bytes(tensors) -> int:
    """Return the bytes of storage this process holds for ``tensors``, each storage counted once.

    A DTensor counts its local shard only (with its padding: FSDP2 pads dim 0
    to a multiple of the number of processes).
    """
    if isinstance(tensors, torch.Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"tensors must be an iterable of tensors (model.parameters()), got {type(tensors).__name__}")
    tensors = list(tensors)
    if not all(tensor is None or isinstance(tensor, torch.Tensor) for tensor in tensors):
        raise TypeError("tensors must hold torch.Tensors (or None), got "
                        + ", ".join(sorted({type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)})))
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = _local(tensor).untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _optimizer_states(optimizer) -> list[torch.Tensor]:
    """Return every state tensor of ``optimizer`` (the local one inside a ZeroRedundancyOptimizer)."""
    inner = getattr(optimizer, "optim", optimizer)
    return [value for state in inner.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def _state_shapes(optimizer) -> tuple[tuple[int, ...], ...]:
    """Return the shapes of the tensors whose state ``optimizer`` holds in this process, largest first."""
    inner = getattr(optimizer, "optim", optimizer)
    shapes = [tuple(_local(state["exp_avg"]).shape) for state in inner.state.values() if "exp_avg" in state]
    return tuple(sorted(shapes, key=lambda shape: (-math.prod(shape), shape)))


def _bucket_bytes(ddp_model) -> int:
    """Return the bytes of DDP's gradient buckets in this process, from DDP's own logging data."""
    sizes = ddp_model._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(size) for size in str(sizes).split(",") if size.strip())


# --------------------------------------------------------------------------- counting what a process communicates


class CollectiveCounter:
    """Count the bytes this process hands to each kind of collective while the block runs: ``counted[name]``.

    FSDP2 and ZeroRedundancyOptimizer call ``torch.distributed``'s Python
    functions (``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``,
    ``broadcast``), which are wrapped here for the duration of the block; DDP
    all-reduces its buckets from C++, so :meth:`watch_ddp` counts them through a
    DDP communication hook. Counted: the bytes of this process's input tensor
    (for a broadcast, of the tensor, whichever process sends it).
    """

    # The position and name of the argument whose bytes are counted.
    _ARGUMENT = {"all_gather_single": (1, "input_tensor"), "reduce_scatter_single": (1, "input"),
                 "all_reduce": (0, "tensor"), "broadcast": (0, "tensor")}

    def __init__(self):
        self.counted: dict[str, int] = {}
        self.active = False
        self._originals = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self.active:
            self.counted[name] = self.counted.get(name, 0) + tensor.numel() * tensor.element_size()

    def watch_ddp(self, ddp_model) -> None:
        """Make DDP all-reduce its buckets through Python, where they are counted (as "all_reduce").

        DDP's default communication hook: the same all-reduce DDP does in C++,
        through ``torch.distributed.all_reduce``.
        """
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp_model.register_comm_hook(None, allreduce_hook)

    def __enter__(self):
        import torch.distributed as dist

        for name, position in self._ARGUMENT.items():
            original = getattr(dist, name)
            self._originals[name] = original

            def counting(*args, _name=name, _position=position, _original=original, **kwargs):
                index, keyword = _position
                self.add(_name, args[index] if len(args) > index else kwargs[keyword])
                return _original(*args, **kwargs)

            setattr(dist, name, counting)
        return self

    def __exit__(self, *exc_info):
        import torch.distributed as dist

        for name, original in self._originals.items():
            setattr(dist, name, original)
        return False


# The bytes one process sends, per byte it hands in, on N processes, when each collective runs as a ring
# (the ZeRO paper's count, section 7; NCCL's ring algorithms): an all-reduce is a reduce-scatter then an
# all-gather, each sending (N-1)/N of the whole tensor; an all-gather's input is one shard, so it sends N-1 shards;
# a broadcast, pipelined along a ring, is sent N-1 times between N processes: (N-1)/N per process on average.
_RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter_single": lambda n: (n - 1) / n,
                "all_gather_single": lambda n: n - 1, "broadcast": lambda n: (n - 1) / n}


def ring_wire_bytes(counted: dict[str, int], world_size: int) -> float:
    """Return the bytes one process sends over the wire for the payloads ``counted`` (a :class:`CollectiveCounter`'s).

    Each collective taken as a ring on ``world_size`` processes (see ``_RING_FACTOR``);
    the broadcasts averaged over the processes.
    """
    check_positive_int(world_size, "world_size")
    unknown = set(counted) - set(_RING_FACTOR)
    if unknown:
        raise ValueError(f"counted: no ring count for {sorted(unknown)}; expected names among {sorted(_RING_FACTOR)}")
    return sum(_RING_FACTOR[name](world_size) * value for name, value in counted.items())


# --------------------------------------------------------------------------- the model and the data


def sharded_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Return the repeated blocks of a transformers model (its one ModuleList of layers), the units FSDP shards."""
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module (a transformers model)")
    lists = layouts.block_lists(model)
    if len(lists) != 1:
        raise ValueError(f"model: expected one ModuleList of blocks in {type(model).__name__}, found {len(lists)}")
    return list(lists[0])


def fresh_course_model():
    """Return a fresh copy of the course's tiny pre-trained DistilBERT without dropout (so runs compare)."""
    return copy.deepcopy(course_model())


@functools.cache
def course_model():
    """Return the course's tiny pre-trained DistilBERT without dropout, loaded once per process and shared.

    Read it (count it, plan it); train a :func:`fresh_course_model`. A notebook that
    loads it before launching hands it to every worker it forks.
    """
    from course_utils import models, parallel

    return parallel.without_dropout(models.load_pretrained_classifier())


@functools.cache
def _batches(steps: int, batch_size: int) -> tuple[dict, ...]:
    """Return ``steps`` batches of ``batch_size`` examples of the course data, the same in every process."""
    from course_utils import data

    train, _ = data.make_dataloaders(batch_size=batch_size, seed=0, limit=steps * batch_size)
    return tuple(dict(batch) for batch in train)[:steps]


def prepare(steps: int = 3, batch_size: int = 6) -> None:
    """Load the model and the batches here, once: the workers forked afterwards find them in memory."""
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    course_model()
    _batches(steps, batch_size)


def _slice(batch: dict, rank: int, world_size: int) -> dict:
    """Return process ``rank``'s equal share of ``batch`` (rows ``rank * b`` to ``(rank + 1) * b``)."""
    rows = next(iter(batch.values())).shape[0] // world_size
    return {name: value[rank * rows:(rank + 1) * rows] for name, value in batch.items()}


def course_batches(steps: int, batch_size: int) -> tuple[dict, ...]:
    """Return the batches every run of this module trains on (the same in every process), for other lesson-7 modules."""
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    return _batches(steps, batch_size)


def share_of_batch(batch: dict, rank: int, world_size: int) -> dict:
    """Return process ``rank``'s equal share of ``batch``, as :func:`train_with_strategy` takes it."""
    check_positive_int(world_size, "world_size")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int from 0 to {world_size - 1}, got {rank!r}")
    return _slice(batch, rank, world_size)


# --------------------------------------------------------------------------- training


def train_one_process(steps: int = 3, batch_size: int = 6) -> dict:
    """Train the tiny model alone on whole batches; return ``{"losses": [...], "final_parameters": {...}}``.

    The reference for :func:`train_with_strategy`: N processes with shares of
    ``batch_size / N`` examples must take the same steps.
    """
    from course_utils import parallel

    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    model = fresh_course_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for batch in _batches(steps, batch_size):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "final_parameters": parallel.parameters_of(model)}


def train_with_strategy(strategy: str, steps: int = 3, batch_size: int = 6,
                        reshard_after_forward: bool | None = None, shard_function=None,
                        precision: str = "fp32") -> ProcessMemory:
    """Train the tiny model under ``strategy`` in this launched process; return what it held (a :class:`ProcessMemory`).

    Run it on every process of a launch (:func:`course_utils.launcher.launch`):
    it joins the group over gloo, trains ``steps`` steps on batches of
    ``batch_size`` examples split equally between the processes, and measures
    the last step with torch's memory tracker. ``strategy`` is one of
    :data:`STRATEGIES`; ``reshard_after_forward`` overrides the strategy's own
    FSDP2 setting (True for "zero3", False for "zero2"). ``shard_function(model,
    mesh)``, if given, replaces the strategy's own ``fully_shard`` calls (an
    exercise's answer) and must return the model. ``precision``: one of
    :data:`PRECISIONS` ("policy" with "zero2" or "zero3" only).
    """
    import torch.distributed as dist

    check_choice(strategy, "strategy", STRATEGIES)
    check_choice(precision, "precision", PRECISIONS)
    if precision == "policy" and strategy not in ("zero2", "zero3"):
        raise ValueError(f"precision='policy' is FSDP2's MixedPrecisionPolicy: strategy must be 'zero2' or 'zero3', "
                         f"got {strategy!r}")
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size < 2:
        raise RuntimeError("train_with_strategy runs in a launch of 2 or more processes (launcher.launch)")
    if batch_size % world_size:
        raise ValueError(f"batch_size must be a multiple of the {world_size} processes, got {batch_size}")
    with gloo_group():
        return _train(strategy, steps, batch_size, reshard_after_forward, dist.get_rank(), world_size, shard_function,
                      precision)


def wrap_for_strategy(model, strategy, reshard_after_forward, shard_function=None, mp_policy=None):
    """Return (model to train, optimizer, DDP module or None) for ``strategy``; ``mp_policy``: FSDP2's, or None (fp32)."""
    layout = layouts.Layout(strategy, int(os.environ["WORLD_SIZE"]))
    if shard_function is not None and layout.shards_with_fsdp:  # an exercise's answer replaces the layout's own
        model = shard_function(model, layouts.device_mesh(layout))
    else:
        model = layouts.apply_layout(model, layout, sharded_blocks(model),
                                     **_given(reshard_after_forward=reshard_after_forward, mp_policy=mp_policy))
    optimizer = layouts.layout_optimizer(layout, model.parameters(), torch.optim.AdamW, lr=LEARNING_RATE)
    return model, optimizer, model if layout.wraps_in_ddp else None


def _given(**options) -> dict:
    """Return the options given (not None): FSDP2's, where None is the strategy's own setting."""
    return {name: value for name, value in options.items() if value is not None}


def _tracker(model, optimizer, fsdp: bool):
    """Return torch's memory tracker for this step: FSDPMemTracker when the root is sharded, MemTracker otherwise."""
    if fsdp:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(model, optimizer)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    # A ZeroRedundancyOptimizer keeps this process's state in the optimizer it wraps.
    tracker.track_external(model, getattr(optimizer, "optim", optimizer))
    return tracker


def _snapshot(tracker, kind: str) -> dict[str, int]:
    """Return the tracker's ``kind`` snapshot of the CPU as {category name: bytes}, its category names shortened."""
    snapshot = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    return {str(getattr(key, "value", key)): int(value) for key, value in snapshot.items()}


def _mp_policy(precision: str):
    """Return FSDP2's MixedPrecisionPolicy for ``precision`` "policy" (bf16 gathers, fp32 reductions), else None."""
    if precision != "policy":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _forward_precision(precision: str):
    """Return the context the forward pass runs in: bf16 autocast (with or without its cast cache), or nothing."""
    if precision == "autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision == "autocast, no cache":
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class ParameterCasts:
    """A dispatch mode that keeps a weak reference to every copy of a parameter in another dtype made while it runs.

    :meth:`alive_bytes` returns the bytes of those copies still alive: what
    autocast's bf16 casts of the weights cost at that moment, whoever keeps
    them (its cast cache, or autograd, which saves a matrix product's inputs).
    """

    def __init__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        self._copies = []
        casts = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.nn.Parameter):
                    casts._copies.append(weakref.ref(out))
                return out

        self.mode = _Mode()

    def alive_bytes(self) -> int:
        """Return the bytes of the copies made so far that are still alive (each storage once)."""
        return held_bytes(copy for copy in (reference() for reference in self._copies) if copy is not None)


def _dtypes(model, optimizer) -> dict[str, str]:
    """Return the dtype of ``model``'s (local) parameters, gradients, AdamW moments and gathered parameters."""
    first = next(model.parameters())
    state = next((s["exp_avg"] for s in getattr(optimizer, "optim", optimizer).state.values() if "exp_avg" in s), None)
    gathered = first.dtype
    fsdp_state = getattr(model, "_get_fsdp_state", None)
    if fsdp_state is not None and fsdp_state()._fsdp_param_group is not None:
        gathered = fsdp_state()._fsdp_param_group.mp_policy.param_dtype or first.dtype
    return {name: str(dtype).removeprefix("torch.") for name, dtype in (
        ("parameters", _local(first).dtype), ("gradients", _local(first.grad).dtype if first.grad is not None else None),
        ("optimizer state", _local(state).dtype if state is not None else None), ("gathered", gathered))}


def _train(strategy, steps, batch_size, reshard_after_forward, rank, world_size, shard_function,
           precision="fp32") -> ProcessMemory:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    model, optimizer, ddp = wrap_for_strategy(fresh_course_model(), strategy, reshard_after_forward, shard_function,
                                              _mp_policy(precision))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"the sharding function must return the model, got {type(model).__name__}")
    losses, gradients, activations, peak, at_peak, casts_alive, dtypes, passes_peak = [], 0, 0, 0, {}, 0, {}, 0
    counter = CollectiveCounter()
    if ddp is not None:
        counter.watch_ddp(ddp)
    batches = _batches(steps, batch_size)
    for index, whole in enumerate(batches):
        batch = _slice(whole, rank, world_size)
        measured = index == len(batches) - 1
        tracker = _tracker(model, optimizer, isinstance(model, FSDPModule)) if measured else contextlib.nullcontext()
        with warnings.catch_warnings():
            # transformers builds the classifier's loss module inside forward; MemTracker
            # warns that it skips its hooks. The totals are unaffected.
            warnings.filterwarnings("ignore", message="Module is None. Skipping", category=UserWarning)
            counter.active = measured
            with tracker, counter:
                casts = ParameterCasts()
                with casts.mode if measured and precision != "fp32" else contextlib.nullcontext():
                    with _forward_precision(precision):
                        loss = model(**batch).loss
                    if measured:
                        casts_alive = casts.alive_bytes()
                if measured:
                    activations = _snapshot(tracker, "current").get("Activation", 0)
                loss.backward()
                gradients = held_bytes(p.grad for p in model.parameters())
                if measured:
                    dtypes = _dtypes(model, optimizer)
                    passes_peak = _snapshot(tracker, "peak").get("Total", 0)
                optimizer.step()
                optimizer.zero_grad()
            counter.active = False
        if measured:
            at_peak = _snapshot(tracker, "peak")
            peak = at_peak.pop("Total", 0)
        whole_loss = loss.detach().clone()
        dist.all_reduce(whole_loss)
        losses.append(whole_loss.item() / world_size)
    final = _whole_parameters(model, ddp)
    return ProcessMemory(
        strategy=strategy, rank=rank, world_size=world_size,
        parameters=held_bytes(model.parameters()), gradients=gradients,
        optimizer_state=held_bytes(_optimizer_states(optimizer)),
        optimizer_scalars=held_bytes(t for t in _optimizer_states(optimizer) if t.dim() == 0),
        buckets=_bucket_bytes(ddp) if ddp is not None else 0, activations=activations,
        peak=peak, peak_by_category=at_peak, passes_peak=passes_peak, losses=tuple(losses),
        optimizer_shapes=_state_shapes(optimizer),
        communicated=dict(counter.counted),
        fsdp_units=sum(isinstance(module, FSDPModule) for module in model.modules()),
        fsdp_unit_names=tuple(name for name, module in model.named_modules() if isinstance(module, FSDPModule)),
        precision=precision, parameter_casts=casts_alive, dtypes=dtypes,
        final_parameters=final if rank == 0 else {},
    )


def measure_planned_step(strategy: str, batch_size: int, seq_len: int, optimizer: str = "adamw",
                         mixed_precision: str = "no"):
    """Measure, in this launched process, the step ``memory.estimate_training_memory(..., sharding=strategy)`` plans.

    The tiny model sharded as :func:`train_with_strategy` shards it ("zero2"
    or "zero3"; "ddp": wrapped in DistributedDataParallel with its defaults;
    "zero1": that, with ``ZeroRedundancyOptimizer`` over its parameters),
    the planner's batch (``training_batch``: ``batch_size`` sequences of
    ``seq_len`` tokens, no padding), a warm-up step then the measured one under
    torch's FSDPMemTracker (MemTracker for DDP and ZeRO-1, as
    ``training_memory.measure_training_step_peak`` runs it), the forward pass
    under bf16 autocast when ``mixed_precision`` is "bf16" (as the planner's).
    Returns a ``TrainingMemory`` (bytes).
    """
    from course_utils import memory
    from course_utils.optimizers import SUPPORTED_OPTIMIZERS, make_optimizer

    check_choice(strategy, "strategy", ("ddp", "zero1", "zero2", "zero3"))
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_choice(optimizer, "optimizer", SUPPORTED_OPTIMIZERS)
    check_in_launch("measure_planned_step")
    with gloo_group():
        batch = memory.training_batch(course_model(), batch_size, seq_len)
        step = memory.TrainingSetup(optimizer, batch_size, seq_len, mixed_precision)
        if strategy in ("ddp", "zero1"):
            model = layouts.apply_layout(fresh_course_model(), layouts.Layout(strategy, int(os.environ["WORLD_SIZE"])))
            if strategy == "ddp":
                return memory.measure_training_step_peak(model, make_optimizer(optimizer, list(model.parameters())),
                                                         batch, mixed_precision=mixed_precision)
            trainable = [p for p in model.parameters() if p.requires_grad]
            return memory.measure_zero1_step(model, memory.zero1_optimizer(trainable, optimizer), batch, step)
        model, _, _ = wrap_for_strategy(fresh_course_model(), strategy, None)
        # The planner's optimizer, over the sharded parameters.
        optimizer = make_optimizer(step.optimizer, list(model.parameters()))
        return memory.measure_fsdp_step(model, optimizer, batch, step)


def measure_laid_out_step(model_class, config, layout: layouts.Layout, batch_size: int, seq_len: int,
                          optimizer: str = "adamw", mixed_precision: str = "no", gradient_accumulation_steps: int = 1,
                          dtype: torch.dtype = torch.float32, checkpointing: bool = False, seed: int = 0):
    """Measure, in this launched process, the step ``memory.estimate_training_memory(..., layout=layout, rank=r)`` plans.

    Lesson 9's counterpart of :func:`measure_planned_step`, for a layout that
    splits the model or its sequences (``tp``, ``sp``, ``pp``, ``cp``):
    ``model_class.from_config(config, dtype=dtype)`` (a transformers class,
    weights drawn from ``seed``: the same in every process; with
    ``checkpointing``, activation checkpointing on), laid out by
    ``layouts.apply_layout`` (a pipeline: this process's stage, run by
    torch's schedule, ``memory.pipeline_stages.measure_stage_step``), trained
    by ``optimizer`` on the planner's batch (``memory.training_batch``:
    ``batch_size`` sequences of ``seq_len`` tokens, the same in every process;
    under context parallelism this process's part of each, ``layouts.context_batch``),
    measured after a warm-up step as ``memory.measure_training_step_peak``
    measures it. Returns a ``TrainingMemory`` (bytes).
    """
    import torch.distributed as dist
    from transformers import PretrainedConfig

    from course_utils import memory
    from course_utils.memory.pipeline_stages import measure_stage_step
    from course_utils.optimizers import SUPPORTED_OPTIMIZERS, make_optimizer

    if not callable(getattr(model_class, "from_config", None)):
        raise TypeError(f"model_class must be a transformers model class (LlamaForCausalLM...), got {model_class!r}")
    check_instance(config, "config", PretrainedConfig, "a transformers config (LlamaConfig(...))")
    check_instance(layout, "layout", layouts.Layout, "a Layout")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_choice(optimizer, "optimizer", SUPPORTED_OPTIMIZERS)
    check_in_launch("measure_laid_out_step")
    torch.manual_seed(seed)
    model = model_class.from_config(config, dtype=dtype)
    if checkpointing:
        model.activation_checkpointing_enable()
    with gloo_group():
        if layout.pp > 1:
            return measure_stage_step(model, layout, memory.TrainingSetup(optimizer, batch_size, seq_len), seed)
        model = layouts.apply_layout(model, layout)
        batch = memory.training_batch(model, batch_size, seq_len, torch.Generator().manual_seed(seed))
        if layout.cp > 1:
            batch = layouts.context_batch(batch, layout, dist.get_rank())
        trained = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        return memory.measure_training_step_peak(model, trained, batch, mixed_precision=mixed_precision,
                                                 gradient_accumulation_steps=gradient_accumulation_steps)


def largest_unit_bytes(model: torch.nn.Module, world_size: int = 1) -> int:
    """Return the most parameter bytes one FSDP unit gathers on ``world_size`` processes.

    A unit is a block of :func:`sharded_blocks`, or what the root keeps; each
    parameter's first dimension counts padded to a multiple of ``world_size``, as
    FSDP2 pads its shards (the gathered buffer holds the padding too).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module (a transformers model)")
    check_positive_int(world_size, "world_size")

    def gathered(parameters):
        return sum(-(-p.shape[0] // world_size) * world_size * (p.numel() // max(p.shape[0], 1)) * p.element_size()
                   if p.dim() else p.element_size() for p in parameters)

    blocks = [gathered(block.parameters()) for block in sharded_blocks(model)]
    in_blocks = {id(p) for block in sharded_blocks(model) for p in block.parameters()}
    root = gathered(p for p in model.parameters() if id(p) not in in_blocks)
    return max([*blocks, root])


def agrees_with_plan(plan, measured, slack: int = 0) -> bool:
    """Return True when ``measured`` holds what ``plan`` says: every part to the byte, each peak at most ``slack`` above.

    Under FSDP a real process's peak can hold one more gathered unit than the plan
    (``slack``: :func:`largest_unit_bytes` on as many processes): when gloo's thread finishes an
    all-gather early, its output is alive at the peak, a timing the fake process
    group, whose collectives return at once, never has.
    """
    from course_utils.memory import TrainingMemory

    check_instance(plan, "plan", TrainingMemory, "a TrainingMemory (memory.estimate_training_memory's)")
    check_instance(measured, "measured", TrainingMemory, "a TrainingMemory (measure_planned_step's)")
    check_non_negative_int(slack, "slack")
    parts = ("weights", "gradients", "optimizer_state", "activations")
    if any(getattr(plan, part) != getattr(measured, part) for part in parts):
        return False
    peaks = [(plan.peak, measured.peak)] + [(plan.peak_by_phase.get(phase, 0), held)
                                             for phase, held in measured.peak_by_phase.items()]
    return all(0 <= held - planned <= slack for planned, held in peaks)


def measure_planned_step_rise(strategy: str, batch_size: int, seq_len: int) -> dict[str, int]:
    """Measure, in this launched process, how far one step raises memory, by two instruments at once; return bytes.

    The step of :func:`measure_planned_step` (after its warm-up step), run under
    torch's ``FSDPMemTracker`` (the planner's: ``memory.fsdp_tracker``) and
    ``torch.profiler.profile(profile_memory=True)`` together. Returns ``tracker_rise`` (the tracker's peak minus what it held
    when the step began: tensors made by torch operations in the step's own
    thread), ``allocator_rise`` (the CPU allocator's largest total over the step,
    from the profiler's allocation events on every thread, minus its total at the
    start) and ``allocating_threads`` (how many threads the profiler saw allocate).
    """
    from course_utils import memory
    from course_utils.optimizers import make_optimizer

    check_choice(strategy, "strategy", ("zero2", "zero3"))
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_in_launch("measure_planned_step_rise")
    with gloo_group():
        model, _, _ = wrap_for_strategy(fresh_course_model(), strategy, None)
        optimizer = make_optimizer("adamw", list(model.parameters()))
        batch = memory.training_batch(course_model(), batch_size, seq_len)
        step = memory.TrainingSetup("adamw", batch_size, seq_len)
        model.train()
        memory.fsdp_step(model, optimizer, batch, step, None)  # the warm-up step: state created
        tracker = memory.fsdp_tracker(model, optimizer)
        with memory.recording_allocator() as allocator:
            with tracker:
                held_at_start = memory.fsdp_snapshot(tracker, "current")["Total"]
                seen = memory.fsdp_step(model, optimizer, batch, step, tracker)
        return {"tracker_rise": memory.fsdp_memory(seen).peak - held_at_start,
                "allocator_rise": allocator.rise, "allocating_threads": allocator.threads}


def _whole_parameters(model, ddp) -> dict[str, torch.Tensor]:
    return whole_parameters(ddp.module if ddp is not None else model)


# --------------------------------------------------------------------------- lesson 7's later runs: one ZeRO-3 model, trained


def zero3_course_model(mesh=None, **fsdp_options) -> torch.nn.Module:
    """Return a fresh course model under ZeRO-3 over this launch's processes (call it on each, inside :func:`gloo_group`).

    ``fully_shard`` on each block, then on the root, as the lesson shards it,
    with FSDP2's own resharding choice; ``mesh`` and ``fsdp_options`` (an
    ``offload_policy``) are handed to ``fully_shard``. The runs of
    :mod:`course_utils.offload` and :mod:`course_utils.sharded_checkpoints` start here.
    """
    import torch.distributed as dist

    check_in_process_group("zero3_course_model")
    model = fresh_course_model()
    # reshard_after_forward=None: FSDP2's own choice (every unit but the root), its default.
    return layouts.apply_layout(model, layouts.Layout("zero3", dist.get_world_size()), sharded_blocks(model), mesh,
                                reshard_after_forward=None, **fsdp_options)


def train_steps(model: torch.nn.Module, optimizer, batches) -> list[float]:
    """Take one optimizer step per whole batch, each process on its share; return each whole batch's loss.

    Call it on every process of the group (the loss is averaged over them with an all-reduce).
    """
    import torch.distributed as dist

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    check_in_process_group("train_steps")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    losses = []
    for whole in batches:
        loss = model(**share_of_batch(whole, rank, world_size)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        losses.append(summed.item() / world_size)
    return losses


def whole_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return every parameter, whole, as name -> float32 tensor (gathering shards: every process must call it)."""
    from torch.distributed.tensor import DTensor

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to(torch.float32).clone()
        for name, p in model.named_parameters()
    }


# --------------------------------------------------------------------------- synchronising less often: LocalSGD


def train_with_local_sgd(local_sgd_steps: int | None, steps: int = 8, batch_size: int = 6,
                         seeds: tuple[int, ...] = (0,)) -> list[dict]:
    """Train the tiny model with Accelerate's DDP in this launched process, with ``LocalSGD`` every ``local_sgd_steps`` steps.

    ``local_sgd_steps=None`` is plain DDP (gradients all-reduced every step);
    an int K runs the loop inside ``accelerate.local_sgd.LocalSGD``: no
    gradient all-reduce, the parameters averaged every K steps. For each of
    ``seeds``, a fresh model trains on ``steps`` batches of ``batch_size``
    examples of the course data shuffled with that seed, shared out between
    the processes (each takes its own). Returns, per seed, ``{"sent_per_step":
    bytes this process handed to collectives, divided by its steps (LocalSGD
    also averages once more when its block ends), "validation_loss": the mean
    loss of the final model on the whole validation set, "final_parameters":
    every parameter after training (rank 0 only, else empty)}``.
    """
    from accelerate import Accelerator

    if local_sgd_steps is not None:
        check_positive_int(local_sgd_steps, "local_sgd_steps")
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    accelerator = Accelerator(cpu=True)
    return [_train_with_local_sgd(accelerator, local_sgd_steps, steps, batch_size, seed) for seed in seeds]


def _train_with_local_sgd(accelerator, local_sgd_steps, steps, batch_size, seed) -> dict:
    from accelerate.local_sgd import LocalSGD

    from course_utils import data, parallel

    train, validation = data.make_dataloaders(batch_size=batch_size, seed=seed, limit=steps * batch_size)
    model = fresh_course_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    counter = CollectiveCounter()
    counter.watch_ddp(model)
    counter.active = True
    with counter, LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps or 1,
                           enabled=local_sgd_steps is not None) as local_sgd:
        for batch in train:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
    counter.active = False
    model.eval()
    with torch.no_grad():
        losses = [(model(**batch).loss.item(), len(batch["labels"])) for batch in validation]
    final = parallel.parameters_of(accelerator.unwrap_model(model)) if accelerator.is_main_process else {}
    return {"sent_per_step": sum(counter.counted.values()) / len(train),
            "validation_loss": sum(loss * rows for loss, rows in losses) / sum(rows for _, rows in losses),
            "final_parameters": final}


def class_prior_loss() -> float:
    """Return the validation loss of always predicting the training labels' frequencies: what a model that learnt nothing from the text scores."""
    from course_utils import data

    train, validation = data.make_dataloaders(batch_size=256, seed=0)
    train_labels = torch.cat([batch["labels"] for batch in train]).float()
    labels = torch.cat([batch["labels"] for batch in validation]).float()
    positive = train_labels.mean()
    return float(-(labels * positive.log() + (1 - labels) * (1 - positive).log()).mean())


def drift(final: dict, reference: dict, start: dict) -> float:
    """Return how far ``final`` lies from ``reference``, as a share of how far ``reference`` moved from ``start``.

    Each a name -> tensor dict of parameters; the distance is the Euclidean norm over every parameter
    together (the attention key biases, rounding noise only, left out as in ``parallel.max_parameter_difference``).
    """
    from course_utils import parallel

    for label, value in (("final", final), ("reference", reference), ("start", start)):
        check_instance(value, label, dict, "a name -> tensor dict of parameters")
    if not reference or set(final) != set(reference) or set(start) != set(reference):
        raise ValueError("final, reference and start must name the same parameters, at least one")
    names = [name for name in reference if not any(part in name for part in parallel.NOISE_ONLY_PARAMETERS)]
    apart = math.sqrt(sum(float((final[name] - reference[name]).pow(2).sum()) for name in names))
    moved = math.sqrt(sum(float((reference[name] - start[name]).pow(2).sum()) for name in names))
    if moved == 0:
        raise ValueError("reference equals start: a run that did not move has no drift to compare against")
    return apart / moved
