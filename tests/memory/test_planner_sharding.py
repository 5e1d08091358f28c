"""The planner per process (lesson 7): memory.estimate_training_memory(world_size=, sharding=) against real gloo runs."""

import sys

import pytest

from course_utils import launcher, memory, sharding

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN = 3, 32


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3"])
def test_plan_of_process_0_equals_its_real_two_process_run_to_the_byte(strategy):
    plan = memory.estimate_training_memory(sharding._loaded_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                           world_size=2, sharding=strategy)
    real = launcher.launch(sharding.measure_planned_step, (strategy, BATCH_SIZE, SEQ_LEN), num_processes=2,
                           quiet=True, oversubscribe=True)
    # Every part to the byte; under FSDP a real peak can hold one gathered unit more (gloo's timing).
    slack = sharding.largest_unit_bytes(sharding._loaded_model(), 2) if strategy in ("zero2", "zero3") else 0
    assert sharding.agrees_with_plan(plan, real[0], slack), (plan, real[0], slack)


def test_fsdp_is_zero3_and_sharding_divides_the_state():
    model = sharding._loaded_model()
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    zero3 = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="zero3")
    fsdp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="fsdp")
    assert zero3 == fsdp
    assert one.optimizer_state / 2 <= zero3.optimizer_state <= one.optimizer_state / 2 * 1.01
    # torch's FSDPMemTracker (the sharded step's) counts a view of the batch's labels as memory the step
    # allocated; the course's StepTracker does not (the allocator allocates nothing for a view).
    labels = memory.training_batch(model, BATCH_SIZE, SEQ_LEN)["labels"]
    assert zero3.activations == one.activations + labels.nbytes


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        (dict(world_size=0), ValueError, "world_size"),
        (dict(world_size=2, sharding="zero4"), ValueError, "sharding"),
        (dict(world_size=1, sharding="zero3"), ValueError, "world_size >= 2"),
        (dict(world_size=2, sharding="none"), ValueError, "one process"),
        (dict(world_size=4, sharding="zero1"), memory.PlannerRefused, "ZeroRedundancyOptimizer"),
    ],
)
def test_bad_or_unfollowed_set_ups_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(sharding._loaded_model(), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)


def test_ddp_is_one_process_plus_buckets_as_large_as_the_trainable_gradients():
    model = sharding._loaded_model()
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    ddp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=3, sharding="ddp")
    buckets = 4 * sum(p.numel() for p in model.parameters())
    assert ddp.peak == one.peak + buckets and ddp.activations == one.activations + buckets
    assert (ddp.weights, ddp.gradients, ddp.optimizer_state) == (one.weights, one.gradients, one.optimizer_state)
    assert ddp.peak_by_phase == {phase: peak + buckets for phase, peak in one.peak_by_phase.items()}


def _frozen_embeddings(model):
    for parameter in model.distilbert.embeddings.parameters():
        parameter.requires_grad_(False)
    return model


def _ddp_step_with_frozen_embeddings(accumulation, mixed_precision):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from course_utils.memory import training_memory
    from course_utils.optimizers import make_optimizer

    dist.init_process_group("gloo")
    try:
        model = DistributedDataParallel(_frozen_embeddings(sharding._model()))
        optimizer = make_optimizer("sgd", [p for p in model.parameters() if p.requires_grad], momentum=0.9)
        batch = training_memory.training_batch(sharding._loaded_model(), 2, 16)
        return training_memory.measure_training_step_peak(model, optimizer, batch, mixed_precision=mixed_precision,
                                                          gradient_accumulation_steps=accumulation)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("accumulation, mixed_precision", [(2, "no"), (1, "bf16")])
def test_ddp_plan_of_a_frozen_model_accumulating_or_in_bf16_equals_its_real_run(accumulation, mixed_precision):
    import copy

    model = _frozen_embeddings(copy.deepcopy(sharding._loaded_model()))
    plan = memory.estimate_training_memory(model, "sgd", 2, 16, momentum=0.9, world_size=2, sharding="ddp",
                                           mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation)
    real = launcher.launch(_ddp_step_with_frozen_embeddings, (accumulation, mixed_precision), num_processes=2,
                           quiet=True, oversubscribe=True)
    assert plan == real[0]
    assert plan.peak_by_phase == real[0].peak_by_phase


def test_a_measurement_agrees_with_a_plan_only_part_for_part_and_with_its_peaks_within_the_slack():
    from course_utils.memory import TrainingMemory

    def held(peak, activations=10, phase_peak=None):
        return TrainingMemory(weights=4, gradients=4, optimizer_state=8, activations=activations, peak=peak,
                              phase_of_peak="backward", peak_by_phase={"backward": phase_peak or peak})

    plan = held(100)
    assert sharding.agrees_with_plan(plan, held(100))
    assert not sharding.agrees_with_plan(plan, held(101))
    assert sharding.agrees_with_plan(plan, held(150), slack=50)
    assert not sharding.agrees_with_plan(plan, held(151), slack=50)
    assert not sharding.agrees_with_plan(plan, held(99), slack=50)  # below the plan: the plan missed nothing, but is wrong
    assert not sharding.agrees_with_plan(plan, held(100, activations=11), slack=50)
    assert not sharding.agrees_with_plan(plan, held(100, phase_peak=200), slack=50)
