"""How long one training step takes, as its parts: compute, recomputation, communication, the optimizer step (issue 35).

Each term is derived, none is fitted:

- **compute**: the step's FLOPs (lesson 8's count, :func:`course_utils.speed.flops_per_token`:
  6 per matrix weight and token plus the attention's 12 x layers x length x width;
  a frozen weight does 4, as LoRA's base does: no weight gradient) divided by the
  device's dense peak in the training precision times an *achievable fraction*
  (measured: a matrix product's rate over the peak; for GPUs the published
  measurements in :mod:`course_utils.hardware`, for this CPU a run here);
- **recomputation**: with activation checkpointing the backward pass runs the
  forward again (its third of the FLOPs): hardware FLOPs, not model FLOPs;
- **communication**: the payload of each collective the layout runs (DDP's
  bucketed all-reduce; ZeRO-1's all-reduce and parameter broadcasts; FSDP's
  all-gathers and reduce-scatters, one per unit), turned into bytes on the wire
  by :func:`course_utils.comm_time.wire_bytes` and into seconds by a
  :class:`Link` (bandwidth per direction, latency per message). A ring is as
  fast as its slowest hop: between nodes that is the network;
- **overlap**: where the device runs collectives beside its arithmetic (GPUs:
  NCCL on its own stream), a collective issued during the forward or backward
  pass hides behind that pass's compute, all but the first unit's gather and the
  last bucket; ZeRO-1's broadcasts follow the optimizer step and hide behind
  nothing. Where it cannot (a CPU whose cores do both), everything is exposed;
- **optimizer step**: memory-bound: it reads the weights, gradients and state
  it updates and writes the weights and state back, at the memory bandwidth.

:func:`predict_step` returns a :class:`StepTime` with every term, tokens/s,
MFU (model FLOPs over the peak) and HFU (executed FLOPs over the peak).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from course_utils import comm_time, hardware, layouts, pipeline, speed
from course_utils.validation import (
    check_bool, check_choice, check_fraction, check_instance, check_non_negative_number, check_positive_int,
    check_positive_number,
)

__all__ = [
    "LAYOUTS", "DDP_BUCKET_BYTES", "Link", "Device", "FrameworkCosts", "Cluster", "Workload", "Collective", "StepTime",
    "gpu_device", "gpu_cluster", "workload_of", "collectives_of", "copy_bytes", "framework_seconds", "predict_step",
    "model_parallel_collectives", "EXPOSURE",
]

LAYOUTS = layouts.SHARDING
"""The layouts the memory planner plans (``sharding`` of :func:`course_utils.memory.estimate_training_memory`):
("none", "ddp", "zero1", "zero2", "zero3", "fsdp"), from :data:`course_utils.layouts.SHARDING`."""

DDP_BUCKET_BYTES = 25 * 1024**2
"""DDP's default gradient bucket (``bucket_cap_mb=25``, torch.nn.parallel.DistributedDataParallel): one all-reduce each."""


@dataclass(frozen=True)
class Link:
    """A link a collective runs on: ``bandwidth`` per process and direction (bytes/s), ``latency`` per message (s).

    ``by_collective``: {collective: bytes/s} where a kind of collective was
    measured apart (gloo on a loaded CPU runs its all-gathers and reduce-scatters
    slower per byte than its all-reduce); the others run at ``bandwidth``.
    """

    name: str
    bandwidth: float
    latency: float
    source: str
    by_collective: dict | None = None

    def __post_init__(self) -> None:
        check_positive_number(self.bandwidth, "bandwidth")
        check_non_negative_number(self.latency, "latency")
        for collective, value in (self.by_collective or {}).items():
            check_choice(collective, "by_collective key", comm_time.COLLECTIVES)
            check_positive_number(value, f"by_collective[{collective!r}]")

    def bandwidth_of(self, collective: str) -> float:
        """The bytes/s on the wire of ``collective`` (a name of :data:`course_utils.comm_time.COLLECTIVES`)."""
        check_choice(collective, "collective", comm_time.COLLECTIVES)
        return (self.by_collective or {}).get(collective, self.bandwidth)


