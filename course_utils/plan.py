"""Plan a training run: memory per process by part and predicted step time of each layout (issue 35; ``python -m course_utils.plan``).

The command a learner keeps after the course. It is the lessons' own code
path: the memory of each layout is :func:`course_utils.memory.estimate_training_memory`
(one process's step followed on fake tensors), its time
:func:`course_utils.step_time.predict_step` on the card's sourced figures
(:mod:`course_utils.hardware`). :func:`plan_layouts` is what the command
prints; ``--json`` prints the same rows for scripts.

Example (runs offline in seconds)::

    python -m course_utils.plan "course DistilBERT" --card "H100 SXM" --cards-per-node 2 --seq-len 64
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path

import torch

from course_utils import hardware, memory, sharding_plans, step_time
from course_utils.layouts import Layout
from course_utils.step_time_checks import LLAMA_SHAPES
from course_utils.units import format_bytes
from course_utils.validation import check_bool, check_choice, check_positive_int, check_positive_number

__all__ = ["EXAMPLE", "SHIPPED_CONFIGS", "SHIPPED_MODELS", "PRECISIONS", "SEARCHED", "load_model", "layout_fields", "parse_layout",
           "searched_layouts", "plan_layouts", "days_for", "format_table", "main"]

COURSE_DISTILBERT = Path(__file__).resolve().parents[1] / "data" / "tiny-distilbert"
MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"
SHIPPED_CONFIGS: dict[str, Path] = {
    name: MODEL_CONFIGS / folder / "config.json" for name, folder in (
        ("Llama 3.1 8B", "llama-3.1-8b"), ("Llama 3.1 70B", "llama-3.1-70b"), ("Qwen3 8B", "qwen3-8b"),
        ("Mistral 7B v0.3", "mistral-7b-v0.3"), ("Gemma 3 12B (text)", "gemma-3-12b-text"),
        ("Mixtral 8x7B", "mixtral-8x7b-v0.1"), ("Qwen3 30B-A3B", "qwen3-30b-a3b"))}
"""The open models' Hub configs the course ships (``data/model_configs``, its README names each source): name -> config.json."""
SHIPPED_MODELS: tuple[str, ...] = (*SHIPPED_CONFIGS, *sharding_plans.MODEL_SHAPES, *LLAMA_SHAPES, "course DistilBERT")
"""Model names the command takes instead of a config.json: the shipped Hub configs, lesson 7's shapes, the published
runs' Llama shapes, and the lessons' tiny DistilBERT (``data/tiny-distilbert``)."""

PRECISIONS: dict[str, tuple[torch.dtype, str, str]] = {
    "fp32": (torch.float32, "no", "fp32"),
    "bf16-autocast": (torch.float32, "bf16", "bf16"),
    "bf16": (torch.bfloat16, "no", "bf16"),
}
"""precision -> (the weights' dtype, the planner's ``mixed_precision``, the card's peak used): fp32; fp32 weights with
the forward under bf16 autocast (Accelerate's ``mixed_precision="bf16"``); everything in bf16."""

EXAMPLE = 'python -m course_utils.plan "course DistilBERT" --card "H100 SXM" --cards-per-node 2 --seq-len 64'
"""The example ``--help`` shows (a test runs it)."""

SEARCHED = ("ddp", "zero1", "zero2", "zero3")
"""The data-parallel layouts ``--layout search`` plans on several processes ("fsdp" is "zero3" by another name);
:func:`searched_layouts` adds the tensor- and pipeline-parallel ones."""


def _config(model: str):
    """The transformers config of ``model``: a shipped name, a config.json, or a folder holding one."""
    from transformers import AutoConfig, DistilBertConfig, LlamaConfig

    if model in sharding_plans.MODEL_SHAPES:
        return LlamaConfig(**sharding_plans.MODEL_SHAPES[model])
    if model in LLAMA_SHAPES:
        return LlamaConfig(**LLAMA_SHAPES[model])
    if model == "course DistilBERT":
        return DistilBertConfig.from_pretrained(COURSE_DISTILBERT)
    path = SHIPPED_CONFIGS.get(model, Path(model))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"model must be a shipped name ({', '.join(SHIPPED_MODELS)}) or a config.json "
                         f"(or a folder holding one), got {model!r}")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"model: {path} is not a transformers config.json ({str(error).splitlines()[0]})") from None


