"""The planner under context parallelism (lesson 9): estimate_training_memory(layout=Layout("none", cp, cp=cp)) against real gloo runs."""

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from balanced_moe import balanced_moe
from course_utils import launcher, layouts, memory, sharding
from course_utils.memory import context_parallel, per_process
from course_utils.optimizers import make_optimizer

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN = 2, 32


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def llama_config(layers):
    """A Llama with grouped-query attention (7 blocks: followed through the probes)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def tiny_llama(layers, dtype=torch.float32, checkpointing=False):
    """The model sharding.measure_laid_out_step builds, drawn from seed 0."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(llama_config(layers), dtype=dtype)
    if checkpointing:
        model.activation_checkpointing_enable()
    return model


@pytest.mark.parametrize("cp, layers, accumulation, dtype, checkpointing", [
    (2, 7, 1, torch.float32, False),  # probed and extrapolated
    (2, 7, 2, torch.float32, False),
    (4, 2, 1, torch.float32, False),  # followed whole
    (2, 2, 1, torch.bfloat16, False),  # built in bf16: the ring in bf16 (autocast is refused)
    (2, 2, 1, torch.float32, True),  # each block's forward pass, ring included, run again in the backward pass
], ids=["probed", "accumulating", "four-processes", "bf16-storage", "checkpointing"])
def test_the_plan_of_every_process_equals_its_real_run_to_the_byte(cp, layers, accumulation, dtype, checkpointing):
    layout = layouts.Layout("none", cp, cp=cp)
    plans = [memory.estimate_training_memory(tiny_llama(layers, dtype, checkpointing), "adamw", BATCH_SIZE, SEQ_LEN, layout=layout,
                                             rank=rank, gradient_accumulation_steps=accumulation)
             for rank in range(cp)]
    real = launcher.launch(sharding.measure_laid_out_step,
                           (AutoModelForCausalLM, llama_config(layers), layout, BATCH_SIZE, SEQ_LEN, "adamw", "no",
                            accumulation, dtype, checkpointing), num_processes=cp, quiet=True, oversubscribe=True,
                           timeout=300)
    assert plans == real
    assert [plan.peak_by_phase for plan in plans] == [process.peak_by_phase for process in real]


def test_context_parallelism_divides_the_activations_and_keeps_the_whole_model_on_every_process():
    model = tiny_llama(2)
    one = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN)
    split = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, layout=layouts.Layout("none", 2, cp=2))
    assert (split.weights, split.gradients, split.optimizer_state) == (one.weights, one.gradients, one.optimizer_state)
    # Half the tokens: less than the one-process activations, more than half of them (the ring keeps its
    # log-sum-exp, and grouped-query keys and values are repeated to every head).
    assert one.activations / 2 < split.activations < one.activations


def test_a_process_of_a_layout_is_planned_in_its_own_fake_group_on_its_part_of_the_batch():
    process = context_parallel.ContextProcess(layouts.Layout("none", 2, cp=2), 1)
    model = tiny_llama(1)
    import torch.distributed as dist

    with process.laid_out(model):
        assert (dist.get_rank(), dist.get_world_size()) == (1, 2)
        assert model.config._attn_implementation == "course_ring_attention"
    assert not dist.is_initialized()
    part = process.batch_of(memory.training_batch(model, 1, 8))
    assert part["position_ids"].tolist() == [[4, 5, 6, 7]]
    # A different process of the same model is a different cache key.
    assert process != context_parallel.ContextProcess(layouts.Layout("none", 2, cp=2), 0)


@pytest.mark.parametrize("keywords, error, words", [
    (dict(layout=layouts.Layout("none", 2, cp=2), world_size=2), ValueError, "layout replaces world_size"),
    (dict(layout=layouts.Layout("none", 2, cp=2), rank=2), ValueError, "rank"),
    (dict(layout="cp"), TypeError, "layout"),
])
def test_bad_layouts_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(tiny_llama(1), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)


def test_a_sequence_that_does_not_divide_and_a_model_that_is_not_causal_are_refused():
    with pytest.raises(ValueError, match="seq_len must be divisible"):
        memory.estimate_training_memory(tiny_llama(1), "adamw", BATCH_SIZE, 31, layout=layouts.Layout("none", 2, cp=2))
    with pytest.raises(memory.PlannerRefused, match="causal language model"):
        memory.estimate_training_memory(sharding.course_model(), "adamw", BATCH_SIZE, SEQ_LEN,
                                        layout=layouts.Layout("none", 2, cp=2))
    with pytest.raises(memory.PlannerRefused, match="autocast"):
        memory.estimate_training_memory(tiny_llama(1), "adamw", BATCH_SIZE, SEQ_LEN, mixed_precision="bf16",
                                        layout=layouts.Layout("none", 2, cp=2))
    assert not per_process.records_timelines(layouts.Layout("none", 2, cp=2))


def _measured_expert_parallel_step(layers):
    import torch.distributed as dist

    with sharding.gloo_group():
        layout = layouts.Layout("none", 2, cp=2, ep=2)
        model = layouts.apply_layout(balanced_moe(layers), layout)
        batch = layouts.context_batch(memory.training_batch(model, BATCH_SIZE, SEQ_LEN), layout, dist.get_rank())
        optimizer = make_optimizer("adamw", list(model.parameters()), lr=1e-3)
        return memory.measure_training_step_peak(model, optimizer, batch)


@pytest.mark.parametrize("layers", [2, 7], ids=["whole", "probed"])
def test_the_expert_parallel_plan_under_a_balanced_routing_equals_a_real_run_routed_so_to_the_byte(layers):
    layout = layouts.Layout("none", 2, cp=2, ep=2)
    plans = [memory.estimate_training_memory(balanced_moe(layers), "adamw", BATCH_SIZE, SEQ_LEN, layout=layout,
                                             rank=rank) for rank in range(2)]
    real = launcher.launch(_measured_expert_parallel_step, (layers,), num_processes=2, quiet=True,
                           oversubscribe=True, timeout=300)
    assert plans == real
    assert [plan.peak_by_phase for plan in plans] == [process.peak_by_phase for process in real]
    # Each process holds, steps and keeps the state of half of the experts.
    context_only = memory.estimate_training_memory(balanced_moe(layers), "adamw", BATCH_SIZE, SEQ_LEN,
                                                   layout=layouts.Layout("none", 2, cp=2))
    experts = sum(p.numel() * 4 for name, p in balanced_moe(layers).named_parameters() if ".experts." in name)
    assert context_only.weights - plans[0].weights == experts // 2
    assert context_only.gradients - plans[0].gradients == experts // 2


def test_expert_parallelism_is_refused_for_a_model_without_experts_and_for_pairs_that_do_not_divide():
    with pytest.raises(memory.PlannerRefused, match="base_model_ep_plan"):
        memory.estimate_training_memory(tiny_llama(1), "adamw", BATCH_SIZE, SEQ_LEN,
                                        layout=layouts.Layout("none", 2, cp=2, ep=2))
    forward = context_parallel.balanced_forward(lambda *inputs: inputs, 2)
    with pytest.raises(memory.PlannerRefused, match="evenly over ep=2"):
        forward(torch.ones(3, 4), torch.ones(3, 1, dtype=torch.long), torch.ones(3, 1))
    with context_parallel.BalancedRouting(6):
        assert torch.ones(2, dtype=torch.long).sum().item() == 6  # the answer the stated routing gives a value read