@dataclass(frozen=True)
class Device:
    """One device in one precision: its theoretical ``peak`` (FLOP/s), the ``fraction`` of it a matrix product reaches,
    and its ``memory_bandwidth`` (bytes/s), each with where it came from."""

    name: str
    precision: str
    peak: float
    peak_source: str
    fraction: float
    fraction_source: str
    memory_bandwidth: float
    memory_bandwidth_source: str

    def __post_init__(self) -> None:
        check_positive_number(self.peak, "peak")
        check_fraction(self.fraction, "fraction", inclusive_high=True)
        if self.fraction == 0:
            raise ValueError("fraction must be above 0 (a share of the peak), got 0")
        check_positive_number(self.memory_bandwidth, "memory_bandwidth")

    @property
    def achievable(self) -> float:
        """The FLOP/s the device's matrix products reach: peak x fraction."""
        return self.peak * self.fraction


@dataclass(frozen=True)
class FrameworkCosts:
    """The CPU work a layout's framework adds to a step beyond arithmetic and the wire, measured on one machine.

    Measured on a *toy* of the model's structure (its units and parameter
    tensors, each a few elements: no arithmetic, no bandwidth), laid out for
    real, against the same toy on one process (:func:`course_utils.step_time_checks.measure_cpu_steps`):

    - ``passes``: {layout: seconds per unit and micro-batch} of forward and
      backward: FSDP2's hooks, its all-gathers' and reduce-scatters' Python
      and launches per unit, DDP's hooks and buckets; the collectives' own
      latency is left out (the links count it);
    - ``update``: {layout: seconds per parameter tensor} of the optimizer step:
      AdamW on FSDP2's DTensor shards dispatches each operation through
      DTensor's Python, ZeRO-1 broadcasts each tensor;
    - ``copy_bandwidth``: bytes/s (read + write) of a large copy: the copies
      into and out of each collective's flat buffer (:func:`copy_bytes`).
    """

    passes: dict
    update: dict
    copy_bandwidth: float
    source: str

    def __post_init__(self) -> None:
        for name in ("passes", "update"):
            table = getattr(self, name)
            if not isinstance(table, dict) or not all(key in LAYOUTS for key in table):
                raise ValueError(f"{name} must be a dict {{layout: seconds}} with layouts among {LAYOUTS}, got {table!r:.80}")
            for key, value in table.items():
                check_non_negative_number(value, f"{name}[{key!r}]")
        check_positive_number(self.copy_bandwidth, "copy_bandwidth")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``processes_per_node`` processes of one :class:`Device`, ``intra`` links inside a node, ``inter`` between.

    ``overlaps``: whether a collective can run while the device computes.
    ``framework``: the framework's own CPU work where it is measured and
    exposed (a CPU whose cores do it); None on GPUs, where the host runs ahead
    of the device and hides it (the published runs bear this out).
    """

    device: Device
    processes_per_node: int
    nodes: int
    intra: Link
    inter: Link | None
    overlaps: bool
    framework: FrameworkCosts | None = None

    def __post_init__(self) -> None:
        check_positive_int(self.processes_per_node, "processes_per_node")
        check_positive_int(self.nodes, "nodes")
        if self.nodes > 1 and self.inter is None:
            raise ValueError(f"inter must be a Link between the {self.nodes} nodes, got None")
        if self.framework is not None:
            check_instance(self.framework, "framework", FrameworkCosts, "a FrameworkCosts or None")

    @property
    def world_size(self) -> int:
        return self.processes_per_node * self.nodes

    @property
    def ring_link(self) -> Link:
        """The slowest hop of a ring over every process: the network when there are several nodes."""
        return self.inter if self.nodes > 1 else self.intra


def gpu_device(card: str, precision: str = "bf16") -> Device:
    """Return the :class:`Device` of ``card`` (a name of :data:`course_utils.hardware.CARDS`) in ``precision``.

    The fraction is the card's published matrix-product measurement in that
    precision; where none is published it is 1 (the data sheet's peak: the
    prediction is then a lower bound on the time), and the source says so.
    """
    entry = hardware.card(card)
    peak = hardware.peak_flops(card, precision)
    measured = hardware.achievable_fraction(card, precision)
    fraction, fraction_source = ((measured.value, measured.source) if measured is not None else
                                 (1.0, f"no published measurement for the {card} in {precision}: the peak itself, "
                                       "so the time is a lower bound"))
    return Device(card, precision, peak, entry.peaks[precision].source, fraction, fraction_source,
                  entry.memory_bandwidth.value, entry.memory_bandwidth.source)


def gpu_cluster(card: str, cards_per_node: int, nodes: int = 1, precision: str = "bf16",
                network: str | None = None) -> Cluster:
    """Return a :class:`Cluster` of ``nodes`` nodes of ``cards_per_node`` ``card`` GPUs, ``network`` between nodes.

    Inside a node the GPUs talk over NVLink where the card has it, else PCIe;
    ``network`` is a name of :data:`course_utils.hardware.NETWORKS` (needed with
    more than one node). No link latency is sourced here: it is taken as 0,
    so communication is a lower bound. GPUs overlap collectives with compute.
    """
    check_positive_int(cards_per_node, "cards_per_node")
    check_positive_int(nodes, "nodes")
    entry = hardware.card(card)
    kind = "nvlink" if "nvlink" in entry.links else "pcie"
    if kind not in entry.links:
        raise ValueError(f"card: no sourced link between {card} GPUs in the table")
    intra = Link(f"{card} {kind}", entry.links[kind].value, 0.0, entry.links[kind].source + "; latency not sourced: 0")
    inter = None
    if network is not None or nodes > 1:
        check_choice(network, "network", tuple(hardware.NETWORKS))
        figure = hardware.NETWORKS[network]
        inter = Link(network, figure.value, 0.0, figure.source + "; latency not sourced: 0")
    return Cluster(gpu_device(card, precision), cards_per_node, nodes, intra, inter, overlaps=True)


@dataclass(frozen=True)
class Workload:
    """What the time model needs of a model: counts of parameters (elements) and the bytes of each as stored and reduced.

    ``units``: the modules FSDP shards (the blocks and the root), each one
    all-gather and one reduce-scatter; ``tensors``: trainable parameter tensors
    (ZeRO-1 broadcasts each). Bytes per element: ``stored_bytes`` as the
    parameters are kept (the optimizer reads and writes those, and its moments
    follow their dtype), ``parameter_bytes`` as gathered, ``gradient_bytes`` as reduced.
    """

    parameters: int
    trainable: int
    matmul_weights: int
    frozen_matmul_weights: int
    layers: int
    width: int
    units: int
    tensors: int
    stored_bytes: int
    parameter_bytes: int
    gradient_bytes: int
    expert_weights: int = 0
    active_expert_weights: int = 0


def workload_of(model: torch.nn.Module, gather_bytes: int | None = None, reduce_bytes: int | None = None) -> Workload:
    """Return the :class:`Workload` of a transformers ``model`` (real or on the meta device).

    Bytes per parameter default to the parameters' own dtype; ``gather_bytes``
    and ``reduce_bytes`` override what FSDP gathers and reduces (FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: 2 and 4).
    In a mixture of experts ``matmul_weights`` counts the top-k experts a
    token runs through (:func:`course_utils.speed.matmul_weights`);
    ``expert_weights`` and ``active_expert_weights`` keep every expert's and the active ones'.
    """
    from course_utils import sharding

    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module (a transformers model)")
    for value, name in ((gather_bytes, "gather_bytes"), (reduce_bytes, "reduce_bytes")):
        if value is not None:
            check_positive_int(value, name)
    layers, width = speed.model_shape(model)
    parameters = list(model.parameters())
    trainable = [p for p in parameters if p.requires_grad]
    stored = max(parameters, key=lambda p: p.numel()).element_size()
    try:
        units = len(sharding.sharded_blocks(model)) + 1
    except ValueError:
        units = 1
    every_expert, active_experts = speed.expert_weights(model)
    return Workload(
        parameters=sum(p.numel() for p in parameters), trainable=sum(p.numel() for p in trainable),
        matmul_weights=speed.matmul_weights(model), frozen_matmul_weights=_frozen_matmul_weights(model), layers=layers, width=width,
        units=units, tensors=len(trainable), stored_bytes=stored, parameter_bytes=gather_bytes or stored,
        gradient_bytes=reduce_bytes or (trainable[0].element_size() if trainable else stored),
        expert_weights=every_expert, active_expert_weights=active_experts)


def _frozen_matmul_weights(model: torch.nn.Module) -> int:
    """The weights of ``model``'s matrix products that do not train (each counted once): LoRA's base, a frozen layer."""
    from transformers.pytorch_utils import Conv1D

    frozen = {id(m.weight): m.weight.numel() for m in model.modules()
              if isinstance(m, (torch.nn.Linear, Conv1D)) and not m.weight.requires_grad}
    return sum(frozen.values())


@dataclass(frozen=True)
class Collective:
    """One kind of collective in a step: its payload per process (bytes), messages (those whose latency is paid
    one after another), and the pass it runs during."""

    name: str
    payload: float
    messages: int
    during: str  # "forward", "backward" or "after" (the optimizer step: hides behind nothing)


def collectives_of(workload: Workload, layout: str, world_size: int) -> list[Collective]:
    """Return the collectives one process runs per optimizer step under ``layout`` on ``world_size`` processes.

    As torch runs them: DDP all-reduces its gradient buckets; ZeRO-1
    (``ZeroRedundancyOptimizer``) does the same, then broadcasts every updated
    parameter tensor from the process that owns it; ZeRO-2 (FSDP2,
    ``reshard_after_forward=False``) all-gathers each unit once and
    reduce-scatters its gradients; ZeRO-3/FSDP all-gathers each unit in the
    forward pass and again in the backward pass. One process communicates nothing.
    """
    check_instance(workload, "workload", Workload, "a Workload (workload_of(model))")
    check_choice(layout, "layout", LAYOUTS)
    check_positive_int(world_size, "world_size")
    if world_size == 1 or layout == "none":
        return []
    gradients = workload.trainable * workload.gradient_bytes
    shard = workload.parameters * workload.parameter_bytes / world_size
    if layout in ("ddp", "zero1"):
        reduce = [Collective("all_reduce", gradients, max(1, math.ceil(gradients / DDP_BUCKET_BYTES)), "backward")]
        if layout == "ddp":
            return reduce
        # ZeroRedundancyOptimizer._sync_params issues every tensor's broadcast asynchronously, then waits on all:
        # the latency is paid once per owning process, not per tensor.
        return reduce + [Collective("broadcast", workload.trainable * workload.parameter_bytes, world_size, "after")]
    gathers = [Collective("all_gather_single", shard, workload.units, "forward")]
    if layout in ("zero3", "fsdp"):
        gathers.append(Collective("all_gather_single", shard, workload.units, "backward"))
    return gathers + [Collective("reduce_scatter_single", gradients, workload.units, "backward")]


def copy_bytes(workload: Workload, layout: str, world_size: int) -> float:
    """Return the bytes one process copies (read + write) into and out of its collectives' buffers per micro-batch.

    DDP copies each gradient into its bucket and the averaged bucket back
    (``gradient_as_bucket_view=False``, its default); so does ZeRO-1. FSDP2
    copies each unit's shard into the all-gather's input and the gathered
    buffer out into the parameters (each all-gather), and the gradients into
    the reduce-scatter's input and its output shard out: a read and a write each.
    """
    check_instance(workload, "workload", Workload, "a Workload (workload_of(model))")
    check_choice(layout, "layout", LAYOUTS)
    check_positive_int(world_size, "world_size")
    if world_size == 1 or layout == "none":
        return 0.0
    gradients = workload.trainable * workload.gradient_bytes
    if layout in ("ddp", "zero1"):
        return 2 * 2 * gradients
    full = workload.parameters * workload.parameter_bytes
    gathers = 2 if layout in ("zero3", "fsdp") else 1
    return gathers * 2 * (full + full / world_size) + 2 * (gradients + gradients / world_size)


def framework_seconds(workload: Workload, cluster: Cluster, layout: str, gradient_accumulation_steps: int = 1) -> float:
    """Return the seconds ``cluster.framework`` adds to a step of ``workload`` under ``layout`` (0 without it).

    Per unit and micro-batch in the passes, per parameter tensor in the
    optimizer step, and the buffer copies (:func:`copy_bytes`) at the copy bandwidth.
    """
    check_instance(workload, "workload", Workload, "a Workload (workload_of(model))")
    check_instance(cluster, "cluster", Cluster, "a Cluster")
    check_choice(layout, "layout", LAYOUTS)
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    costs, world = cluster.framework, cluster.world_size
    if costs is None or world == 1 or layout == "none":
        return 0.0
    name = "zero3" if layout == "fsdp" else layout
    if name not in costs.passes or name not in costs.update:
        raise ValueError(f"layout: {layout!r} has no measured framework cost in this cluster "
                         f"(measured: {', '.join(sorted(costs.passes))})")
    # DDP and ZeRO-1 copy into their buckets once per step (no_sync on the other micro-batches), FSDP every micro-batch.
    copies = copy_bytes(workload, layout, world) * (1 if name in ("ddp", "zero1") else gradient_accumulation_steps)
    return (costs.passes[name] * workload.units * gradient_accumulation_steps + costs.update[name] * workload.tensors
            + copies / costs.copy_bandwidth)


@dataclass(frozen=True)
class StepTime:
    """One step's predicted time by part (seconds), its throughput and utilisation.

    ``communication`` lists (collective, wire bytes, seconds) per collective;
    ``exposed`` is the communication not hidden behind compute; ``framework``
    the framework's own CPU work where the cluster measured it
    (:func:`framework_seconds`, exposed). ``step`` is
    compute + recompute + bubble + exposed + optimizer + framework; ``bubble``
    the pipeline's idle time (:func:`course_utils.pipeline.bubble_formula`). ``tokens_per_second`` counts every
    process's tokens; ``mfu`` divides the model's FLOPs per second (those the
    step needs: 6 per trained weight, 4 per frozen one, and the attention) by the
    peak, ``hfu`` those executed (recomputation included). FLOPs are one process's.
    ``every_expert_flops``: for a mixture of experts, the model's FLOPs if
    every expert ran on every token (what a count of all parameters suggests;
    the step runs only the top-k, ``model_flops``); None for a dense model.
    """

    compute: float
    recompute: float
    communication: tuple[tuple[str, float, float], ...]
    exposed: float
    optimizer: float
    step: float
    tokens_per_second: float
    mfu: float
    hfu: float
    model_flops: float
    hardware_flops: float
    every_expert_flops: float | None = None
    framework: float = 0.0
    bubble: float = 0.0

    @property
    def communication_total(self) -> float:
        return sum(seconds for _, _, seconds in self.communication)

    def parts(self) -> dict[str, float]:
        """Return {part: seconds} for compute, recompute, exposed communication and the optimizer step."""
        parts = {"compute": self.compute, "recompute": self.recompute, "communication (exposed)": self.exposed,
                 "optimizer step": self.optimizer}
        if self.bubble:
            parts["pipeline bubble"] = self.bubble
        return {**parts, "framework (exposed)": self.framework} if self.framework else parts


def _seconds(collective: Collective, world_size: int, link: Link) -> tuple[float, float]:
    wire = comm_time.wire_bytes(collective.name, collective.payload, world_size)
    return wire, collective.messages * link.latency + wire / link.bandwidth_of(collective.name)


def model_parallel_collectives(workload: Workload, tp: int, pp: int, tokens: int, activation_bytes: int, *,
                               microbatches: int = 1, sequence_parallel: bool = False) -> list[Collective]:
    """Return the collectives one process runs per micro-batch of ``tokens`` tokens for tensor and pipeline parallelism.

    Megatron-style tensor parallelism over ``tp`` processes all-reduces each
    block's activation (``tokens`` x width x ``activation_bytes``) twice in the
    forward pass (after attention's and the MLP's row-split products) and twice
    in the backward pass (the input gradients of their column-split products);
    with ``sequence_parallel`` each all-reduce is an all-gather before and a
    reduce-scatter after (the same bytes on a ring, each process keeping
    1/tp of the sequence between them). A process holds ``layers / pp`` blocks.
    A pipeline stage sends its output activation to the next stage and
    receives its gradient back, once per micro-batch ("send": point to point).
    """
    check_instance(workload, "workload", Workload, "a Workload (workload_of(model))")
    check_positive_int(tp, "tp")
    check_positive_int(pp, "pp")
    check_positive_int(tokens, "tokens")
    check_positive_int(activation_bytes, "activation_bytes")
    check_positive_int(microbatches, "microbatches")
    check_bool(sequence_parallel, "sequence_parallel")
    activation = tokens * workload.width * activation_bytes
    count = 2 * math.ceil(workload.layers / pp)  # per pass: two per block of this stage
    rows = []  # each Collective's payload is the sum over its messages, as collectives_of's are
    if tp > 1:
        if sequence_parallel:  # an all-gather hands in its 1/tp of the sequence; a reduce-scatter the whole
            for during in ("forward", "backward"):
                rows += [Collective("all_gather_single", count * activation / tp, count, during),
                         Collective("reduce_scatter_single", count * activation, count, during)]
        else:
            rows += [Collective("all_reduce", count * activation, count, "forward"),
                     Collective("all_reduce", count * activation, count, "backward")]
    if pp > 1:
        rows += [Collective("send", activation / tp, 1, "forward"), Collective("send", activation / tp, 1, "backward")]
    return rows


def _parallel_link(cluster: Cluster, span: int) -> Link:
    """The slowest hop of a group of ``span`` neighbouring processes: inside a node if it fits in one."""
    return cluster.intra if span <= cluster.processes_per_node or cluster.inter is None else cluster.inter


EXPOSURE = {
    "tp": "exposed: each all-reduce sits between two matrix products, the next needing its result",
    "pp send": "the fill's forward sends and the drain's backward sends are exposed (2 (p - 1) per step); the others "
               "overlap the next micro-batch where collectives overlap compute",
    "bubble": "exposed: (p - 1) / (m + p - 1) of the pipelined passes, each stage idle",
    "dp": "overlapped with its pass where the cluster overlaps (all but the first gather and the last bucket); "
          "the optimizer's broadcasts after it hide behind nothing",
}
"""How each communication term of :func:`predict_step` meets the compute: exposed or overlapped, and why."""


def predict_step(workload: Workload, cluster: Cluster, layout: str, batch_size: int, seq_len: int, *,
                 checkpointing: bool = False, optimizer_bytes: float | None = None,
                 gradient_accumulation_steps: int = 1, tp: int = 1, pp: int = 1, microbatches: int = 1,
                 sequence_parallel: bool = False) -> StepTime:
    """Return the :class:`StepTime` of one optimizer step of ``workload`` under ``layout`` on ``cluster``.

    Each data-parallel process runs ``gradient_accumulation_steps`` micro-batches of
    ``batch_size`` sequences of ``seq_len`` tokens. ``optimizer_bytes``: what
    one process's optimizer step reads and writes (bytes); default AdamW's,
    from the parameter dtype: read weights, gradients and two moments, write
    weights and moments, on 1/N of the trainable parameters under ZeRO/FSDP.

    ``tp``, ``pp``: tensor-parallel degree and pipeline stages (the names of
    :class:`course_utils.layouts.Layout`); ``layout`` applies over the
    data-parallel degree, the cluster's processes // (tp x pp). Each process
    computes 1/(tp x pp) of its replica's FLOPs and holds that share of the
    parameters; the batch goes through the pipeline in ``microbatches``
    micro-batches (``batch_size`` divisible by it), and the bubble
    (:func:`course_utils.pipeline.bubble_formula`, lesson 9's) stretches the passes by (m + p - 1) / m. The TP
    group is ``tp`` neighbouring processes (inside a node when tp <= cards per
    node, else across nodes); stages are neighbours too. How each term meets
    the compute is :data:`EXPOSURE`'s.
    """
    check_instance(workload, "workload", Workload, "a Workload (workload_of(model))")
    check_instance(cluster, "cluster", Cluster, "a Cluster (gpu_cluster(...) or a measured one)")
    check_choice(layout, "layout", LAYOUTS)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_bool(checkpointing, "checkpointing")
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    check_positive_int(tp, "tp")
    check_positive_int(pp, "pp")
    check_positive_int(microbatches, "microbatches")
    check_bool(sequence_parallel, "sequence_parallel")
    if cluster.world_size % (tp * pp):
        raise ValueError(f"tp x pp must divide the cluster's {cluster.world_size} processes, got tp={tp}, pp={pp}")
    if batch_size % microbatches:
        raise ValueError(f"microbatches must divide batch_size={batch_size}, got {microbatches}")
    if pp == 1 and microbatches != 1:
        raise ValueError(f"microbatches cut a batch for a pipeline: with pp=1 it must be 1, got {microbatches}")
    world = cluster.world_size // (tp * pp)  # the data-parallel degree
    if layout == "none" and world > 1:
        raise ValueError(f"layout 'none' is one process; the cluster has {world} data-parallel processes: choose one "
                         f"of {LAYOUTS[1:]}")
    split = tp * pp
    tokens = batch_size * seq_len * gradient_accumulation_steps
    per_token = speed.flops_per_token(workload.matmul_weights, workload.layers, seq_len, workload.width)
    # The model's FLOPs: what the step needs, without recomputation; a frozen weight has no weight gradient.
    # One process computes 1/(tp x pp) of its replica's: its share of each block's heads and columns, its stage's blocks.
    model_flops = tokens * (per_token - 2 * workload.frozen_matmul_weights) / split
    forward = tokens * (2 * workload.matmul_weights + 4 * workload.layers * seq_len * workload.width) / split
    recompute_flops = forward if checkpointing else 0
    device = cluster.device
    compute, recompute = model_flops / device.achievable, recompute_flops / device.achievable
    # The pipelined passes take (m + p - 1) slots of one micro-batch's: the bubble is lesson 9's share of them.
    fraction = pipeline.bubble_formula(pp, microbatches)
    bubble = (compute + recompute) * fraction / (1 - fraction)

    sharded = layout in ("zero1", "zero2", "zero3", "fsdp") and world > 1
    if optimizer_bytes is None:
        elements = workload.trainable / split / (world if sharded else 1)
        optimizer_bytes = elements * (2 * workload.stored_bytes + workload.gradient_bytes + 4 * workload.stored_bytes)
    check_non_negative_number(optimizer_bytes, "optimizer_bytes")
    optimizer = optimizer_bytes / device.memory_bandwidth

    # Accumulating, DDP and ZeRO-1 all-reduce once (no_sync on the other micro-batches); FSDP gathers and
    # reduce-scatters on every micro-batch. Each pass's compute is the window a collective can hide behind.
    forward_time = forward / device.achievable
    backward_time = compute - forward_time + recompute
    rows, exposed = [], 0.0
    shard = dataclasses.replace(workload, parameters=workload.parameters // split, trainable=workload.trainable // split,
                                tensors=math.ceil(workload.tensors / split)) if split > 1 else workload
    # The data-parallel ring joins processes tp x pp apart: across nodes when there are several.
    dp_link = _parallel_link(cluster, world * split)
    for collective in collectives_of(shard, layout, world):
        wire, seconds = _seconds(collective, world, dp_link)
        repeats = 1 if collective.name == "all_reduce" or collective.during == "after" else gradient_accumulation_steps
        wire, seconds = wire * repeats, seconds * repeats
        rows.append((collective.name, wire, seconds))
        window = {"forward": forward_time, "backward": backward_time, "after": 0.0}[collective.during]
        if cluster.overlaps and collective.during != "after":
            first = seconds / (collective.messages * repeats)  # the first gather (last bucket) has nothing to hide behind
            exposed += max(seconds - window * gradient_accumulation_steps, first)
        else:
            exposed += seconds
    activation_bytes = 4 if device.precision == "fp32" else 2
    passes = gradient_accumulation_steps * microbatches
    micro_tokens = batch_size // microbatches * seq_len
    tp_link, pp_link = _parallel_link(cluster, tp), _parallel_link(cluster, tp * pp)
    for collective in model_parallel_collectives(workload, tp, pp, micro_tokens, activation_bytes,
                                                 microbatches=microbatches, sequence_parallel=sequence_parallel):
        if collective.name == "send":
            per_message = pp_link.latency + collective.payload / pp_link.bandwidth
            wire, seconds = collective.payload * passes, per_message * passes
            rows.append((f"pp send ({collective.during})", wire, seconds))
            exposed += min(seconds, per_message * (pp - 1) * gradient_accumulation_steps) if cluster.overlaps else seconds
        else:
            wire, seconds = _seconds(collective, tp, tp_link)
            rows.append((f"tp {collective.name} ({collective.during})", wire * passes, seconds * passes))
            exposed += seconds * passes
    framework = framework_seconds(shard, cluster, layout, gradient_accumulation_steps) if world > 1 else 0.0
    step = compute + recompute + bubble + exposed + optimizer + framework
    return StepTime(compute=compute, recompute=recompute, communication=tuple(rows), exposed=exposed,
                    optimizer=optimizer, step=step, tokens_per_second=tokens * world / step,
                    mfu=model_flops / step / device.peak, hfu=(model_flops + recompute_flops) / step / device.peak,
                    model_flops=model_flops, hardware_flops=model_flops + recompute_flops,
                    every_expert_flops=(model_flops + tokens * 6 * (workload.expert_weights - workload.active_expert_weights)
                                        / split if workload.expert_weights else None), framework=framework, bubble=bubble)
