"""Bad input to the public functions of lesson 7's offload, checkpoint, meta-init and communication-time modules is
refused at once, naming the argument (the same rule as test_bad_input.py, in a file of its own)."""

from __future__ import annotations

import pytest
import torch

from course_utils import comm_time, meta_init, offload, sharded_checkpoints, sharding
from course_utils.exercises.limits import time_limit

HANG_SECONDS = 30


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


def _adamw():
    return torch.optim.AdamW(_linear().parameters())


# (what is called, the call, the exception expected, a fragment of its message)
ROWS = [
    # meta_init
    ("shard_bytes world_size=0", lambda: meta_init.shard_bytes((4, 2), 4, 0, 0), ValueError, "world_size"),
    ("shard_bytes rank=2 of 2", lambda: meta_init.shard_bytes((4, 2), 4, 2, 2), ValueError, "rank"),
    ("shard_bytes shape=(-1,)", lambda: meta_init.shard_bytes((-1,), 4, 2, 0), ValueError, "shape"),
    ("shard_bytes element_size=0", lambda: meta_init.shard_bytes((4,), 0, 2, 0), ValueError, "element_size"),
    ("planned_parameter_bytes model='m'", lambda: meta_init.planned_parameter_bytes("m", 2), TypeError, "model"),
    ("full_copies_per_node ranks_per_node=0", lambda: meta_init.full_copies_per_node(10, 4, 0), ValueError,
     "ranks_per_node"),
    ("full_copies_per_node bytes_per_parameter=2.5", lambda: meta_init.full_copies_per_node(10, 2.5, 8), ValueError,
     "bytes_per_parameter"),
    ("build_sharded_on_meta config={}", lambda: meta_init.build_sharded_on_meta({}, None), TypeError, "config"),
    ("build_sharded_on_meta mesh=None",
     lambda: meta_init.build_sharded_on_meta(sharding.course_model().config, None), TypeError, "mesh"),
    # sharding: the ZeRO-3 model and the steps the offload and checkpoint runs share
    ("zero3_course_model outside a launch", lambda: sharding.zero3_course_model(), RuntimeError, "gloo_group"),
    ("train_steps model='m'", lambda: sharding.train_steps("m", _adamw(), []), TypeError, "model"),
    ("train_steps optimizer='adamw'", lambda: sharding.train_steps(_linear(), "adamw", []), TypeError, "optimizer"),
    ("train_steps outside a launch", lambda: sharding.train_steps(_linear(), _adamw(), []), RuntimeError, "gloo_group"),
    ("whole_parameters model=None", lambda: sharding.whole_parameters(None), TypeError, "model"),
    # offload
    ("planned_offload_bytes world_size=0",
     lambda: offload.planned_offload_bytes(sharding.course_model(), 0), ValueError, "world_size"),
    ("planned_offload_bytes rank=-1",
     lambda: offload.planned_offload_bytes(sharding.course_model(), 2, -1), ValueError, "rank"),
    ("planned_offload_bytes reshard_after_forward='yes'",
     lambda: offload.planned_offload_bytes(sharding.course_model(), 2, 0, "yes"), TypeError, "reshard_after_forward"),
    ("planned_offload_bytes model=None", lambda: offload.planned_offload_bytes(None, 2), TypeError, "model"),
    ("train_with_offload steps=0", lambda: offload.train_with_offload(0), ValueError, "steps"),
    ("train_with_offload outside a launch", lambda: offload.train_with_offload(), RuntimeError, "gloo_group"),
    # sharded_checkpoints
    ("save_sharded model=None", lambda: sharded_checkpoints.save_sharded(None, _adamw(), "x"), TypeError, "model"),
    ("save_sharded optimizer=None", lambda: sharded_checkpoints.save_sharded(_linear(), None, "x"), TypeError,
     "optimizer"),
    ("save_sharded directory=3", lambda: sharded_checkpoints.save_sharded(_linear(), _adamw(), 3), TypeError,
     "directory"),
    ("load_sharded no checkpoint", lambda: sharded_checkpoints.load_sharded(_linear(), None, "/nonexistent-l7"),
     FileNotFoundError, "directory"),
    ("load_sharded optimizer='adamw'", lambda: sharded_checkpoints.load_sharded(_linear(), "adamw", "x"), TypeError,
     "optimizer"),
    ("save_full_safetensors path=None", lambda: sharded_checkpoints.save_full_safetensors(_linear(), None), TypeError,
     "path"),
    ("checkpoint_files missing", lambda: sharded_checkpoints.checkpoint_files("/nonexistent-l7"), FileNotFoundError,
     "directory"),
    ("train_and_save steps_before=3 of 3", lambda: sharded_checkpoints.train_and_save("a", "b", 3, 3), ValueError,
     "steps_before"),
    ("train_and_save outside a launch", lambda: sharded_checkpoints.train_and_save("a", "b"), RuntimeError,
     "gloo_group"),
    ("resume_from total_steps=0", lambda: sharded_checkpoints.resume_from("a", 1, 0), ValueError, "total_steps"),
    ("resume_from directory=None", lambda: sharded_checkpoints.resume_from(None), TypeError, "directory"),
    # comm_time
    ("wire_bytes collective='gather'", lambda: comm_time.wire_bytes("gather", 10, 2), ValueError, "collective"),
    ("wire_bytes payload=-1", lambda: comm_time.wire_bytes("all_reduce", -1, 2), ValueError, "payload"),
    ("wire_bytes world_size=0", lambda: comm_time.wire_bytes("all_reduce", 10, 0), ValueError, "world_size"),
    ("seconds_on link='wifi'", lambda: comm_time.seconds_on("wifi", 10), ValueError, "link"),
    ("seconds_on num_bytes=nan",
     lambda: comm_time.seconds_on("PCIe Gen5 x16, GPU to host", float("nan")), ValueError, "num_bytes"),
    ("compute_seconds_at_peak tokens=0",
     lambda: comm_time.compute_seconds_at_peak(1e9, 0, "H100 SXM, bf16 dense"), ValueError, "tokens"),
    ("compute_seconds_at_peak peak='A100'", lambda: comm_time.compute_seconds_at_peak(1e9, 10, "A100"), ValueError,
     "peak"),
    ("scaled_step_wire_bytes counted={'send': 1}",
     lambda: comm_time.scaled_step_wire_bytes({"send": 1}, 2, 1.0, 8), ValueError, "counted"),
    ("scaled_step_wire_bytes scale=0", lambda: comm_time.scaled_step_wire_bytes({}, 2, 0, 8), ValueError, "scale"),
    # the public names sharding gained for these modules
    ("course_batches steps=0", lambda: sharding.course_batches(0, 6), ValueError, "steps"),
    ("share_of_batch rank=2 of 2", lambda: sharding.share_of_batch({}, 2, 2), ValueError, "rank"),
]


@pytest.mark.parametrize(("label", "call", "error", "fragment"), ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_is_refused_naming_the_argument(label, call, error, fragment):
    with time_limit(HANG_SECONDS), pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value), f"{label}: {type(raised.value).__name__}: {raised.value}"
