"""Exercises of lesson 10: plan your own run.

- ``q1``: the layout that trains Llama 3.1 70B on a given cluster at the highest
  predicted tokens/s. The check plans the learner's layout with the course's
  planner and time model (:func:`course_utils.plan.plan_layouts`): any layout
  that fits and is predicted within 1 % of the fastest that fits is accepted
  (``fsdp`` is ``zero3`` by another name), tensor- and pipeline-parallel ones
  too (``"zero3+tp8"``, :func:`course_utils.plan.parse_layout`), each planned per process.
  A layout that does not fit is told which part of its memory the usual mistakes
  leave out (:func:`diagnose_layout`): the optimizer state, activations that do
  not divide under ZeRO, ZeRO-2's gathered weights. A layout the planner refuses
  is told the planner's reason. A tensor-parallel group that spans nodes is told
  what its all-reduces cost on the network against a node's link
  (:func:`diagnose_tensor_parallel`, the time model's numbers).
- ``q2``: a function that turns a token budget and a planned row into days,
  run on rows the check builds (several clusters, so a per-process rate or
  a slip of unit gives another result).
"""

from __future__ import annotations

import functools
import math

from course_utils import plan, step_time
from course_utils.exercises.core import CodeExercise, Exercise, Incorrect, describe_value
from course_utils.units import format_bytes
from course_utils.validation import check_positive_int

CLUSTER = {"card": "H100 SXM", "cards_per_node": 8, "nodes": 4, "network": "InfiniBand NDR 400 Gb/s per GPU"}
"""q1's cluster: 4 nodes of 8 H100 SXM on 400 Gb/s InfiniBand per GPU."""
RUN = {"model": "Llama 3.1 70B", "seq_len": 4096, "batch_size": 1, "checkpointing": True, "precision": "bf16"}
"""q1's run: Llama 3.1 70B, one sequence of 4,096 tokens per process, checkpointing, bf16."""
TOLERANCE = 0.01
"""How far below the fastest fitting layout's tokens/s an accepted answer may be predicted."""


@functools.cache
def planned_rows() -> tuple[dict, ...]:
    """Return q1's plan: every layout of :func:`course_utils.plan.searched_layouts` on :data:`CLUSTER` (computed once)."""
    return tuple(plan.plan_layouts(RUN["model"], **CLUSTER, seq_len=RUN["seq_len"], batch_size=RUN["batch_size"],
                                   checkpointing=RUN["checkpointing"], precision=RUN["precision"]))


def diagnose_layout(row: dict, capacity: int) -> str:
    """Return why ``row`` (a plan_layouts row whose peak exceeds ``capacity`` bytes) does not fit, naming the classic mistake."""
    if not isinstance(row, dict) or not {"layout", "world_size", "peak", "optimizer_state", "activations"} <= set(row):
        raise TypeError(f"row must be one of plan_layouts()' rows, got {row!r:.80}")
    check_positive_int(capacity, "capacity")
    world, over = row["world_size"], row["peak"] - capacity
    lead = f"`{row['layout']}` needs {format_bytes(row['peak'])} per GPU at its peak; the card has {format_bytes(capacity)}."
    if row["peak"] - row["optimizer_state"] <= capacity:
        return (f"{lead} Without its optimizer state ({format_bytes(row['optimizer_state'])} per process: AdamW's two "
                "moments) it would fit: did your estimate leave the optimizer state out?")
    if row["layout"] != "ddp" and row["peak"] - row["activations"] * (1 - 1 / world) <= capacity:
        return (f"{lead} It would fit if its activations ({format_bytes(row['activations'])}) were divided over the "
                f"{world} processes; ZeRO shards weights, gradients and optimizer state, never activations: each "
                "process holds its own micro-batch's.")
    if row["layout"] == "zero2":
        return (f"{lead} ZeRO-2 keeps every block's gathered weights from its forward pass to its backward pass, so "
                f"the whole model's weights are alive at the peak, however many processes share the rest.")
    return (f"{lead} Its parts per process: weights {format_bytes(row['weights'])}, gradients "
            f"{format_bytes(row['gradients'])}, optimizer state {format_bytes(row['optimizer_state'])}, activations "
            f"{format_bytes(row['activations'])}: {format_bytes(over)} too many.")


