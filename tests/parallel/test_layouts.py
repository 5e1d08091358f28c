"""Specification of course_utils.layouts: a layout names how processes divide a model (lesson 7).

That the real runs and the planner lay a model out alike is held, by the
structure of what they make, in tests/memory/test_planner_sharding.py; that
nothing else calls fully_shard or DDP, in tests/architecture.
"""

import pytest
import torch

from course_utils import layouts


def test_a_layout_reads_the_planner_s_arguments_fsdp_as_zero3_and_ddp_on_one_process_as_one_process():
    assert layouts.Layout.of("fsdp", 2) == layouts.Layout("zero3", 2)
    assert layouts.Layout.of("ddp", 1) == layouts.Layout("none", 1) == layouts.Layout("none")
    assert layouts.Layout.of("zero1", 3) == layouts.Layout("zero1", 3)


@pytest.mark.parametrize("strategy, in_ddp, fsdp, reshards", [
    ("none", False, False, False),
    ("ddp", True, False, False),
    ("zero1", True, False, False),
    ("zero2", False, True, False),
    ("zero3", False, True, True),
])
def test_each_strategy_says_how_it_wraps_the_model(strategy, in_ddp, fsdp, reshards):
    layout = layouts.Layout(strategy, 1 if strategy == "none" else 2)
    assert (layout.wraps_in_ddp, layout.shards_with_fsdp, layout.reshard_after_forward) == (in_ddp, fsdp, reshards)


def test_a_layout_is_a_value_a_cache_can_key_on():
    assert len({layouts.Layout("zero3", 8), layouts.Layout("zero3", 8), layouts.Layout("zero3", 64)}) == 2
    with pytest.raises(AttributeError):
        layouts.Layout("zero3", 8).world_size = 4


def test_one_process_leaves_the_model_and_the_optimizer_as_they_are():
    model = torch.nn.Linear(2, 2)
    assert layouts.apply_layout(model, layouts.Layout("none")) is model
    optimizer = layouts.layout_optimizer(layouts.Layout("none"), model.parameters(), torch.optim.AdamW, lr=0.1)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["lr"] == 0.1


def test_the_one_list_of_blocks_is_what_fsdp_shards_one_unit_at_a_time():
    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    model = torch.nn.Sequential(torch.nn.Embedding(4, 2))
    model.blocks = blocks
    model.empty = torch.nn.ModuleList()
    assert layouts.block_lists(model) == [blocks]


def test_tensor_parallelism_leaves_world_size_over_tp_data_parallel_processes():
    assert layouts.Layout("none", 2, tp=2).dp == 1
    assert layouts.Layout("ddp", 8, tp=2).dp == 4
    assert layouts.Layout("zero3", 8).dp == 8
    # The layouts before tensor parallelism are unchanged.
    assert layouts.Layout("zero3", 8) == layouts.Layout("zero3", 8, tp=1, sequence_parallel=False)


@pytest.mark.parametrize("arguments, error, words", [
    (dict(strategy="none", world_size=6, tp=4), ValueError, "tp must divide world_size"),
    (dict(strategy="ddp", world_size=2, tp=2), ValueError, "world_size // tp >= 2"),
    (dict(strategy="none", world_size=4, tp=2), ValueError, "2 data-parallel copies"),
    (dict(strategy="none", world_size=1, sequence_parallel=True), ValueError, "tp >= 2"),
    (dict(strategy="none", world_size=2, tp=2, sequence_parallel="yes"), TypeError, "sequence_parallel"),
    (dict(strategy="none", world_size=2, tp=0), ValueError, "tp"),
])
def test_a_tensor_parallel_layout_that_does_not_divide_is_refused_by_argument(arguments, error, words):
    with pytest.raises(error, match=words):
        layouts.Layout(**arguments)


def _llama(layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2))


def test_the_plan_of_a_llama_is_its_config_s_under_the_base_model_s_name():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = _llama()
    plan = layouts.tensor_parallel_plan(model)
    assert plan.keys() == {f"model.{key}" for key in model.config.base_model_tp_plan}
    assert {type(style) for key, style in plan.items() if key.endswith(("o_proj", "down_proj"))} == {RowwiseParallel}
    assert {type(style) for key, style in plan.items() if key.endswith(("q_proj", "up_proj"))} == {ColwiseParallel}
    # A base model's own plan has no prefix.
    assert layouts.tensor_parallel_plan(model.model).keys() == set(model.config.base_model_tp_plan)


def test_sequence_parallelism_adds_the_norms_the_gathers_and_the_first_and_last_token_moves():
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    plan = layouts.tensor_parallel_plan(_llama(), sequence_parallel=True)
    assert {key for key, style in plan.items() if isinstance(style, SequenceParallel)} == {
        "model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm"}
    assert {"model.layers.*.self_attn", "model.layers.*.mlp"} <= plan.keys()
    assert isinstance(plan["model.layers.0"], PrepareModuleInput) and isinstance(plan["model.norm"], PrepareModuleInput)


def test_a_model_without_a_plan_or_with_styles_the_course_does_not_apply_is_refused_by_name():
    with pytest.raises(ValueError, match="Linear has no tensor-parallel plan"):
        layouts.tensor_parallel_plan(torch.nn.Linear(2, 2))
    model = _llama()
    model.config.base_model_tp_plan = {"layers.*.mlp.gate_proj": "packed_colwise"}
    with pytest.raises(ValueError, match="packed_colwise"):
        layouts.tensor_parallel_plan(model)


def test_a_plan_needs_tensor_parallel_processes():
    with pytest.raises(ValueError, match="tp=1"):
        layouts.apply_layout(torch.nn.Linear(2, 2), layouts.Layout("none"), plan={})


def test_the_data_parallel_degree_is_what_the_model_parallel_degrees_leave_of_the_processes():
    assert layouts.Layout("zero3", 8).dp == 8
    assert layouts.Layout("none", 4, cp=4).dp == 1
    assert layouts.Layout("ddp", 8, cp=2).dp == 4
    # Expert parallelism divides the data-parallel x context processes, as torchtitan's does.
    assert layouts.Layout("ddp", 8, cp=2, ep=8).dp == 4
    assert (layouts.Layout("zero3", 8).cp, layouts.Layout("zero3", 8).ep) == (1, 1)


@pytest.mark.parametrize("arguments, words", [
    (dict(strategy="none", world_size=4, cp=3), "cp must divide world_size=4"),
    (dict(strategy="ddp", world_size=4, ep=3), "ep must divide the 4"),
    (dict(strategy="zero3", world_size=2, cp=2), "world_size // cp >= 2"),
    (dict(strategy="none", world_size=4, cp=2), "2 data-parallel copies"),
])
def test_a_layout_whose_degrees_do_not_divide_its_processes_is_refused_by_name(arguments, words):
    with pytest.raises(ValueError, match=words):
        layouts.Layout(**arguments)
