"""The planner per process (lesson 7): memory.estimate_training_memory(world_size=, sharding=) against real gloo runs."""

import sys

import pytest

from course_utils import launcher, layouts, memory, sharding
from course_utils.memory import per_process

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN = 3, 32


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3"])
def test_plan_of_process_0_equals_its_real_two_process_run_to_the_byte(strategy):
    plan = memory.estimate_training_memory(sharding.course_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                           world_size=2, sharding=strategy)
    real = launcher.launch(sharding.measure_planned_step, (strategy, BATCH_SIZE, SEQ_LEN), num_processes=2,
                           quiet=True, oversubscribe=True)
    # Every part to the byte; under FSDP a real peak can hold one gathered unit more (gloo's timing).
    slack = sharding.largest_unit_bytes(sharding.course_model(), 2) if strategy in ("zero2", "zero3") else 0
    assert sharding.agrees_with_plan(plan, real[0], slack), (plan, real[0], slack)


def test_plan_under_bf16_autocast_equals_the_real_zero3_run_with_its_weight_casts():
    """Autocast's bf16 casts of the gathered weights live until the backward pass: planned, and measured so."""
    plan = memory.estimate_training_memory(sharding.course_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                           world_size=2, sharding="zero3", mixed_precision="bf16")
    real = launcher.launch(sharding.measure_planned_step, ("zero3", BATCH_SIZE, SEQ_LEN, "adamw", "bf16"),
                           num_processes=2, quiet=True, oversubscribe=True)
    assert sharding.agrees_with_plan(plan, real[0], sharding.largest_unit_bytes(sharding.course_model(), 2))


@pytest.mark.parametrize("strategy, world_size, rank, accumulation, mixed_precision", [
    ("zero3", 3, 2, 1, "no"),  # the last process: padded shards
    ("zero2", 2, 0, 2, "no"),
    ("zero3", 2, 1, 1, "bf16"),
])
def test_an_fsdp_probe_without_its_warm_up_step_equals_one_with_it_to_the_byte(strategy, world_size, rank, accumulation,
                                                                              mixed_precision):
    step = memory.TrainingSetup("adamw", 2, 16, mixed_precision, accumulation)
    fast = per_process.fsdp_probe(sharding.course_model(), step, None, world_size, strategy, rank)
    slow = per_process.fsdp_probe(sharding.course_model(), step, None, world_size, strategy, rank, warm_up_step=True)
    assert fast == slow
    assert fast[0].peak_by_phase == slow[0].peak_by_phase