def diagnose_tensor_parallel(layout: str) -> str | None:
    """Return why ``layout`` (a :func:`course_utils.plan.parse_layout` string with tp > 1) is not accepted on q1's
    cluster before its memory is planned, from the time model's numbers: it does not divide the cluster, or its
    tensor-parallel group spans nodes. None otherwise (not a tensor-parallel layout string, or its group inside a
    node: then its planned memory and predicted time judge it, as any layout's)."""
    try:
        spec = plan.layout_fields(layout)
    except (TypeError, ValueError):
        return None
    if spec["tp"] == 1:
        return None
    per_node, processes = CLUSTER["cards_per_node"], CLUSTER["cards_per_node"] * CLUSTER["nodes"]
    if processes % (spec["tp"] * spec["pp"]) or RUN["batch_size"] % spec["microbatches"]:
        return (f"`{layout}` does not divide this cluster's {processes} GPUs and its batch of {RUN['batch_size']} "
                "sequence per process.")
    if spec["tp"] <= per_node:
        try:
            plan.parse_layout(layout, processes)
        except ValueError as error:  # the layout's own refusal, in its words
            return f"`{layout}` cannot run on this cluster: {error}."
        return None
    model = plan.load_model(RUN["model"], RUN["precision"], RUN["checkpointing"])
    workload = step_time.workload_of(model)
    cluster = step_time.gpu_cluster(CLUSTER["card"], per_node, CLUSTER["nodes"], "bf16", CLUSTER["network"])
    try:
        predicted = step_time.predict_step(workload, cluster, spec["strategy"], RUN["batch_size"], RUN["seq_len"],
                                           checkpointing=RUN["checkpointing"], tp=spec["tp"], pp=spec["pp"],
                                           microbatches=spec["microbatches"],
                                           sequence_parallel=spec["sequence_parallel"])
    except ValueError as error:  # the time model's own refusal, in its words
        return f"`{layout}` cannot run on this cluster: {error}."
    tp_rows = [(wire, seconds) for name, wire, seconds in predicted.communication if name.startswith("tp ")]
    tp_seconds, tp_wire = sum(s for _, s in tp_rows), sum(w for w, _ in tp_rows)
    on_nvlink = tp_wire / cluster.intra.bandwidth
    return (f"`{layout}` puts each tensor-parallel group of {spec['tp']} GPUs across "
            f"{math.ceil(spec['tp'] / per_node)} nodes of {per_node}: its all-reduces (2 per block forward, 2 "
            f"backward) then cross {cluster.inter.name}, {tp_seconds:.3g} s exposed per step against "
            f"{on_nvlink:.3g} s for the same bytes on {cluster.intra.name}, beside {predicted.compute:.3g} s of "
            f"compute. Keep tp at most {per_node} (one node) and shard across nodes with ZeRO/FSDP or a pipeline.")


@functools.cache
def _answer_row(layout: str) -> dict | str:
    """q1's plan of one layout string the search did not plan (a row), or why it cannot run on the cluster (a str)."""
    try:
        return plan.plan_layouts(RUN["model"], **CLUSTER, seq_len=RUN["seq_len"], batch_size=RUN["batch_size"],
                                 checkpointing=RUN["checkpointing"], precision=RUN["precision"], layout=layout)[0]
    except ValueError as error:  # the layout's, the planner's or the time model's own refusal, in its words
        return f"`{layout}` cannot run on this cluster: {str(error).splitlines()[0]}."