class _AutoLike:
    """A model class (or an Auto class) behind an Auto class's ``from_config``, as ``memory.qlora_model`` builds through."""

    def __init__(self, head):
        self.head = head

    def from_config(self, config, **options):
        build = getattr(self.head, "from_config", None) or self.head._from_config
        return build(config, **options)


def load_model(model: str, precision: str = "bf16", checkpointing: bool = False, lora_rank: int | None = None,
               qlora: bool = False) -> torch.nn.Module:
    """Return ``model`` (a name of :data:`SHIPPED_MODELS` or a config.json path) built on the meta device: no memory.

    Its head is the config's first ``architectures`` entry (a causal LM when it
    names none); ``precision`` a key of :data:`PRECISIONS`; ``checkpointing``:
    activation checkpointing on every block; ``lora_rank``: LoRA adapters of
    that rank on every linear layer of the blocks (the base frozen); ``qlora``:
    the base in 4-bit NF4 under them (:func:`course_utils.memory.qlora_model`, rank 16 by default).
    """
    import transformers

    check_choice(precision, "precision", tuple(PRECISIONS))
    check_bool(checkpointing, "checkpointing")
    check_bool(qlora, "qlora")
    if lora_rank is not None:
        check_positive_int(lora_rank, "lora_rank")
    if lora_rank is not None or qlora:
        # peft imports bitsandbytes, whose import logs a harmless CPU warning: import it quietly first.
        from course_utils.optimizers import import_bitsandbytes_optim

        import_bitsandbytes_optim()
    config = _config(model)
    names = getattr(config, "architectures", None) or []
    head = getattr(transformers, names[0], None) if names else None
    head = _AutoLike(head or transformers.AutoModelForCausalLM)
    if qlora:
        from peft import LoraConfig

        lora = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear") if lora_rank else None
        return memory.qlora_model(config, head, lora=lora, checkpointing=checkpointing)
    dtype = PRECISIONS[precision][0]
    with torch.device("meta"):
        built = head.from_config(config, dtype=dtype)
    if checkpointing:
        built.activation_checkpointing_enable()
    if lora_rank is not None:
        from peft import LoraConfig, get_peft_model

        with warnings.catch_warnings():
            # peft asks transformers 5 for a property it renamed (is_activation_checkpointing): nothing to act on.
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            built = get_peft_model(built, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear"))
    return built


_PARALLEL = re.compile(r"^(?P<strategy>[a-z0-9]+)(?:\+tp(?P<tp>\d+)(?P<sp>sp)?)?(?:\+pp(?P<pp>\d+)(?:x(?P<m>\d+))?)?$")


def layout_fields(layout: str) -> dict:
    """Return {strategy, tp, pp, microbatches, sequence_parallel} of a layout string (:func:`parse_layout`'s syntax),
    checked as a string, not yet against a number of processes."""
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a string such as 'zero3' or 'zero3+tp8', got {type(layout).__name__}")
    match = _PARALLEL.match(layout)
    if match is None or match["strategy"] not in step_time.LAYOUTS:
        raise ValueError(f"layout must be a strategy ({', '.join(step_time.LAYOUTS)}) optionally followed by +tpN "
                         f"(+tpNsp) and +ppP or +ppPxM, e.g. 'zero3+tp8' or 'none+pp4x16'; got {layout!r}")
    tp, pp = int(match["tp"] or 1), int(match["pp"] or 1)
    microbatches = int(match["m"] or pp)
    if tp < 1 or pp < 1 or microbatches < 1:
        raise ValueError(f"layout: degrees must be positive integers, got {layout!r}")
    return {"strategy": match["strategy"], "tp": tp, "pp": pp, "microbatches": microbatches,
            "sequence_parallel": bool(match["sp"])}


def parse_layout(layout: str, world_size: int) -> Layout:
    """Return the :class:`course_utils.layouts.Layout` a layout string names on ``world_size`` processes.

    A layout string is a strategy of :data:`course_utils.step_time.LAYOUTS`
    over the data-parallel processes, then optionally ``+tpN`` (tensor
    parallelism of degree N, ``+tpNsp`` with sequence parallelism) and
    ``+ppP`` or ``+ppPxM`` (P pipeline stages, M micro-batches; M defaults to
    P): "zero3", "zero3+tp8", "none+pp4x16". "fsdp" is "zero3"; "ddp" on one
    process is one process (``Layout.of``). The layout's own checks refuse what
    does not divide, named after ``layout``.
    """
    fields = layout_fields(layout)
    check_positive_int(world_size, "world_size")
    strategy = "zero3" if fields["strategy"] == "fsdp" else fields["strategy"]
    try:
        if fields["tp"] * fields["pp"] == 1:
            return Layout.of(fields["strategy"], world_size)
        return Layout(strategy, world_size, tp=fields["tp"], sequence_parallel=fields["sequence_parallel"],
                      pp=fields["pp"], microbatches=fields["microbatches"])
    except ValueError as error:
        raise ValueError(f"layout {layout!r} on {world_size} processes: {error}") from None


def searched_layouts(world_size: int, cards_per_node: int, batch_size: int = 1) -> tuple[str, ...]:
    """Return the layout strings ``--layout search`` plans on ``world_size`` processes, ``cards_per_node`` a node.

    One process: "none". Several: the data-parallel ones (:data:`SEARCHED`);
    each tensor-parallel degree of 2, 4, 8... within a node (a TP group's
    all-reduces belong on the node's link, lesson 9) dividing the processes,
    under "zero2" and "zero3" over the data-parallel rest ("none" when there
    is none; DDP over split layers is not planned); and one pipeline of
    ``world_size`` stages ("none", as planned: dp = 1), its ``batch_size``
    sequences in one micro-batch each.
    """
    check_positive_int(world_size, "world_size")
    check_positive_int(cards_per_node, "cards_per_node")
    check_positive_int(batch_size, "batch_size")
    if world_size == 1:
        return ("none",)
    tensor_parallel = []
    tp = 2
    while tp <= min(cards_per_node, world_size):
        if world_size % tp == 0:
            tensor_parallel += [f"none+tp{tp}"] if tp == world_size else [f"zero2+tp{tp}", f"zero3+tp{tp}"]
        tp *= 2
    return (*SEARCHED, *tensor_parallel, f"none+pp{world_size}x{batch_size}")


def plan_layouts(model: str, *, card: str, cards_per_node: int = 1, nodes: int = 1, network: str | None = None,
                 optimizer: str = "adamw", precision: str = "bf16", checkpointing: bool = False,
                 lora_rank: int | None = None, qlora: bool = False, batch_size: int = 1, seq_len: int = 512,
                 gradient_accumulation_steps: int = 1, layout: str = "search", progress: bool = False) -> list[dict]:
    """Return one row per layout: its memory per process by part (bytes) and its predicted step (seconds).

    ``model``: a name of :data:`SHIPPED_MODELS` or a config.json; ``card``: a
    name of :data:`course_utils.hardware.CARDS`, ``cards_per_node`` x ``nodes``
    of them, ``network`` between nodes (:data:`course_utils.hardware.NETWORKS`);
    ``layout``: a layout string (:func:`parse_layout`) or "search" (every
    layout of :func:`searched_layouts`). Each row: ``layout``, ``world_size``,
    ``weights``, ``gradients``, ``optimizer_state``, ``activations``, ``peak``
    (bytes, from :func:`course_utils.memory.estimate_training_memory` with the
    row's :class:`~course_utils.layouts.Layout`: process 0's, or under a
    pipeline the largest stage's, every stage planned), ``stage`` (that stage,
    or None), ``fits`` (the peak within the card's memory), ``not_planned``
    (None, or the planner's reason for refusing the layout: its memory parts,
    peak and fits are then None), ``time`` (the
    :class:`course_utils.step_time.StepTime`), the most tokens/s first among those
    that fit, then those not planned, then those that do not fit.
    ``progress``: a progress bar (tqdm) on stderr, one step per process planned, once planning takes over a second.
    """
    check_choice(card, "card", tuple(hardware.CARDS))
    check_positive_int(cards_per_node, "cards_per_node")
    check_positive_int(nodes, "nodes")
    check_choice(optimizer, "optimizer", tuple(memory.SUPPORTED_OPTIMIZERS))
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    if layout != "search":
        layout_fields(layout)
    check_bool(progress, "progress")
    built = load_model(model, precision, checkpointing, lora_rank, qlora)
    cluster = step_time.gpu_cluster(card, cards_per_node, nodes, PRECISIONS[precision][2], network)
    names = searched_layouts(cluster.world_size, cards_per_node, batch_size) if layout == "search" else (layout,)
    layouts = {name: parse_layout(name, cluster.world_size) for name in names}
    workload = step_time.workload_of(built)
    capacity = hardware.card(card).memory.value
    from tqdm.auto import tqdm

    rows = []
    with tqdm(total=sum(len(_planned_ranks(laid)) for laid in layouts.values()), desc="planning layouts", delay=1,
              disable=not progress, file=sys.stderr) as bar:
        for name, laid in layouts.items():
            plans, refused = [], None
            for rank in _planned_ranks(laid):
                try:
                    plans.append(memory.estimate_training_memory(
                        built, optimizer, batch_size, seq_len, mixed_precision=PRECISIONS[precision][1],
                        gradient_accumulation_steps=gradient_accumulation_steps, layout=laid, rank=rank))
                except memory.PlannerRefused as error:  # the planner's own reason, shown in the row
                    refused = _reason(error)
                    bar.update(len(_planned_ranks(laid)) - rank)
                    break
                bar.update(1)
            rows.append(_row(name, laid, None if refused else plans, refused, workload, cluster, capacity,
                             batch_size, seq_len, checkpointing, gradient_accumulation_steps))
    # Those that fit, the most tokens/s first (the layouts' steps hold different numbers of tokens: a tensor-parallel
    # group trains one batch); then those whose memory the planner refused; then those that do not fit.
    return sorted(rows, key=lambda row: ({True: 0, None: 1, False: 2}[row["fits"]], -row["time"].tokens_per_second))


def _reason(error: Exception) -> str:
    """The planner's refusal in one line, with the first line of the error it names as its cause."""
    reason = " ".join(str(error).split())
    cause = error.__cause__
    if cause is not None and "cause" in reason and str(cause).strip():
        reason += f" [{type(cause).__name__}: {str(cause).strip().splitlines()[0]}]"
    return reason


def _planned_ranks(layout: Layout) -> range:
    """The processes whose memory a row plans: every stage of a pipeline (they differ); process 0 otherwise (the
    tensor-parallel shards are equal, and FSDP pads the last processes, so process 0 holds the most)."""
    return range(layout.pp) if layout.pp > 1 else range(1)


def _row(name: str, layout: Layout, plans: list | None, refused: str | None, workload, cluster, capacity: int,
         batch_size: int, seq_len: int, checkpointing: bool, gradient_accumulation_steps: int) -> dict:
    """A row: the largest planned process's memory by part (None where refused) and the layout's predicted step."""
    largest = None if plans is None else max(range(len(plans)), key=lambda stage: plans[stage].peak)
    planned = None if largest is None else plans[largest]
    time = step_time.predict_step(
        workload, cluster, layout.strategy, batch_size, seq_len, checkpointing=checkpointing,
        optimizer_bytes=None if planned is None else _optimizer_bytes(planned, workload, layout.strategy, layout.dp),
        gradient_accumulation_steps=gradient_accumulation_steps, tp=layout.tp, pp=layout.pp,
        microbatches=layout.microbatches, sequence_parallel=layout.sequence_parallel)
    parts = {key: None if planned is None else getattr(planned, key)
             for key in ("weights", "gradients", "optimizer_state", "activations", "peak")}
    return {"layout": name, "world_size": cluster.world_size, **parts,
            "stage": largest if layout.pp > 1 and planned is not None else None,
            "fits": None if planned is None else planned.peak <= capacity, "not_planned": refused, "time": time}


def _optimizer_bytes(planned, workload: step_time.Workload, strategy: str, dp: int) -> float:
    """What this process's optimizer step reads and writes, from the plan: its state twice, the gradients it
    applies once, the weights they update twice (as stored)."""
    applied = planned.gradients / (dp if strategy == "zero1" else 1)  # ZeRO-1 keeps every gradient, updates 1/N
    weights = applied * workload.stored_bytes / workload.gradient_bytes
    return 2 * planned.optimizer_state + applied + 2 * weights


def _as_json(row: dict, tokens: float | None) -> dict:
    time = row["time"]
    return {**{key: value for key, value in row.items() if key != "time"},
            **({"days": days_for(tokens, row)} if tokens else {}),
            "step_seconds": time.step, "parts_seconds": time.parts(), "tokens_per_second": time.tokens_per_second,
            "mfu": time.mfu, "hfu": time.hfu, "model_flops": time.model_flops,
            "every_expert_flops": time.every_expert_flops,
            "communication": [{"collective": name, "wire_bytes": wire, "seconds": seconds}
                              for name, wire, seconds in time.communication]}


def days_for(tokens: float, row: dict) -> float:
    """Return the days a run of ``tokens`` training tokens takes at the predicted tokens/s of ``row`` (a plan_layouts row)."""
    check_positive_number(tokens, "tokens")
    if not isinstance(row, dict) or not isinstance(row.get("time"), step_time.StepTime):
        raise TypeError(f"row must be one of plan_layouts()' rows, got {row!r:.80}")
    return tokens / row["time"].tokens_per_second / 86400


def format_table(rows: list[dict], tokens: float | None = None) -> str:
    """Return :func:`plan_layouts`'s rows as a text table: memory per process by part, step time by part, tokens/s.

    ``tokens``: a token budget; a last column gives the days each layout takes over it.
    """
    if not isinstance(rows, list) or not all(isinstance(row, dict) and "time" in row for row in rows):
        raise TypeError("rows must be plan_layouts()'s list of rows")
    if tokens is not None:
        check_positive_number(tokens, "tokens")
    header = ("layout", "procs", "shown", "weights", "grads", "optim", "activ", "peak", "fits", "step s", "compute",
              "recomp", "bubble", "comm exp", "optim s", "tokens/s", "MFU", "HFU") + (("days",) if tokens else ())
    lines = [header]
    for row in rows:
        time = row["time"]
        shown = "-" if row["peak"] is None else str(row["stage"] or 0)
        lines.append((row["layout"], str(row["world_size"]), shown, *(format_bytes(row[key]) if row[key] is not None else "-"
                                                                for key in ("weights", "gradients", "optimizer_state",
                                                                            "activations", "peak")),
                      {True: "yes", False: "NO", None: "?"}[row["fits"]], f"{time.step:.4g}", f"{time.compute:.3g}",
                      f"{time.recompute:.3g}", f"{time.bubble:.3g}", f"{time.exposed:.3g}", f"{time.optimizer:.3g}",
                      f"{time.tokens_per_second:,.0f}", f"{time.mfu:.1%}", f"{time.hfu:.1%}",
                      *((f"{days_for(tokens, row):,.2f}",) if tokens else ())))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in lines)
    table += ("\nshown: the process whose memory the row gives (process 0; under a pipeline, its largest stage, every "
              "stage planned)")
    for row in rows:
        if row["not_planned"] is not None:
            table += f"\n{row['layout']}: memory not planned (its time is the step-time model's): {row['not_planned']}"
    experts = next((row["time"] for row in rows if row["time"].every_expert_flops), None)
    if experts is not None:
        table += (f"\nexperts: compute counts the top-k experts each token runs through ({experts.model_flops:.3g} "
                  f"FLOPs per process and step); every expert on every token would be {experts.every_expert_flops:.3g}")
    if any(row["layout"] in ("ddp", "zero1") for row in rows):
        # DDP allocates its flat gradient buckets in the first forward pass; the planner, like the measurement,
        # files them there (memory.planner.with_ddp_buckets), so a reader comparing activations needs to know.
        table += ("\nddp and zero1: activ includes DDP's gradient buckets, as large as the trainable gradients "
                  "(allocated in the forward pass, held through the step)")
    return table


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, naming the argument, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _layout_argument(text: str) -> str:
    if text != "search":
        try:
            layout_fields(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("layout must be ")) from None
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m course_utils.plan",
        description="Memory per process by part and predicted step time of each training layout, for a model on a "
                    "cluster of GPUs (the course's planner and step-time model; GPU figures are the data sheets').",
        epilog=f"example (offline, seconds):\n  {EXAMPLE}\n\n"
               f"shipped models: {', '.join(SHIPPED_MODELS)}\ncards: {', '.join(hardware.CARDS)}\n"
               f"networks: {', '.join(hardware.NETWORKS)}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a config.json (or a folder holding one), or a shipped model name")
    parser.add_argument("--card", required=True, choices=tuple(hardware.CARDS), metavar="CARD",
                        help="the GPU (see the list below)")
    parser.add_argument("--cards-per-node", type=_positive_int, default=1, help="GPUs per node (default 1)")
    parser.add_argument("--nodes", type=_positive_int, default=1, help="nodes (default 1)")
    parser.add_argument("--network", choices=tuple(hardware.NETWORKS), metavar="NETWORK",
                        help="the link between nodes (needed with --nodes above 1)")
    parser.add_argument("--optimizer", default="adamw", choices=tuple(memory.SUPPORTED_OPTIMIZERS),
                        metavar="OPTIMIZER", help="an optimizer of course_utils.optimizers (default adamw)")
    parser.add_argument("--precision", default="bf16", choices=tuple(PRECISIONS), help="default bf16")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on every block")
    parser.add_argument("--lora", type=_positive_int, metavar="RANK", help="LoRA adapters of this rank, base frozen")
    parser.add_argument("--qlora", action="store_true", help="the base in 4-bit NF4 under LoRA (rank 16 or --lora)")
    parser.add_argument("--batch-size", type=_positive_int, default=1, help="sequences per process (default 1)")
    parser.add_argument("--seq-len", type=_positive_int, default=512, help="tokens per sequence (default 512)")
    parser.add_argument("--accumulation", type=_positive_int, default=1, help="micro-batches per step (default 1)")
    parser.add_argument("--layout", default="search", type=_layout_argument,
                        help="one layout, or search (default): every layout for the cluster; a strategy "
                             "(none, ddp, zero1, zero2, zero3, fsdp) optionally +tpN[sp] and +ppP[xM], e.g. zero3+tp8 "
                             "or none+pp4x16 (a layout the memory planner refuses is shown with its reason)")
    parser.add_argument("--tokens", type=_positive_number, metavar="N",
                        help="a token budget (e.g. 2e9): the days each layout takes over it")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON, for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command with ``argv`` (default ``sys.argv[1:]``); return its exit status (2 for a bad argument)."""
    parser = _parser()
    arguments = parser.parse_args(argv)
    if arguments.nodes > 1 and arguments.network is None:
        parser.error(f"argument --network: needed with --nodes {arguments.nodes} (one of {', '.join(hardware.NETWORKS)})")
    if arguments.layout != "search":
        try:  # the string's fields against the cluster's processes: what does not divide is named after --layout
            parse_layout(arguments.layout, arguments.cards_per_node * arguments.nodes)
        except ValueError as error:
            parser.error(f"argument --layout: {str(error).splitlines()[0]}")
    try:
        rows = plan_layouts(arguments.model, card=arguments.card, cards_per_node=arguments.cards_per_node,
                            nodes=arguments.nodes, network=arguments.network, optimizer=arguments.optimizer,
                            precision=arguments.precision, checkpointing=arguments.checkpointing,
                            lora_rank=arguments.lora, qlora=arguments.qlora, batch_size=arguments.batch_size,
                            seq_len=arguments.seq_len, gradient_accumulation_steps=arguments.accumulation,
                            layout=arguments.layout, progress=True)
    except (ValueError, TypeError) as error:
        parser.error(str(error).splitlines()[0])
    if arguments.json:
        print(json.dumps([_as_json(row, arguments.tokens) for row in rows], indent=2))
    else:
        print(format_table(rows, arguments.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
