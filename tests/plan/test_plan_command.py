"""python -m course_utils.plan: the lessons' planner and time model as a command, every option and bad argument (issue 35)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_utils import hardware, memory, plan, step_time

# Tens of CPU-seconds: every option planned (make test hands slow modules out first).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The lessons' tiny DistilBERT on short sequences: every layout plans in seconds.
SMALL = ["course DistilBERT", "--card", "L4", "--seq-len", "32", "--batch-size", "2"]


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
    predicted = step_time.predict_step(step_time.workload_of(model), step_time.gpu_cluster("L4", 2), "zero3", 2, 32,
                                       optimizer_bytes=2 * planned.optimizer_state + planned.gradients * 3)
    assert row["step_seconds"] == predicted.step and row["tokens_per_second"] == predicted.tokens_per_second
    assert row["parts_seconds"] == predicted.parts() and row["mfu"] == predicted.mfu


def test_the_table_has_a_row_per_layout_fastest_that_fits_first(capsys):
    status, out, _ = run([*SMALL, "--cards-per-node", "4"], capsys)
    lines, note = out.strip().splitlines()[:-1], out.strip().splitlines()[-1]
    assert status == 0 and lines[0].split()[:2] == ["layout", "procs"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(plan.SEARCHED)
    assert note.startswith("ddp and zero1: activ includes DDP's gradient buckets")
    rows = plan.plan_layouts("course DistilBERT", card="L4", cards_per_node=4, seq_len=32, batch_size=2)
    assert [line.split()[0] for line in lines[1:]] == [row["layout"] for row in rows]
    assert [row["time"].step for row in rows] == sorted(row["time"].step for row in rows)


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
    assert status == 0 and len(out.strip().splitlines()) == 1 + len(plan.SEARCHED) + 1  # the header, the rows, the DDP note


def test_the_command_runs_as_a_module_and_the_package_installs_it_as_course_plan():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["course-plan"] == "course_utils.plan:main"
    done = subprocess.run([sys.executable, "-m", "course_utils.plan", *SMALL, "--json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0 and json.loads(done.stdout)[0]["layout"] == "none"
    assert "Warning" not in done.stderr and "warn" not in done.stderr.lower(), done.stderr


def test_a_layout_string_names_the_strategy_and_the_model_parallel_degrees():
    assert plan.parse_layout("zero3") == {"strategy": "zero3", "tp": 1, "pp": 1, "microbatches": 1,
                                          "sequence_parallel": False}
    assert plan.parse_layout("zero1+tp8sp+pp4x16") == {"strategy": "zero1", "tp": 8, "pp": 4, "microbatches": 16,
                                                       "sequence_parallel": True}
    assert plan.parse_layout("ddp+pp2")["microbatches"] == 2  # as many micro-batches as stages unless told


def test_a_tensor_or_pipeline_parallel_row_has_its_predicted_time_and_no_faked_memory(capsys):
    status, out, _ = run([*SMALL, "--cards-per-node", "4", "--layout", "ddp+tp2+pp2x2", "--json"], capsys)
    (row,) = json.loads(out)
    assert status == 0 and row["peak"] is None and row["fits"] is None and row["memory"] == plan.MEMORY_NOT_PLANNED
    model = plan.load_model("course DistilBERT", "bf16")
    predicted = step_time.predict_step(step_time.workload_of(model), step_time.gpu_cluster("L4", 4), "ddp", 2, 32,
                                       tp=2, pp=2, microbatches=2)
    assert row["step_seconds"] == predicted.step and row["parts_seconds"]["pipeline bubble"] == predicted.bubble > 0
    assert any(c["collective"].startswith("tp all_reduce") for c in row["communication"])
    _, table, _ = run([*SMALL, "--cards-per-node", "4", "--layout", "ddp+tp2+pp2x2"], capsys)
    assert "tp/pp rows: memory not planned" in table and " ? " in table
