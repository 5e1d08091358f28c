"""The step-time model checked: against real multi-process steps on this CPU, and against published runs (issue 35).

**On this CPU** (:func:`measure_cpu_steps`, run in every process of a launch):
each process measures what the model needs (the lessons' tiny DistilBERT's
forward and backward alone, its AdamW step alone, gloo's latency and bandwidth
on loopback from all-reduces of 4 bytes and of 4 MiB and from an all-gather
and a reduce-scatter of one unit's size, a large copy's memory bandwidth, and
the framework's own work: a toy of the model's units and parameter tensors,
a few elements each, laid out as each layout lays it out, against the toy
alone) and times real DDP, ZeRO-1, ZeRO-2 and ZeRO-3/FSDP2 steps of the same
model, all in turns, so that a change of load falls on each alike.
:func:`slowest_process` keeps, round by round, the slower process's compute
(a synchronous step waits for it), :func:`cpu_cluster` turns the medians into
a :class:`course_utils.step_time.Cluster` (nothing overlaps: gloo's threads
need the cores the step computes on; the framework's work is exposed,
:func:`framework_costs`) and :func:`compare_with_cpu_steps` sets each
layout's prediction beside its measured median and range. Nothing is fitted
to the timed steps: the toy, the copy and the collectives are measured apart.

**Against publications** (:data:`PUBLISHED_THROUGHPUTS`): runs whose report
names the model, the cards, the layout and tokens/s; :func:`compare_with_published`
predicts each from the shapes and the sourced card figures alone (nothing is
fitted to these numbers) and gives the error.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch

from course_utils import speed, step_time
from course_utils.validation import check_choice, check_in_launch, check_instance, check_positive_int

__all__ = [
    "CPU_LAYOUTS", "PUBLISHED_THROUGHPUTS", "PublishedThroughput", "measure_cpu_steps", "cpu_cluster",
    "framework_costs", "toy_workload",
    "compare_with_cpu_steps", "compare_with_published", "slowest_process", "describe_published", "LLAMA_SHAPES",
]

CPU_LAYOUTS = ("ddp", "zero1", "zero2", "zero3")
"""The layouts timed for real on CPU processes (``sharding.wrap_for_strategy``: DDP, ZeRO-1's
``ZeroRedundancyOptimizer``, FSDP2 on every block without and with resharding; "fsdp" is "zero3")."""

_UNIT_COLLECTIVES = ("all_gather_single", "reduce_scatter_single")
_TOY_ELEMENTS = 8  # per toy parameter and process: no arithmetic, no bandwidth to speak of

_SMALL, _LARGE = 1, 1024 * 1024  # float32 elements: 4 bytes (latency), 4 MiB (bandwidth)


def _in_turns(functions: dict, repeats: int) -> dict[str, list[float]]:
    """Time each of ``functions`` once per round, ``repeats`` rounds after one untimed, every call after a barrier.

    In turns, a change in the machine's load falls on every measurement alike
    (``speed.time_interleaved``'s reason); the barrier starts both processes'
    calls together, so that no call's time includes waiting for the other process.
    """
    import torch.distributed as dist

    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for round_ in range(1 + repeats):
        for name, function in functions.items():
            dist.barrier()
            start = time.perf_counter()
            function()
            if round_:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def _passes(batch: dict):
    """Forward and backward of a fresh copy of the course model on ``batch``, in this process alone (no collective)."""
    from course_utils import sharding

    model = sharding.fresh_course_model()
    return lambda: model(**batch).loss.backward()


def _update(batch: dict):
    """AdamW's step and zero_grad on a fresh copy of the course model, alone, with the same gradients each time."""
    from course_utils import sharding

    model = sharding.fresh_course_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=sharding.LEARNING_RATE)
    model(**batch).loss.backward()
    gradients = [p.grad.clone() for p in model.parameters()]

    def update():
        optimizer.step()
        optimizer.zero_grad()
        for parameter, gradient in zip(model.parameters(), gradients):
            parameter.grad = gradient

    return update


