"""Offload, sharded checkpoints, meta-device building and communication time, run on CPU processes over gloo."""

import os
import sys

import pytest
import torch

from course_utils import comm_time, launcher, meta_init, offload, parallel, sharded_checkpoints, sharding

pytestmark = pytest.mark.forks


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def offload_then_save(directory, path):
    with sharding.gloo_group():
        return offload.train_with_offload(), sharded_checkpoints.train_and_save(directory, path)


def resume(directory):
    with sharding.gloo_group():
        return sharded_checkpoints.resume_from(directory)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("lesson7")
    directory, path = scratch / "checkpoint", scratch / "model.safetensors"
    two = launcher.launch(offload_then_save, (directory, path), num_processes=2, quiet=True, timeout=120,
                          oversubscribe=True)
    three = launcher.launch(resume, (directory,), num_processes=3, quiet=True, timeout=120, oversubscribe=True)
    one = launcher.launch(sharding.train_one_process, num_processes=1, quiet=True, timeout=120)[0]
    return two, three, one, directory, path


def test_offload_copies_exactly_the_planned_bytes_and_moves_none_on_a_cpu(launched):
    two, *_ = launched
    for rank, (run, _) in enumerate(two):
        assert run["counted"] == offload.planned_offload_bytes(sharding.course_model(), 2, rank)
        assert run["moved"] == 0 and run["devices"] == ["cpu"]


def test_a_checkpoint_saved_on_two_processes_loads_exactly_on_three_and_resumes(launched):
    two, three, one, directory, _ = launched
    saved = two[0][1]["saved_parameters"]
    assert all(torch.equal(three[0]["loaded_parameters"][name], tensor) for name, tensor in saved.items())
    gap = parallel.max_parameter_difference(one["final_parameters"], three[0]["final_parameters"],
                                            skip=parallel.NOISE_ONLY_PARAMETERS)
    stateless = parallel.max_parameter_difference(one["final_parameters"], three[0]["final_without_optimizer_state"],
                                                  skip=parallel.NOISE_ONLY_PARAMETERS)
    assert gap <= 1e-5 < stateless
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(sharded_checkpoints.checkpoint_files(directory))


def test_the_safetensors_file_loads_into_one_process_model(launched):
    from safetensors.torch import load_file

    two, _, _, _, path = launched
    model = sharding.fresh_course_model()
    model.load_state_dict(load_file(path))
    assert all(torch.equal(p, two[0][1]["saved_parameters"][n]) for n, p in model.named_parameters())
    assert os.path.getsize(path) == two[0][1]["safetensors_bytes"]


def test_built_on_meta_each_process_holds_its_planned_shards_and_never_the_whole_model(launched):
    _, three, *_ = launched
    whole = 4 * sum(p.numel() for p in sharding.course_model().parameters())
    largest = max(p.numel() * 4 for p in sharding.course_model().parameters())
    for result in three:
        assert result["held_parameters"] == result["planned_parameters"]
        assert result["planned_parameters"] <= result["build_rise"] <= result["planned_parameters"] + largest < whole
        assert result["whole_first_rise"] >= whole


def test_shards_pad_the_first_dimension_to_a_multiple_of_the_processes():
    assert meta_init.shard_bytes((10, 2), 4, 3, 0) == (4 * 2 * 4, 4 * 2 * 4)
    assert meta_init.shard_bytes((10, 2), 4, 3, 2) == (4 * 2 * 4, 2 * 2 * 4)
    assert meta_init.shard_bytes((2,), 4, 3, 2) == (4, 0)


def test_ring_factors_follow_the_nccl_tests():
    assert comm_time.wire_bytes("all_reduce", 100, 4) == 150
    assert comm_time.wire_bytes("reduce_scatter_single", 100, 4) == 75
    assert comm_time.wire_bytes("all_gather_single", 25, 4) == 75
    ddp = comm_time.scaled_step_wire_bytes({"all_reduce": 100}, 2, 1.0, 8)
    zero2 = comm_time.scaled_step_wire_bytes({"reduce_scatter_single": 100, "all_gather_single": 50}, 2, 1.0, 8)
    assert ddp == pytest.approx(zero2)
    assert comm_time.seconds_on("PCIe Gen5 x16, GPU to host", 64e9) == 1.0
