"""The step-time model against real steps on CPU processes and against published runs (issue 35, part 1).

The CPU test checks that the prediction is made from this machine's
measurements and set beside the measured steps; it asserts no accuracy (the
machine running the tests may be loaded: the report quotes what it got).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from course_utils import launcher, sharding, step_time, step_time_checks


def test_each_published_run_names_its_source_and_a_layout_the_planner_has():
    for run in step_time_checks.PUBLISHED_THROUGHPUTS:
        assert run.layout in step_time.LAYOUTS and run.model in step_time_checks.LLAMA_SHAPES
        assert "torchtitan" in run.source and run.tokens_per_second_per_gpu > 0


def test_the_predictions_do_not_read_the_published_figures():
    rows = step_time_checks.compare_with_published()
    doubled = tuple(dataclasses.replace(run, tokens_per_second_per_gpu=2 * run.tokens_per_second_per_gpu)
                    for run in step_time_checks.PUBLISHED_THROUGHPUTS)
    again = step_time_checks.compare_with_published(doubled)
    for row, other in zip(rows, again):
        assert row["predicted"] == other["predicted"]
        assert other["error"] == pytest.approx((1 + row["error"]) / 2 - 1)
        assert math.isfinite(row["error"]) and 0 < row["predicted"].mfu < 1


def test_full_checkpointing_is_predicted_with_one_recomputed_forward():
    rows = {(row["run"].model, row["run"].checkpointing): row for row in step_time_checks.compare_with_published()}
    full = rows["Llama 3 70B", "full"]["predicted"]
    assert full.recompute > 0 and full.hfu > full.mfu
    assert rows["Llama 2 13B", "none"]["predicted"].recompute == 0


def test_the_published_table_has_a_row_per_run_with_its_error():
    text = step_time_checks.describe_published(step_time_checks.compare_with_published())
    assert len(text.splitlines()) == 2 + len(step_time_checks.PUBLISHED_THROUGHPUTS)
    assert "2,973" in text and "%" in text


@pytest.mark.forks
def test_real_ddp_and_zero_steps_on_cpu_processes_are_predicted_from_this_machines_measurements():
    sharding.prepare(3, 8)
    measured = launcher.launch(step_time_checks.measure_cpu_steps, (8, 3), num_processes=2, quiet=True, timeout=300)
    slowest = step_time_checks.slowest_process(measured)
    assert slowest["compute_seconds"] == [max(a, b) for a, b in zip(measured[0]["compute_seconds"],
                                                                      measured[1]["compute_seconds"])]
    cluster = step_time_checks.cpu_cluster(slowest)
    assert cluster.world_size == 2 and not cluster.overlaps
    assert 0 < cluster.device.fraction <= 1 and cluster.intra.latency > 0
    rows = step_time_checks.compare_with_cpu_steps(slowest)
    assert [row["layout"] for row in rows] == list(step_time_checks.CPU_LAYOUTS)
    for row in rows:
        assert len(measured[0]["seconds"][row["layout"]]) == 3
        assert row["low"] <= row["median"] <= row["high"] and row["predicted"].step > 0
        assert math.isfinite(row["error"])
        assert row["predicted"].communication  # every layout communicates on 2 processes
    # The framework's own work is measured on the toy and exposed: FSDP2's per unit, on top of the wire.
    costs = cluster.framework
    assert set(costs.passes) == set(costs.update) == set(step_time_checks.CPU_LAYOUTS) and costs.copy_bandwidth > 0
    zero3 = next(row["predicted"] for row in rows if row["layout"] == "zero3")
    assert zero3.framework == step_time.framework_seconds(step_time.workload_of(sharding.course_model()), cluster, "zero3")