def _copy():
    """A 64 MiB float32 copy: read once, written once (its rate is the memory bandwidth a stream reaches)."""
    source = torch.ones(16 * 1024 * 1024)
    target = torch.empty_like(source)
    return lambda: target.copy_(source)


def _all_reduce(elements: int):
    import torch.distributed as dist

    tensor = torch.ones(elements)
    return lambda: dist.all_reduce(tensor)


class _ToyUnit(torch.nn.Module):
    """``tensors`` parameters of a few elements each, every one used once: a unit's structure without its arithmetic."""

    def __init__(self, tensors: int, size: int):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(size)) for _ in range(tensors))

    def forward(self, x):
        for weight in self.weights:
            x = x * weight
        return x


class _Toy(torch.nn.Module):
    """The course model's structure for FSDP2 and DDP: as many blocks and parameter tensors per block and root."""

    def __init__(self, per_block: int, blocks: int, root: int, size: int):
        super().__init__()
        self.rest = _ToyUnit(root, size)
        self.layers = torch.nn.ModuleList(_ToyUnit(per_block, size) for _ in range(blocks))
        self.size = size

    def forward(self):
        x = self.rest(torch.ones(self.size))
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def _toy_shape() -> tuple[int, int, int]:
    """(tensors per block, blocks, tensors of the root) of the course model, as FSDP2 units it."""
    from course_utils import sharding

    model = sharding.course_model()
    blocks = sharding.sharded_blocks(model)
    per_block = sum(1 for _ in blocks[0].parameters())
    return per_block, len(blocks), sum(1 for _ in model.parameters()) - per_block * len(blocks)


def _toy_calls(layout_name: str, world_size: int) -> tuple:
    """(passes, update) of the toy laid out as ``layout_name`` ("none": one process's plain toy), each a call."""
    from course_utils import layouts

    per_block, blocks, root = _toy_shape()
    toy = _Toy(per_block, blocks, root, _TOY_ELEMENTS * world_size)
    layout = layouts.Layout(layout_name, world_size if layout_name != "none" else 1)
    model = layouts.apply_layout(toy, layout, list(toy.layers) if layout.shards_with_fsdp else None)
    optimizer = layouts.layout_optimizer(layout, model.parameters(), torch.optim.AdamW, lr=1e-3)
    model().backward()

    def update():
        optimizer.step()  # the gradients stay: each step updates with the same ones

    return (lambda: model().backward()), update


def toy_workload(world_size: int) -> step_time.Workload:
    """The :class:`~course_utils.step_time.Workload` of the toy the framework's costs are measured on."""
    check_positive_int(world_size, "world_size")
    per_block, blocks, root = _toy_shape()
    tensors = per_block * blocks + root
    elements = tensors * _TOY_ELEMENTS * world_size
    return step_time.Workload(parameters=elements, trainable=elements, matmul_weights=0, frozen_matmul_weights=0,
                              layers=blocks, width=1, units=blocks + 1, tensors=tensors, stored_bytes=4,
                              parameter_bytes=4, gradient_bytes=4)


def _unit_collective(name: str, world_size: int):
    """One unit's all-gather (its shard in) or reduce-scatter (its gradients in), at the course model's mean unit size."""
    import torch.distributed as dist

    from course_utils import sharding

    shard = sum(p.numel() for p in sharding.course_model().parameters()) // (toy_workload(world_size).units * world_size)
    whole, part = torch.ones(shard * world_size), torch.ones(shard)
    if name == "all_gather_single":
        return lambda: dist.all_gather_single(whole, part)
    return lambda: dist.reduce_scatter_single(part, whole)


def _unit_payload(name: str, world_size: int) -> int:
    """The bytes one process hands in to :func:`_unit_collective`'s ``name`` (its shard, or the whole gradients)."""
    from course_utils import sharding

    shard = sum(p.numel() for p in sharding.course_model().parameters()) // (toy_workload(world_size).units * world_size)
    return 4 * shard * (1 if name == "all_gather_single" else world_size)