class FastestLayout(Exercise):
    title = "Exercise 1"
    variables = ["my_layout"]
    hints = [
        "Plan every layout on the cluster (`plan.plan_layouts(..., layout=\"search\")`) with exercise 1's settings "
        "(`ex.q1_cluster`, `ex.q1_run`): memory per process and predicted step for each.",
        "Keep only the layouts that fit (`row[\"fits\"]`: the planned peak within one card's memory; None where the "
        "planner does not plan the layout), then take the one with the most tokens/s.",
    ]
    solution_code = """
        q1_rows = plan.plan_layouts(ex.q1_run["model"], **ex.q1_cluster, seq_len=ex.q1_run["seq_len"],
                                    batch_size=ex.q1_run["batch_size"], checkpointing=ex.q1_run["checkpointing"],
                                    precision=ex.q1_run["precision"])
        my_layout = max((row for row in q1_rows if row["fits"]), key=lambda row: row["time"].tokens_per_second)["layout"]
    """
    correct_message = "That layout fits and no other that fits is predicted faster on this cluster."

    def check_answer(self, my_layout):
        if not isinstance(my_layout, str):
            raise Incorrect(f"`my_layout` should be a layout's name (a string such as \"ddp\"), but it is "
                            f"{describe_value(my_layout)}.")
        rows = {row["layout"]: row for row in planned_rows()}
        rows.setdefault("fsdp", rows.get("zero3"))
        row = rows.get(my_layout)
        if row is None:
            tensor_parallel = diagnose_tensor_parallel(my_layout)
            if tensor_parallel is not None:
                raise Incorrect(tensor_parallel)
            try:
                plan.layout_fields(my_layout)
            except ValueError:
                raise Incorrect(f"`my_layout` is {my_layout!r}, which is not one of the layouts planned here "
                                f"({', '.join(repr(name) for name in rows)}) nor a layout string such as "
                                "'zero3+tp8' or 'none+pp4x16'.") from None
            row = _answer_row(my_layout)
            if isinstance(row, str):
                raise Incorrect(row)
        from course_utils import hardware

        capacity = hardware.card(CLUSTER["card"]).memory.value
        if row["peak"] is None:
            raise Incorrect(f"The planner does not plan the memory of `{my_layout}`, so this check cannot tell whether "
                            f"it fits: {row['not_planned']}. Answer with a layout it plans.")
        if row["peak"] > capacity:
            raise Incorrect(diagnose_layout(row, capacity))
        best = max(r["time"].tokens_per_second for r in (*rows.values(), row) if r["fits"])
        if not row["time"].tokens_per_second >= (1 - TOLERANCE) * best:
            raise Incorrect(f"`{my_layout}` fits, at {row['time'].tokens_per_second:,.0f} tokens/s predicted; "
                            "another layout that fits is predicted faster.")


def _row(tokens_per_second: float, world_size: int) -> dict:
    """A plan row whose predicted step runs ``tokens_per_second`` on ``world_size`` processes (tokens of one step: 4,096 each)."""
    tokens = 4096 * world_size
    seconds = tokens / tokens_per_second
    time = step_time.StepTime(compute=seconds, recompute=0.0, communication=(), exposed=0.0, optimizer=0.0,
                              step=seconds, tokens_per_second=tokens_per_second, mfu=0.4, hfu=0.4,
                              model_flops=1.0, hardware_flops=1.0)
    return {"layout": "zero3", "world_size": world_size, "peak": 1, "fits": True, "time": time}


class DaysForBudget(CodeExercise):
    title = "Exercise 2"
    variables = ["days_for_budget"]
    rel_tol = 1e-9
    hints = [
        "A row's `row[\"time\"].tokens_per_second` counts the tokens of every process together, per second.",
        "Seconds are the tokens over that rate; a day has 86,400 seconds.",
    ]
    solution_code = """
        def days_for_budget(tokens, row):
            return tokens / row["time"].tokens_per_second / 86400
    """
    correct_message = "That is `plan.days_for`: the command's `--tokens` column."

    def cases(self):
        return [(2e9, _row(22_000.0, 32)), (15e12, _row(1.5e6, 1024)), (1e8, _row(3_000.0, 1))]

    def reference(self, tokens, row):
        return plan.days_for(tokens, row)

    def describe_case(self, args):
        tokens, row = args
        return (f"With a budget of {tokens:.3g} tokens at {row['time'].tokens_per_second:,.0f} tokens/s on "
                f"{row['world_size']} process{'es' if row['world_size'] > 1 else ''}")

    def diagnose(self, got, expected, args):
        try:
            value = float(got)
        except (TypeError, ValueError, OverflowError):
            return None
        if math.isnan(value):
            return f"{self.describe_case(args)}, `days_for_budget` returned NaN: it is not a number of days."
        close = lambda a, b: math.isclose(a, b, rel_tol=1e-6)  # noqa: E731
        world = args[1]["world_size"]
        for factor, unit in ((24, "hours"), (1440, "minutes"), (86400, "seconds")):
            if close(value, expected * factor):
                return f"{self.describe_case(args)}, your result is in {unit}: divide by {factor:,} more."
        if world > 1 and close(value, expected * world):
            return (f"{self.describe_case(args)}, your result is {world} times too long: `tokens_per_second` already "
                    "counts every process's tokens; dividing it by the processes gives one process's rate.")
        if world > 1 and close(value, expected / world):
            return (f"{self.describe_case(args)}, your result is {world} times too short: `tokens_per_second` already "
                    "counts every process; do not multiply it by the processes again.")
        return None


q1 = FastestLayout()
q2 = DaysForBudget()
q1_cluster = CLUSTER
q1_run = RUN
