"""Lesson 9's tensor, sequence and pipeline parallelism and its meshes, run on launched CPU processes over gloo.

Each run is checked against the same step on one process; what each process holds and sends is measured there.
"""

import math
import sys

import pytest
import torch

from course_utils import meshes, parallel, pipeline, tensor_parallel
from hard_limits import fail_after

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own.
pytestmark = pytest.mark.forks

TOLERANCE = 1e-5  # fp32 sums in another order: the runs differ from one process by about 1e-6 at most


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    """No bitsandbytes in sys.modules (other tests import it; the launcher refuses to fork with it)."""
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def launch(function, args=(), num_processes=2):
    with fail_after(240, f"{function.__name__} on {num_processes} processes"):
        return parallel.launch(function, args, num_processes=num_processes, quiet=True, timeout=180,
                               oversubscribe=num_processes > 2)


@pytest.fixture(scope="module")
def splits():
    sys.modules.pop("bitsandbytes", None)
    return launch(tensor_parallel.run_split)


@pytest.fixture(scope="module")
def mesh_runs():
    sys.modules.pop("bitsandbytes", None)
    return launch(meshes.run_mesh, num_processes=4)


# ---------------------------------------------------------------- tensor and sequence parallelism


def split_bytes(block, world_size):
    """Bytes of one process's share of a Block: the split matrices and biases divided, norms and row biases whole."""
    whole = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "attn.out.bias", "mlp.down.bias"}
    return sum(4 * p.numel() // (1 if name in whole else world_size) for name, p in block.named_parameters())


@pytest.mark.parametrize("run", tensor_parallel.RUNS)
def test_every_split_computes_what_one_process_computes(splits, run):
    for process in splits:
        assert process[run].forward_gap < TOLERANCE and process[run].gradient_gap < TOLERANCE


@pytest.mark.parametrize("run", ["from scratch", "parallelize_module", "sequence parallel"])
def test_each_process_holds_its_share_of_the_block_and_of_adamw(splits, run):
    expected = split_bytes(tensor_parallel.tiny_block(), 2)
    for process in splits:
        held = process[run].held
        assert held["weights"] == held["gradients"] == expected
        assert held["optimizer_state"] == 2 * expected + 4 * len(list(tensor_parallel.tiny_block().parameters()))


def test_the_split_written_out_all_reduces_twice_forward_and_twice_backward(splits):
    run = splits[0]["from scratch"]
    batch, seq, dim = run.activation_shape
    assert run.forward_collectives == {"all_reduce": 2} and run.backward_collectives == {"all_reduce": 2}
    assert run.forward_payload == {"all_reduce": 2 * batch * seq * dim * 4}  # each the whole activation, fp32


def test_dtensor_all_reduces_the_input_gradient_of_each_column_split_layer(splits):
    # q, k, v each get their own input-gradient all-reduce under ColwiseParallel, and mlp.up one: four.
    run = splits[0]["parallelize_module"]
    assert run.forward_collectives == {"all_reduce": 2} and run.backward_collectives == {"all_reduce": 4}


def test_sequence_parallelism_replaces_the_all_reduces_and_divides_more_activations(splits):
    sequence, tensor = splits[0]["sequence parallel"], splits[0]["parallelize_module"]
    batch, seq, dim = sequence.activation_shape
    assert sequence.forward_collectives == {"all_gather": 2, "reduce_scatter": 2}
    # An all-gather hands in this process's tokens, a reduce-scatter the whole partial output.
    assert sequence.forward_payload == {"all_gather": 2 * batch * seq // 2 * dim * 4,
                                        "reduce_scatter": 2 * batch * seq * dim * 4}
    assert sequence.held["activations"] < tensor.held["activations"] < tensor.one_process["activations"]


def test_distilbert_split_by_dtensor_holds_less_than_one_process(splits):
    run = splits[0]["distilbert"]
    assert run.forward_collectives == {"all_reduce": 4}  # two per block, two blocks
    assert run.held["weights"] < run.one_process["weights"]


def test_the_split_by_hand_refuses_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="heads"):
        tensor_parallel.tensor_parallel_block(tensor_parallel.tiny_block(heads=4), 0, 3)


# ---------------------------------------------------------------- pipeline parallelism


def test_gpipe_runs_every_forward_then_every_backward():
    assert pipeline.gpipe(0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]


@pytest.mark.parametrize("num_stages, num_microbatches", [(2, 4), (4, 8), (4, 2), (3, 3)])
def test_one_f_one_b_keeps_at_most_stages_minus_stage_in_flight(num_stages, num_microbatches):
    for stage in range(num_stages):
        order = pipeline.one_f_one_b(stage, num_stages, num_microbatches)
        assert sorted(order) == sorted(pipeline.gpipe(stage, num_stages, num_microbatches))
        in_flight, most = 0, 0
        for kind, _ in order:
            in_flight += 1 if kind == "F" else -1
            most = max(most, in_flight)
        assert most == min(num_stages - stage, num_microbatches)