def _strategy_step(strategy: str, batches: tuple, rank: int, world_size: int):
    """One step under ``strategy`` (forward, backward, optimizer step, zero_grad), on the next batch each call."""
    from course_utils import sharding

    model, optimizer, _ = sharding.wrap_for_strategy(sharding.fresh_course_model(), strategy, None)
    shares = [sharding.share_of_batch(batch, rank, world_size) for batch in batches]
    calls = iter(range(10**9))

    def step():
        model(**shares[next(calls) % len(shares)]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def measure_cpu_steps(batch_size: int = 32, steps: int = 7) -> dict:
    """In a launched process: measure the model's inputs on this CPU and time DDP and ZeRO-3 steps, in turns; return them.

    ``batch_size``: examples per step over all processes (each gets an equal
    share); ``steps``: timed rounds (after one untimed), each timing every
    measurement once, in turns, both processes starting each call together.
    Returns ``compute_seconds`` (one process's forward and backward alone),
    ``optimizer_seconds`` (its AdamW step alone),
    ``latency`` and ``large_seconds``/``large_bytes`` (gloo's all-reduce),
    ``memory_bandwidth`` (bytes/s), ``matmul_flops`` (a 512 x 512 fp32 matrix
    product's FLOP/s, :func:`course_utils.speed.measure_matmul_peak`), ``seq_len``, ``world_size`` and
    ``seconds`` per layout of :data:`CPU_LAYOUTS`, each a list of step times.
    """
    import torch.distributed as dist

    from course_utils import sharding

    check_in_launch("measure_cpu_steps")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(steps, "steps")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if batch_size % world_size:
        raise ValueError(f"batch_size must be a multiple of the {world_size} processes, got {batch_size}")
    batches = sharding.course_batches(steps, batch_size)
    with sharding.gloo_group():
        rank = dist.get_rank()
        share = sharding.share_of_batch(batches[0], rank, world_size)
        functions = {"compute": _passes(share), "optimizer": _update(share), "copy": _copy(),
                     "small": _all_reduce(_SMALL), "large": _all_reduce(_LARGE),
                     **{name: _unit_collective(name, world_size) for name in _UNIT_COLLECTIVES},
                     **{layout: _strategy_step(layout, batches, rank, world_size) for layout in CPU_LAYOUTS}}
        for name in ("none", *CPU_LAYOUTS):  # the framework's own work: the toy laid out against the toy alone
            functions[f"toy {name} passes"], functions[f"toy {name} update"] = _toy_calls(name, world_size)
        seconds = _in_turns(functions, steps)
        matmul_flops, _ = speed.measure_matmul_peak(512, repeats=steps)  # lesson 8's achievable peak, for comparison
    measured = {"compute_seconds": seconds["compute"], "optimizer_seconds": seconds["optimizer"],
                "memory_bandwidth": 2 * 16 * 1024 * 1024 * 4 / min(seconds["copy"]),
                "latency": statistics.median(seconds["small"]), "large_seconds": statistics.median(seconds["large"]),
                "large_bytes": _LARGE * 4,
                "unit_collectives": {name: (statistics.median(seconds[name]), _unit_payload(name, world_size))
                                     for name in _UNIT_COLLECTIVES},
                "seq_len": int(share["input_ids"].shape[1]), "world_size": world_size,
                "batch_per_process": batch_size // world_size, "matmul_flops": matmul_flops,
                "seconds": {layout: seconds[layout] for layout in CPU_LAYOUTS},
                "toy": {name: seconds[name] for name in seconds if name.startswith("toy ")}}
    return measured


def slowest_process(measured: list[dict]) -> dict:
    """Return the measurements of a launch as one process's, each round's compute and optimizer times the slowest's.

    ``measured``: :func:`measure_cpu_steps`' return values, one per process. A
    synchronous step waits for its slowest process at every collective, so the
    step a model predicts is set, round by round, by the larger of the
    processes' compute times (on a loaded machine they differ). The rest (the
    link, the timed steps) is process 0's: a collective takes as long for each.
    """
    if not isinstance(measured, list) or not measured:
        raise ValueError(f"measured must be the list measure_cpu_steps' launch returns (one dict per process), "
                         f"got {measured!r:.80}")
    for one in measured:
        _check_measured(one)
    slowest = dict(measured[0])
    for key in ("compute_seconds", "optimizer_seconds"):
        slowest[key] = [max(rounds) for rounds in zip(*(one[key] for one in measured))]
    return slowest


def cpu_cluster(measured: dict) -> step_time.Cluster:
    """Return the :class:`~course_utils.step_time.Cluster` of this CPU's processes from :func:`measure_cpu_steps`'s measurements.

    The device's peak is the theoretical fp32 peak of one core
    (:func:`course_utils.speed.cpu_peak`: each process computes with one thread);
    its achievable fraction is what the model's own forward and backward reached
    of it; its memory rate is what the model's own AdamW step reached (the
    bytes it reads and writes over its median time: on a small model the
    per-tensor work, not the memory, sets it; the 64 MiB copy's rate is kept in
    ``memory_bandwidth`` for comparison); the link is gloo's all-reduce on loopback (bandwidth from the 4 MiB
    one after its latency, in bytes on the wire: :func:`course_utils.comm_time.wire_bytes`).
    """
    from course_utils import comm_time, sharding

    _check_measured(measured)
    peak = speed.cpu_peak(1)
    flops = _flops_per_pass(sharding.course_model(), measured)
    rate = flops / statistics.median(measured["compute_seconds"])
    if peak is None or "fp32" not in peak.flops:
        theoretical, peak_source = rate, "this CPU's theoretical peak is unknown to cpu_peak: the measured rate itself"
    else:
        theoretical, peak_source = peak.flops["fp32"], "; ".join(peak.read + peak.assumed)
    world = measured["world_size"]
    wire = comm_time.wire_bytes("all_reduce", measured["large_bytes"], world)
    bandwidth = wire / max(measured["large_seconds"] - measured["latency"], 1e-9)
    workload = step_time.workload_of(sharding.course_model())
    optimizer_bytes = workload.trainable * (6 * workload.stored_bytes + workload.gradient_bytes)  # as predict_step counts
    optimizer_rate = optimizer_bytes / statistics.median(measured["optimizer_seconds"])
    device = step_time.Device("this CPU, one core per process", "fp32", max(theoretical, rate), peak_source,
                              rate / max(theoretical, rate),
                              "measured: the course model's forward and backward, each process on its own share",
                              optimizer_rate, "measured: the course model's AdamW step, bytes read and written / time")
    by_collective = {name: comm_time.wire_bytes(name, payload, world) / max(seconds - measured["latency"], 1e-9)
                     for name, (seconds, payload) in measured["unit_collectives"].items()}
    link = step_time.Link("gloo on loopback", bandwidth, measured["latency"],
                          "measured: all-reduces of 4 bytes (latency) and 4 MiB (bandwidth); an all-gather and a "
                          "reduce-scatter of one unit's size (their own bandwidths); medians", by_collective)
    return step_time.Cluster(device, world, 1, link, None, overlaps=False,
                             framework=framework_costs(measured, link))


def framework_costs(measured: dict, link: step_time.Link) -> step_time.FrameworkCosts:
    """Return the framework's own CPU work per unit and per tensor, from the toy's timings in ``measured``.

    For each layout: the laid-out toy's median passes (and optimizer step)
    less the toy's alone on one process, less the latency of the collectives
    the toy runs (``link`` counts those), per unit (per tensor); never below 0.
    """
    _check_measured(measured)
    check_instance(link, "link", step_time.Link, "a step_time.Link")
    world = measured["world_size"]
    toy, times = toy_workload(world), measured["toy"]
    median = lambda name: statistics.median(times[f"toy {name}"])  # noqa: E731
    passes, update = {}, {}
    for layout in CPU_LAYOUTS:
        latency = {"after": 0.0, "passes": 0.0}
        for collective in step_time.collectives_of(toy, layout, world):
            latency["after" if collective.during == "after" else "passes"] += collective.messages * link.latency
        passes[layout] = max(0.0, median(f"{layout} passes") - median("none passes") - latency["passes"]) / toy.units
        update[layout] = max(0.0, median(f"{layout} update") - median("none update") - latency["after"]) / toy.tensors
    return step_time.FrameworkCosts(passes, update, measured["memory_bandwidth"],
                                    "measured: a toy of the model's units and tensors laid out against it alone; "
                                    "a 64 MiB copy")


def _flops_per_pass(model: torch.nn.Module, measured: dict) -> float:
    tokens = measured["batch_per_process"] * measured["seq_len"]
    return tokens * speed.model_flops_per_token(model, measured["seq_len"])


def _check_measured(measured: object) -> None:
    needed = ("compute_seconds", "optimizer_seconds", "memory_bandwidth", "latency", "large_seconds", "large_bytes", "seq_len",
              "world_size", "batch_per_process", "seconds", "toy", "unit_collectives")
    if not isinstance(measured, dict) or any(key not in measured for key in needed):
        raise ValueError(f"measured must be what measure_cpu_steps returns (a dict with {', '.join(needed)}), "
                         f"got {measured!r:.80}")


def compare_with_cpu_steps(measured: dict) -> list[dict]:
    """Return, per layout of :data:`CPU_LAYOUTS`, the predicted step beside the measured one (seconds) and the error.

    Each row: ``layout``, ``predicted`` (a :class:`~course_utils.step_time.StepTime`),
    ``median``, ``low``, ``high`` (the measured steps' median and range) and
    ``error`` (predicted / median - 1).
    """
    from course_utils import sharding

    cluster = cpu_cluster(measured)
    workload = step_time.workload_of(sharding.course_model())
    rows = []
    for layout, seconds in measured["seconds"].items():
        check_choice(layout, "measured['seconds'] key", CPU_LAYOUTS)
        predicted = step_time.predict_step(workload, cluster, layout, measured["batch_per_process"], measured["seq_len"])
        median = statistics.median(seconds)
        rows.append({"layout": layout, "predicted": predicted, "median": median, "low": min(seconds),
                     "high": max(seconds), "error": predicted.step / median - 1})
    return rows


# --------------------------------------------------------------------------- published runs

LLAMA_SHAPES: dict[str, dict] = {
    # From the models' config.json on the Hugging Face Hub (meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B): a
    # 128,256-token vocabulary, grouped-query attention with 8 key/value heads, untied output layer, 8,192 positions.
    "Llama 3 8B": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192},
    "Llama 3 70B": {"vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 8192},
    # meta-llama/Llama-2-13b-hf and Llama-2-70b-hf: 4,096 positions.
    "Llama 2 13B": {"vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                    "num_attention_heads": 40, "num_key_value_heads": 40, "max_position_embeddings": 4096},
    "Llama 2 70B": {"vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 4096},
}


@dataclass(frozen=True)
class PublishedThroughput:
    """One published training run: model, cards, layout, per-GPU batch and length, and the tokens/s per GPU reported.

    ``checkpointing`` is "none", "selective" or "full" (the time model
    recomputes the whole forward for "full" only: selective recomputation
    redoes a part it does not count); ``network``: a name of
    :data:`course_utils.hardware.NETWORKS`, or None on one node.
    """

    model: str
    card: str
    cards_per_node: int
    nodes: int
    network: str | None
    layout: str
    batch_size: int
    seq_len: int
    checkpointing: str
    tokens_per_second_per_gpu: float
    mfu: float | None
    source: str


_TITAN_A100 = ("torchtitan docs/performance.md (commit 0413364), FSDP2 on 64 A100 80GB, bf16 parameters and fp32 "
               "gradient reduction; the network is not named: taken as the DGX A100's HDR InfiniBand")
_TITAN_H100 = ("torchtitan docs/performance.md, Table 1 (FSDP, Llama 3.1 8B, 8 H100, selective activation "
               "checkpointing), on Grand Teton hosts: H100 96 GB HBM2e at 2.4 TB/s and a 500 W power limit, not "
               "the H100 SXM of the data sheet")

PUBLISHED_THROUGHPUTS: tuple[PublishedThroughput, ...] = (
    PublishedThroughput("Llama 3 8B", "A100 80GB", 8, 8, "InfiniBand HDR 200 Gb/s per GPU", "fsdp", 1, 8192,
                        "selective", 2973, 0.582, _TITAN_A100 + "; selective op checkpointing"),
    PublishedThroughput("Llama 3 70B", "A100 80GB", 8, 8, "InfiniBand HDR 200 Gb/s per GPU", "fsdp", 1, 8192,
                        "full", 331, 0.517, _TITAN_A100 + "; full checkpointing"),
    PublishedThroughput("Llama 2 13B", "A100 80GB", 8, 8, "InfiniBand HDR 200 Gb/s per GPU", "fsdp", 2, 4096,
                        "none", 2162, 0.611, _TITAN_A100 + "; no checkpointing"),
    PublishedThroughput("Llama 2 70B", "A100 80GB", 8, 8, "InfiniBand HDR 200 Gb/s per GPU", "fsdp", 2, 4096,
                        "full", 353, 0.505, _TITAN_A100 + "; full checkpointing"),
    PublishedThroughput("Llama 3 8B", "H100 SXM", 8, 1, None, "fsdp", 2, 8192, "selective", 5762, None, _TITAN_H100),
)
"""Published throughputs in layouts the planner has, each with its source. Llama 3's own 405B run (TP, PP, CP and FSDP:
``utilisation.PUBLISHED_RUNS``) and Megatron-LM's are left out: their layouts are not planned here."""


def _meta_model(shape: dict) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(LlamaConfig(**shape), dtype=torch.float32)


def compare_with_published(runs: tuple[PublishedThroughput, ...] = PUBLISHED_THROUGHPUTS) -> list[dict]:
    """Return each run's prediction beside its published tokens/s per GPU: ``run``, ``predicted`` (a StepTime), ``error``.

    The model is built on the meta device from :data:`LLAMA_SHAPES`; FSDP
    gathers bf16 parameters and reduces fp32 gradients (torchtitan's policy),
    the optimizer keeps fp32 weights and AdamW moments; compute at the card's
    bf16 peak times its published matrix-product fraction. ``error`` is
    predicted / published - 1.
    """
    if not isinstance(runs, tuple) or not all(isinstance(run, PublishedThroughput) for run in runs):
        raise TypeError("runs must be a tuple of PublishedThroughput")
    rows = []
    for run in runs:
        check_choice(run.model, "run.model", tuple(LLAMA_SHAPES))
        workload = step_time.workload_of(_meta_model(LLAMA_SHAPES[run.model]), gather_bytes=2, reduce_bytes=4)
        cluster = step_time.gpu_cluster(run.card, run.cards_per_node, run.nodes, "bf16", run.network)
        predicted = step_time.predict_step(workload, cluster, run.layout, run.batch_size, run.seq_len,
                                           checkpointing=run.checkpointing == "full")
        per_gpu = predicted.tokens_per_second / cluster.world_size
        rows.append({"run": run, "predicted": predicted, "tokens_per_second_per_gpu": per_gpu,
                     "error": per_gpu / run.tokens_per_second_per_gpu - 1})
    return rows


def describe_published(rows: list[dict]) -> str:
    """Return :func:`compare_with_published`'s rows as a Markdown table: published and predicted tokens/s per GPU, MFU, error."""
    check_instance(rows, "rows", list, "compare_with_published()'s list of rows")
    lines = ["| model | cards | layout | batch x length | checkpointing | published tok/s/GPU | predicted | error | "
             "published MFU | predicted MFU |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        run, predicted = row["run"], row["predicted"]
        published_mfu = f"{run.mfu:.1%}" if run.mfu is not None else "not given"
        lines.append(f"| {run.model} | {run.nodes * run.cards_per_node} x {run.card} | {run.layout} | "
                     f"{run.batch_size} x {run.seq_len} | {run.checkpointing} | {run.tokens_per_second_per_gpu:,.0f} | "
                     f"{row['tokens_per_second_per_gpu']:,.0f} | {row['error']:+.0%} | {published_mfu} | "
                     f"{predicted.mfu:.1%} |")
    return "\n".join(lines)