def _laid_out(model):
    """What laying ``model`` out made of it: its modules' classes, its FSDP units, its parameters as this process holds them."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    modules = tuple((name, type(module).__name__) for name, module in model.named_modules())
    units = []
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group  # torch 2.13's FSDP2 internals
            # A unit that frees its parameters after the forward pass has a mesh to reshard them to.
            units.append((name, group.post_forward_mesh_info is not None, group.mesh_info.mesh.size()))
    parameters = tuple(
        (name, type(p).__name__, p.requires_grad, str(p.dtype),
         tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape),
         str(p.placements) if isinstance(p, DTensor) else "")
        for name, p in model.named_parameters())
    return modules, tuple(units), parameters


def _laid_out_for_real(strategy):
    with sharding.gloo_group():
        model, _, _ = sharding.wrap_for_strategy(sharding.fresh_course_model(), strategy, None)
        return _laid_out(model)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_the_planner_lays_the_model_out_exactly_as_the_real_run_does(strategy):
    """One function lays a model out (layouts.apply_layout): the planner's fake copy and the launched run's model agree."""
    real = launcher.launch(_laid_out_for_real, (strategy,), num_processes=2, quiet=True, oversubscribe=True,
                           timeout=300)
    for rank in (0, 1):
        with per_process.sharded_fake_copy(sharding.course_model(), layouts.Layout(strategy, 2), rank) as (copy, _):
            planned = _laid_out(copy)
        assert planned == real[rank]
    modules, units, parameters = real[0]
    assert len(units) == len(sharding.sharded_blocks(sharding.course_model())) + 1  # each block, then the root
    assert {frees for _, frees, _ in units} == {strategy == "zero3"}
    assert all(kind == "DTensor" for _, kind, *_ in parameters)


def test_fsdp_is_zero3_and_sharding_divides_the_state():
    model = sharding.course_model()
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    zero3 = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="zero3")
    fsdp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=2, sharding="fsdp")
    assert zero3 == fsdp
    assert one.optimizer_state / 2 <= zero3.optimizer_state <= one.optimizer_state / 2 * 1.01
    # The same activations as one process: neither tracker counts a view of the batch (its labels).
    assert zero3.activations == one.activations


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        (dict(world_size=0), ValueError, "world_size"),
        (dict(world_size=2, sharding="zero4"), ValueError, "sharding"),
        (dict(world_size=1, sharding="zero3"), ValueError, "world_size >= 2"),
        (dict(world_size=2, sharding="none"), ValueError, "one process"),
        (dict(world_size=3, sharding="zero1", rank=3), ValueError, "rank must be an int from 0 to 2"),
        (dict(world_size=2, sharding="zero1", rank=-1), ValueError, "rank"),
    ],
)
def test_bad_or_unfollowed_set_ups_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(sharding.course_model(), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)


@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_plan_of_every_process_equals_its_real_run_to_the_byte(world_size):
    plans = [memory.estimate_training_memory(sharding.course_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                             world_size=world_size, sharding="zero1", rank=rank)
             for rank in range(world_size)]
    real = launcher.launch(sharding.measure_planned_step, ("zero1", BATCH_SIZE, SEQ_LEN), num_processes=world_size,
                           quiet=True, oversubscribe=True, timeout=300)
    assert plans == real
    assert [plan.peak_by_phase for plan in plans] == [process.peak_by_phase for process in real]


def test_zero1_divides_the_optimizer_state_between_processes_and_keeps_the_rest_of_ddp():
    model = sharding.course_model()
    ddp = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=3, sharding="ddp")
    zero1 = [memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, world_size=3, sharding="zero1",
                                             rank=rank) for rank in range(3)]
    # Each tensor's state is held by exactly one process; the processes hold different tensors.
    assert sum(plan.optimizer_state for plan in zero1) == ddp.optimizer_state
    assert len({plan.optimizer_state for plan in zero1}) == 3
    for plan in zero1:
        assert (plan.weights, plan.gradients, plan.activations) == (ddp.weights, ddp.gradients, ddp.activations)
        # The passes hold this process's state instead of all of it.
        assert plan.peak_by_phase["forward"] == ddp.peak_by_phase["forward"] - ddp.optimizer_state + plan.optimizer_state


def _tiny_llama():
    """A Llama of 7 blocks (followed through probes), grouped-query attention, its embeddings frozen."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=7,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def _zero1_llama_step(accumulation):
    from torch.nn.parallel import DistributedDataParallel

    with sharding.gloo_group():
        model = DistributedDataParallel(_tiny_llama())
        optimizer = memory.zero1_optimizer([p for p in model.parameters() if p.requires_grad], "adam", foreach=True)
        batch = memory.training_batch(_tiny_llama(), 2, 16)
        step = memory.TrainingSetup("adam", 2, 16, gradient_accumulation_steps=accumulation, options={"foreach": True})
        return memory.measure_zero1_step(model, optimizer, batch, step)


def test_zero1_plan_of_a_frozen_llama_accumulating_equals_every_real_process_on_three():
    plans = [memory.estimate_training_memory(_tiny_llama(), "adam", 2, 16, foreach=True, gradient_accumulation_steps=2,
                                             world_size=3, sharding="zero1", rank=rank) for rank in range(3)]
    real = launcher.launch(_zero1_llama_step, (2,), num_processes=3, quiet=True, oversubscribe=True, timeout=300)
    assert plans == real
    assert [plan.peak_by_phase for plan in plans] == [process.peak_by_phase for process in real]


def test_ddp_is_one_process_plus_buckets_as_large_as_the_trainable_gradients():
    model = sharding.course_model()
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
    from torch.nn.parallel import DistributedDataParallel

    from course_utils.memory import training_memory
    from course_utils.optimizers import make_optimizer

    # sharding.gloo_group, not a bare init/destroy: freeing the group when DDP's reducer goes can deadlock
    # with gloo's threads (torch 2.13; its docstring says how), and this test hung that way once.
    with sharding.gloo_group():
        model = DistributedDataParallel(_frozen_embeddings(sharding.fresh_course_model()))
        optimizer = make_optimizer("sgd", [p for p in model.parameters() if p.requires_grad], momentum=0.9)
        batch = training_memory.training_batch(sharding.course_model(), 2, 16)
        return training_memory.measure_training_step_peak(model, optimizer, batch, mixed_precision=mixed_precision,
                                                          gradient_accumulation_steps=accumulation)


@pytest.mark.parametrize("accumulation, mixed_precision", [(2, "no"), (1, "bf16")])
def test_ddp_plan_of_a_frozen_model_accumulating_or_in_bf16_equals_its_real_run(accumulation, mixed_precision):
    import copy

    model = _frozen_embeddings(copy.deepcopy(sharding.course_model()))
    plan = memory.estimate_training_memory(model, "sgd", 2, 16, momentum=0.9, world_size=2, sharding="ddp",
                                           mixed_precision=mixed_precision, gradient_accumulation_steps=accumulation)
    real = launcher.launch(_ddp_step_with_frozen_embeddings, (accumulation, mixed_precision), num_processes=2,
                           quiet=True, oversubscribe=True, timeout=300)
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