def test_the_bubble_of_an_ideal_pipeline_is_the_formula():
    # p stages, m micro-batches, every pass one unit long: stage s computes in slots s .. s + m - 1.
    p, m = 3, 5
    spans = [[(s + i, s + i + 1) for i in range(m)] for s in range(p)]
    assert math.isclose(pipeline.bubble_fraction(spans), pipeline.bubble_formula(p, m))
    assert math.isclose(pipeline.bubble_formula(p, m), 2 / 7)


@pytest.mark.parametrize("schedule", list(pipeline.SCHEDULES))
@pytest.mark.parametrize("num_stages, num_microbatches", [(2, 2), (2, 8), (4, 6), (3, 1)])
def test_each_schedule_replayed_with_equal_passes_has_the_formulas_bubble(schedule, num_stages, num_microbatches):
    orders = [pipeline.SCHEDULES[schedule](s, num_stages, num_microbatches) for s in range(num_stages)]
    spans = pipeline.replay_schedule(orders, [[1.0] * len(order) for order in orders])
    assert math.isclose(pipeline.bubble_fraction(spans), pipeline.bubble_formula(num_stages, num_microbatches))


def test_a_schedule_that_would_hang_is_refused():
    # stage 0 wants micro-batch 0's backward before it has run any forward: stage 1 never gets an input.
    orders = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]
    with pytest.raises(ValueError, match="forever"):
        pipeline.replay_schedule(orders, [[1.0, 1.0], [1.0, 1.0]])


def test_the_schedules_run_on_gloo_equal_one_process_and_keep_what_they_should():
    configs = [("GPipe", 3), ("1F1B", 3)]
    stages = launch(pipeline.run_pipeline, (configs, 2, 16, 32, 4))
    for index, (schedule, m) in enumerate(configs):
        for stage, runs in enumerate(stages):
            run = runs[index]
            assert run.gradient_gap < TOLERANCE
            in_flight = m if schedule == "GPipe" else min(2 - stage, m)
            assert run.activation_peak == in_flight * run.microbatch_activations
            assert len(run.spans) == 2 and all(len(spans) == 2 * m for spans in run.spans)
            assert 0 < pipeline.bubble_fraction([r[index].spans[0] for r in stages]) < 1


def test_torch_schedules_gpipe_1f1b_and_interleaved_run_on_gloo_and_equal_one_process():
    results = launch(pipeline.run_torch_schedule)
    for process in results:
        for schedule in pipeline.TORCH_SCHEDULES:
            assert process[schedule]["gradient_gap"] < TOLERANCE
    assert results[1]["ScheduleInterleaved1F1B"]["stages"] == [1, 3]
    assert results[0]["ScheduleGPipe"]["loss"] is None and results[1]["ScheduleGPipe"]["loss"] > 0


# ---------------------------------------------------------------- meshes


@pytest.mark.parametrize("layout", list(meshes.LAYOUTS))
def test_each_layout_trains_what_one_process_trains(mesh_runs, layout):
    for process in mesh_runs:
        assert process[layout].forward_gap < TOLERANCE and process[layout].gradient_gap < TOLERANCE


def test_fsdp_by_tp_holds_a_quarter_of_the_split_layers_and_talks_on_each_dimension(mesh_runs):
    run = mesh_runs[0]["FSDP x TP"]
    assert run.held["weights"] < run.one_process["weights"] / 3
    assert set(run.traffic) == {"dp", "tp"}
    assert set(run.traffic["tp"]) == {"all_reduce"} and set(run.traffic["dp"]) == {"all_gather", "reduce_scatter"}


def test_hsdp_shards_inside_a_row_and_all_reduces_across_rows(mesh_runs):
    run = mesh_runs[0]["HSDP"]
    assert run.held["weights"] == run.one_process["weights"] // 2
    assert set(run.traffic["shard"]) == {"all_gather", "reduce_scatter"}
    assert set(run.traffic["replicate"]) == {"all_reduce"}
    assert run.traffic["replicate"]["all_reduce"] == run.held["gradients"]  # the shard's gradients, once


def test_accelerate_parallelism_config_builds_the_mesh_and_refuses_a_cpu_run():
    results = launch(meshes.accelerate_parallelism_config, num_processes=4)
    assert [r["coordinate"] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert results[0]["mesh_dims"] == ("dp_shard", "tp") and "dp" in results[0]["flattened"]
    assert "MULTI_CPU" in results[0]["refusal"]
