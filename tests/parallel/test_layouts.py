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
    (dict(strategy="zero3", world_size=2, cp=2), "pass strategy='none'"),
    (dict(strategy="none", world_size=4, cp=2), "none is one process"),
])
def test_a_layout_whose_degrees_do_not_divide_its_processes_is_refused_by_name(arguments, words):
    with pytest.raises(ValueError, match=words):
        layouts.Layout(**arguments)
