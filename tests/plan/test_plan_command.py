"""python -m course_utils.plan: the lessons' planner and time model as a command, every option and bad argument (issue 35)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_utils import hardware, memory, plan, sharding_plans, step_time
from course_utils.layouts import Layout

# Tens of CPU-seconds: every option planned (make test hands slow modules out first).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The lessons' tiny DistilBERT on short sequences: every layout plans in seconds.
SMALL = ["course DistilBERT", "--card", "L4", "--seq-len", "32", "--batch-size", "2"]
LLAMA = next(iter(sharding_plans.MODEL_SHAPES))


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        status = plan.main(argv)
    except SystemExit as stop:
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


def test_the_commands_json_is_the_library_calls_numbers(capsys):
    status, out, _ = run([*SMALL, "--cards-per-node", "2", "--layout", "zero3", "--json"], capsys)
    (row,) = json.loads(out)
    model = plan.load_model("course DistilBERT", "bf16")
    planned = memory.estimate_training_memory(model, "adamw", 2, 32, world_size=2, sharding="zero3")
    assert status == 0
    assert {key: row[key] for key in ("weights", "gradients", "optimizer_state", "activations", "peak")} == {
        "weights": planned.weights, "gradients": planned.gradients, "optimizer_state": planned.optimizer_state,
        "activations": planned.activations, "peak": planned.peak}
    assert row["not_planned"] is None and row["stage"] is None
    predicted = step_time.predict_step(step_time.workload_of(model), step_time.gpu_cluster("L4", 2), "zero3", 2, 32,
                                       optimizer_bytes=2 * planned.optimizer_state + planned.gradients * 3)
    assert row["step_seconds"] == predicted.step and row["tokens_per_second"] == predicted.tokens_per_second
    assert row["parts_seconds"] == predicted.parts() and row["mfu"] == predicted.mfu


def test_a_tensor_parallel_rows_memory_is_the_planners_with_that_layout(capsys):
    status, out, _ = run([*SMALL, "--cards-per-node", "4", "--layout", "zero3+tp2", "--json"], capsys)
    (row,) = json.loads(out)
    model = plan.load_model("course DistilBERT", "bf16")
    layout = Layout("zero3", 4, tp=2)
    assert plan.parse_layout("zero3+tp2", 4) == layout
    planned = memory.estimate_training_memory(model, "adamw", 2, 32, layout=layout, rank=0)
    assert status == 0 and row["not_planned"] is None and row["fits"] is True
    assert {key: row[key] for key in ("weights", "gradients", "optimizer_state", "activations", "peak")} == {
        "weights": planned.weights, "gradients": planned.gradients, "optimizer_state": planned.optimizer_state,
        "activations": planned.activations, "peak": planned.peak}
    # each process holds about half the split layers: less than one process of the same zero3 on 2 data-parallel copies
    alone = memory.estimate_training_memory(model, "adamw", 2, 32, world_size=2, sharding="zero3")
    assert planned.weights < alone.weights
    predicted = step_time.predict_step(step_time.workload_of(model), step_time.gpu_cluster("L4", 4), "zero3", 2, 32,
                                       tp=2, optimizer_bytes=2 * planned.optimizer_state + planned.gradients * 3)
    assert row["step_seconds"] == predicted.step
    assert any(c["collective"].startswith("tp all_reduce") for c in row["communication"])


def test_a_pipeline_row_shows_its_largest_stage_every_stage_planned(capsys):
    # a Llama of lesson 7's shapes, 2 blocks: the pipeline planner divides identical blocks between stages
    status, out, _ = run([LLAMA, "--card", "L4", "--cards-per-node", "2", "--seq-len", "16", "--batch-size", "2",
                          "--precision", "fp32", "--layout", "none+pp2x2", "--json"], capsys)
    (row,) = json.loads(out)
    model = plan.load_model(LLAMA, "fp32")
    layout = Layout("none", 2, pp=2, microbatches=2)
    stages = [memory.estimate_training_memory(model, "adamw", 2, 16, layout=layout, rank=rank) for rank in (0, 1)]
    largest = max((0, 1), key=lambda rank: stages[rank].peak)
    assert status == 0 and row["not_planned"] is None and row["stage"] == largest
    assert row["peak"] == stages[largest].peak and row["weights"] == stages[largest].weights
    assert stages[0].peak != stages[1].peak  # the embeddings on the first stage, the head and loss on the last
    assert row["parts_seconds"]["pipeline bubble"] > 0


def test_a_combination_the_planner_refuses_shows_its_reason(capsys):
    model = plan.load_model("course DistilBERT", "bf16")
    with pytest.raises(memory.PlannerRefused) as refusal:
        memory.estimate_training_memory(model, "adamw", 2, 32, layout=Layout("ddp", 4, tp=2), rank=0)
    status, out, _ = run([*SMALL, "--cards-per-node", "4", "--layout", "ddp+tp2", "--json"], capsys)
    (row,) = json.loads(out)
    assert status == 0 and row["peak"] is None and row["fits"] is None
    assert row["not_planned"] == " ".join(str(refusal.value).split())
    model_parallel = step_time.predict_step(step_time.workload_of(model), step_time.gpu_cluster("L4", 4), "ddp", 2,
                                            32, tp=2)
    assert row["step_seconds"] == model_parallel.step  # its time is still the time model's
    _, table, _ = run([*SMALL, "--cards-per-node", "4", "--layout", "ddp+tp2"], capsys)
    assert f"ddp+tp2: memory not planned (its time is the step-time model's): {row['not_planned']}" in table
    assert " ? " in table


def test_the_table_has_a_row_per_searched_layout_most_tokens_per_second_first(capsys):
    status, out, _ = run([*SMALL, "--cards-per-node", "4"], capsys)
    lines = out.strip().splitlines()
    table = lines[:1 + len(plan.searched_layouts(4, 4, 2))]
    assert status == 0 and table[0].split()[:3] == ["layout", "procs", "shown"]
    assert sorted(line.split()[0] for line in table[1:]) == sorted(plan.searched_layouts(4, 4, 2))
    assert lines[-1].startswith("ddp and zero1: activ includes DDP's gradient buckets")
    rows = plan.plan_layouts("course DistilBERT", card="L4", cards_per_node=4, seq_len=32, batch_size=2)
    assert [line.split()[0] for line in table[1:]] == [row["layout"] for row in rows]
    fitting = [row["time"].tokens_per_second for row in rows if row["fits"]]
    assert fitting == sorted(fitting, reverse=True)
    for row in rows:
        if row["not_planned"] is not None:
            assert f"{row['layout']}: memory not planned" in out


def test_the_search_adds_tensor_parallelism_within_a_node_and_one_pipeline():
    assert plan.searched_layouts(1, 1) == ("none",)
    assert plan.searched_layouts(8, 8, 2) == (*plan.SEARCHED, "zero2+tp2", "zero3+tp2", "zero2+tp4", "zero3+tp4",
                                             "none+tp8", "none+pp8x2")
    # two nodes of 4: no tensor-parallel group of 8 (it would span the nodes)
    assert plan.searched_layouts(8, 4) == (*plan.SEARCHED, "zero2+tp2", "zero3+tp2", "zero2+tp4", "zero3+tp4",
                                          "none+pp8x1")
    for layout in plan.searched_layouts(32, 8):
        assert plan.parse_layout(layout, 32).world_size == 32


def test_one_process_plans_one_layout(capsys):
    status, out, _ = run([*SMALL, "--json"], capsys)
    assert status == 0 and [row["layout"] for row in json.loads(out)] == ["none"]


@pytest.mark.parametrize("options", [
    ["--precision", "fp32"], ["--precision", "bf16-autocast"], ["--checkpointing"], ["--lora", "4"],
    ["--qlora"], ["--qlora", "--lora", "4"],
    ["--optimizer", "sgd"], ["--accumulation", "2"], ["--layout", "ddp", "--cards-per-node", "2"],
    ["--layout", "zero1", "--cards-per-node", "2"], ["--layout", "zero2", "--cards-per-node", "2"],
    ["--layout", "fsdp", "--cards-per-node", "2"],
    ["--nodes", "2", "--cards-per-node", "2", "--network", "InfiniBand HDR 200 Gb/s per GPU", "--layout", "ddp"],
], ids=lambda options: " ".join(options))
def test_every_option_reaches_the_planner_and_the_time_model(options, capsys):
    status, out, _ = run([*SMALL, *options, "--json"], capsys)
    rows = json.loads(out)
    assert status == 0 and rows and all(row["step_seconds"] > 0 and row["peak"] > 0 for row in rows)


def test_options_change_what_they_should(capsys):
    rows = {}
    for name, options in {"plain": [], "checkpointing": ["--checkpointing"], "lora": ["--lora", "4"],
                          "fp32": ["--precision", "fp32"]}.items():
        _, out, _ = run([*SMALL, *options, "--json"], capsys)
        rows[name] = json.loads(out)[0]
    assert rows["checkpointing"]["parts_seconds"]["recompute"] > 0 == rows["plain"]["parts_seconds"]["recompute"]
    assert rows["lora"]["optimizer_state"] < rows["plain"]["optimizer_state"] / 5  # adapters and the head only
    assert rows["fp32"]["weights"] == pytest.approx(2 * rows["plain"]["weights"], rel=0.01)  # buffers stay as they are
    assert rows["fp32"]["parts_seconds"]["compute"] > rows["plain"]["parts_seconds"]["compute"]  # fp32 peak is lower


def test_a_token_budget_gives_the_days_at_the_predicted_tokens_per_second(capsys):
    _, out, _ = run([*SMALL, "--tokens", "1e12", "--json"], capsys)
    (row,) = json.loads(out)
    assert row["days"] == pytest.approx(1e12 / row["tokens_per_second"] / 86400)
    _, table, _ = run([*SMALL, "--tokens", "1e12"], capsys)
    assert table.splitlines()[0].split()[-1] == "days"


def test_a_config_json_on_disk_plans_as_its_shipped_name(capsys):
    _, by_name, _ = run([*SMALL, "--json"], capsys)
    _, by_path, _ = run([str(REPO / "data" / "tiny-distilbert" / "config.json"), *SMALL[1:], "--json"], capsys)
    assert json.loads(by_name) == json.loads(by_path)


BAD_ARGUMENTS = [
    (["no-such-model", "--card", "L4"], "model"),
    (["course DistilBERT", "--card", "V100"], "--card"),
    (["course DistilBERT"], "--card"),
    ([*SMALL, "--cards-per-node", "0"], "--cards-per-node"),
    ([*SMALL, "--nodes", "two"], "--nodes"),
    ([*SMALL, "--nodes", "2"], "--network"),
    ([*SMALL, "--network", "Ethernet"], "--network"),
    ([*SMALL, "--optimizer", "adamw "], "--optimizer"),
    ([*SMALL, "--precision", "fp16"], "--precision"),
    ([*SMALL, "--lora", "-1"], "--lora"),
    ([*SMALL, "--batch-size", "0"], "--batch-size"),
    ([*SMALL, "--seq-len", "1.5"], "--seq-len"),
    ([*SMALL, "--seq-len", "4096"], "seq_len"),  # longer than the model's 128 positions: the planner says so
    ([*SMALL, "--accumulation", "0"], "--accumulation"),
    ([*SMALL, "--layout", "zero4"], "--layout"),
    ([*SMALL, "--layout", "zero3+tp"], "--layout"),
    ([*SMALL, "--cards-per-node", "4", "--layout", "zero3+tp3"], "--layout"),  # tp does not divide 4 processes
    ([*SMALL, "--cards-per-node", "4", "--layout", "zero3+tp4"], "--layout"),  # zero3 on one data-parallel process
    ([*SMALL, "--cards-per-node", "4", "--layout", "none+pp4x3"], "batch_size"),  # 2 sequences into 3 micro-batches
    ([*SMALL, "--layout", "zero3"], "layout"),  # sharding on one process
    ([*SMALL, "--cards-per-node", "2", "--layout", "none"], "layout"),
    ([*SMALL, "--frobnicate"], "--frobnicate"),
    ([*SMALL, "--tokens", "0"], "--tokens"),
    ([*SMALL, "--tokens", "many"], "--tokens"),
]


@pytest.mark.parametrize(("argv", "named"), BAD_ARGUMENTS, ids=[" ".join(a[len(SMALL):] or a) for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_gets_one_line_naming_it(argv, named, capsys):
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip() and "planning layouts" not in line]
    assert len(lines) == 1 and lines[0].startswith("python -m course_utils.plan: error:") and named in lines[0], err


def test_help_shows_an_example_that_runs(capsys):
    status, out, _ = run(["--help"], capsys)
    assert status == 0 and plan.EXAMPLE in out
    for name in (*hardware.CARDS, *plan.SHIPPED_MODELS):
        assert name in out
    argv = shlex.split(plan.EXAMPLE)
    assert argv[:3] == ["python", "-m", "course_utils.plan"]
    status, out, _ = run(argv[3:], capsys)
    rows = [line.split()[0] for line in out.strip().splitlines()[1:1 + len(plan.searched_layouts(2, 2))]]
    assert status == 0 and sorted(rows) == sorted(plan.searched_layouts(2, 2))


def test_the_command_runs_as_a_module_and_the_package_installs_it_as_course_plan():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["course-plan"] == "course_utils.plan:main"
    done = subprocess.run([sys.executable, "-m", "course_utils.plan", *SMALL, "--json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0 and json.loads(done.stdout)[0]["layout"] == "none"
    assert "Warning" not in done.stderr and "warn" not in done.stderr.lower(), done.stderr


def test_a_layout_string_names_the_strategy_and_the_model_parallel_degrees():
    assert plan.layout_fields("zero3") == {"strategy": "zero3", "tp": 1, "pp": 1, "microbatches": 1,
                                           "sequence_parallel": False}
    assert plan.layout_fields("zero1+tp8sp+pp4x16") == {"strategy": "zero1", "tp": 8, "pp": 4, "microbatches": 16,
                                                        "sequence_parallel": True}
    assert plan.layout_fields("ddp+pp2")["microbatches"] == 2  # as many micro-batches as stages unless told


def test_a_layout_string_becomes_the_layout_on_the_clusters_processes():
    assert plan.parse_layout("zero3+tp8", 32) == Layout("zero3", 32, tp=8)
    assert plan.parse_layout("none+pp4x16", 4) == Layout("none", 4, pp=4, microbatches=16)
    assert plan.parse_layout("fsdp+tp2sp", 8) == Layout("zero3", 8, tp=2, sequence_parallel=True)
    assert plan.parse_layout("fsdp", 8) == Layout("zero3", 8) and plan.parse_layout("ddp", 1) == Layout("none")
    with pytest.raises(ValueError, match="layout 'zero3\\+tp8' on 8 processes"):
        plan.parse_layout("zero3+tp8", 8)  # no data-parallel processes left to shard over
