"""The planner per process (lesson 7): memory.estimate_training_memory(world_size=, sharding=) against real gloo runs."""

import sys

import pytest

from course_utils import launcher, memory, sharding

BATCH_SIZE, SEQ_LEN = 3, 32


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_plan_of_process_0_equals_its_real_two_process_run_to_the_byte(strategy):
    plan = memory.estimate_training_memory(sharding._loaded_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                           world_size=2, sharding=strategy)
    real = launcher.launch(sharding.measure_planned_step, (strategy, BATCH_SIZE, SEQ_LEN), num_processes=2,
                           quiet=True, oversubscribe=True)
    assert plan == real[0]
    assert plan.peak_by_phase == real[0].peak_by_phase


def test_fsdp_is_zero3_and_sharding_divides_the_state():
    model = sharding._loaded_model()
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    zero3 = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="zero3")
    fsdp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="fsdp")
    assert zero3 == fsdp
    assert one.optimizer_state / 2 <= zero3.optimizer_state <= one.optimizer_state / 2 * 1.01
    assert zero3.activations == one.activations


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        (dict(world_size=0), ValueError, "world_size"),
        (dict(world_size=2, sharding="zero4"), ValueError, "sharding"),
        (dict(world_size=1, sharding="zero3"), ValueError, "world_size >= 2"),
        (dict(world_size=2, sharding="ddp"), memory.PlannerRefused, "not followed"),
        (dict(world_size=4, sharding="zero1"), memory.PlannerRefused, "ZeroRedundancyOptimizer"),
    ],
)
def test_bad_or_unfollowed_set_ups_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(sharding._loaded_model(), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)
