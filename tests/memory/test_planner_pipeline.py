"""The planner per process under pipeline parallelism (lesson 9): estimate_training_memory(layout=Layout(pp=...)) against real gloo stages."""

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import launcher, layouts, memory, pipeline
from course_utils.memory import pipeline_stages

# It launches worker processes: make test runs the `forks` tests in a pytest process of their own (the Makefile says why).
pytestmark = pytest.mark.forks

BATCH_SIZE, SEQ_LEN, MICROBATCHES = 8, 16, 4
TINY_LLAMA = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)


@pytest.fixture(autouse=True)
def launchable(monkeypatch):
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)


def tiny_llama(layers: int = 4):
    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY_LLAMA.to_dict(), "num_hidden_layers": layers})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def pipeline_of_two(schedule: str, microbatches: int = MICROBATCHES) -> layouts.Layout:
    return layouts.Layout("none", 2, pp=2, schedule=schedule, microbatches=microbatches)


def plans(model, layout, batch_size=BATCH_SIZE):
    return [memory.estimate_training_memory(model, "adamw", batch_size, SEQ_LEN, layout=layout, rank=rank)
            for rank in range(layout.pp)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_plan_equals_its_real_gloo_stage_to_the_byte(schedule):
    """Every part and every phase's peak, on both stages: weights, gradients, state, activations at the worst moment."""
    layout = pipeline_of_two(schedule)
    planned = plans(tiny_llama(), layout)
    real = launcher.launch(pipeline.measure_stage_memory, (TINY_LLAMA, layout, BATCH_SIZE, SEQ_LEN),
                           num_processes=2, quiet=True, oversubscribe=True, timeout=300)
    assert planned == real
    assert [plan.peak_by_phase for plan in planned] == [stage.peak_by_phase for stage in real]


def _vote_after_a_step(schedule):
    """In a launched worker: this stage's answer to the schedule's vote on how it learns its shapes, after one step."""
    from course_utils.sharding import gloo_group

    layout = pipeline_of_two(schedule)
    model = tiny_llama()
    setup = memory.TrainingSetup("adamw", BATCH_SIZE, SEQ_LEN)
    with gloo_group():
        rank = torch.distributed.get_rank()
        stage = layouts.pipeline_stage(model, layout, rank)
        runner = layouts.pipeline_schedule(stage, layout, rank, pipeline_stages.causal_lm_loss(model),
                                           *pipeline_stages.micro_batch_shapes(stage, layout, rank, setup,
                                                                                torch.float32))
        optimizer = torch.optim.AdamW(stage.parameters())
        batch = memory.training_batch(model, BATCH_SIZE, SEQ_LEN)
        pipeline_stages.stage_step(runner, optimizer, batch, layout, rank)
        return runner._stage._inference_mode.value


def test_a_stage_told_its_shapes_votes_static_on_gloo_as_the_planner_takes_it():
    """The planner skips the vote (its fake group's receives read nothing) and takes "static": the gloo vote's answer."""
    assert launcher.launch(_vote_after_a_step, ("1f1b",), num_processes=2, quiet=True, oversubscribe=True,
                           timeout=300) == ["static", "static"]


def test_gpipe_holds_every_micro_batch_and_1f1b_only_as_many_as_the_stages_after_it():
    """Activations at the worst moment, as micro-batches (2 sequences each) are added to the step.

    GPipe runs every forward pass before the first backward: each micro-batch
    adds its saved activations. 1F1B keeps pp - stage in flight (torch's
    warm-up) whatever the micro-batches, once there are more than stages: each
    adds only its buffer, one micro-batch of hidden states (the first stage: the
    output its send still holds; the last: the receive buffer it keeps per
    micro-batch, and its loss, a 4-byte scalar the schedule keeps).
    """
    model = tiny_llama()
    rows = 2
    hidden = rows * SEQ_LEN * TINY_LLAMA.hidden_size * 4
    held = {schedule: [plans(model, pipeline_of_two(schedule, m), rows * m) for m in (3, 4, 5)]
            for schedule in ("gpipe", "1f1b")}
    for stage, buffer in ((0, hidden), (1, hidden + 4)):
        gpipe = [plan[stage].activations for plan in held["gpipe"]]
        one_f_one_b = [plan[stage].activations for plan in held["1f1b"]]
        assert gpipe[2] - gpipe[1] == gpipe[1] - gpipe[0] > 10 * buffer
        assert one_f_one_b[2] - one_f_one_b[1] == one_f_one_b[1] - one_f_one_b[0] == buffer
    # Everything else a stage holds is the same under both.
    for g, f in zip(held["gpipe"][1], held["1f1b"][1]):
        assert (g.weights, g.gradients, g.optimizer_state) == (f.weights, f.gradients, f.optimizer_state)
        assert g.peak > f.peak


@pytest.mark.parametrize("schedule, optimizer, rank", [("gpipe", "adamw", 0), ("1f1b", "sgd", 1)])
def test_a_stage_probe_without_its_warm_up_step_equals_one_with_it_to_the_byte(schedule, optimizer, rank):
    setup = memory.TrainingSetup(optimizer, BATCH_SIZE, SEQ_LEN)
    layout = pipeline_of_two(schedule)
    fast, _ = pipeline_stages.stage_probe(tiny_llama(), setup, layout, rank, None)
    slow, _ = pipeline_stages.stage_probe(tiny_llama(), setup, layout, rank, None, warm_up_step=True)
    assert fast == slow
    assert fast.peak_by_phase == slow.peak_by_phase


def test_a_deep_stage_extrapolated_from_probes_equals_the_stage_followed_whole():
    """16 blocks on 2 stages: 8 a stage, planned from copies with 1, 2 and 3 of them."""
    model, layout = tiny_llama(16), pipeline_of_two("gpipe")
    setup = memory.TrainingSetup("adamw", BATCH_SIZE, SEQ_LEN)
    assert pipeline_stages.stage_block_count(model, layout, 1) == 8
    planned = memory.estimate_training_memory(model, "adamw", BATCH_SIZE, SEQ_LEN, layout=layout, rank=1)
    whole, _ = pipeline_stages.stage_probe(model, setup, layout, 1, None)
    assert planned == whole
    assert planned.peak_by_phase == whole.peak_by_phase


def test_a_deep_middle_stage_is_planned_from_three_copies_one_block_deeper_and_equals_it_followed_whole():
    """24 blocks on 3 stages: the middle one holds 9, planned from copies with 2, 3 and 4 (its 1-block copy peaks off the line)."""
    model, layout = tiny_llama(24), layouts.Layout("none", 3, pp=3, schedule="1f1b", microbatches=3)
    setup = memory.TrainingSetup("adamw", 6, SEQ_LEN)
    assert pipeline_stages.stage_block_count(model, layout, 1) == 9
    copies = []
    with memory.reporting_progress(lambda done, total: copies.append(done)):
        planned = memory.estimate_training_memory(model, "adamw", 6, SEQ_LEN, layout=layout, rank=1)
    whole, _ = pipeline_stages.stage_probe(model, setup, layout, 1, None)
    assert copies == [1, 2, 3]
    assert planned == whole
    assert planned.peak_by_phase == whole.peak_by_phase


def test_stages_hold_the_blocks_torchtitan_gives_them():
    """torchtitan's division: the embeddings and the head count as a block each, the remainder to the first stages."""
    assert layouts.stage_blocks(4, 2) == [range(0, 2), range(2, 4)]
    assert [len(r) for r in layouts.stage_blocks(27, 4)] == [7, 7, 7, 6]
    assert [len(r) for r in layouts.stage_blocks(80, 8)] == [10, 11, 10, 10, 10, 10, 10, 9]
    model, layout = tiny_llama(), pipeline_of_two("gpipe")
    first, last = (layouts.pipeline_stage(model, layout, stage) for stage in (0, 1))
    assert first.embed_tokens is model.model.embed_tokens and first.lm_head is None
    assert last.lm_head is model.lm_head and last.norm is model.model.norm and last.embed_tokens is None
    assert [id(block) for block in [*first.layers, *last.layers]] == [id(block) for block in model.model.layers]


def test_the_stages_compute_the_whole_model():
    """Stage 0's output fed to stage 1 gives the model's own logits."""
    model, layout = tiny_llama(), pipeline_of_two("gpipe")
    ids = torch.randint(0, TINY_LLAMA.vocab_size, (2, SEQ_LEN))
    first, last = (layouts.pipeline_stage(model, layout, stage) for stage in (0, 1))
    with torch.no_grad():
        assert torch.equal(last(first(ids)), model(input_ids=ids).logits)


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        (dict(layout=layouts.Layout("none", 2, pp=2, microbatches=3)), ValueError, "batch_size must be divisible"),
        (dict(layout=layouts.Layout("ddp", 4, pp=2, microbatches=4)), memory.PlannerRefused, "dp=2"),
        (dict(layout=pipeline_of_two("gpipe"), world_size=2), ValueError, "layout replaces world_size"),
        (dict(layout=pipeline_of_two("gpipe"), rank=2), ValueError, "rank"),
        (dict(layout=pipeline_of_two("gpipe"), mixed_precision="bf16"), memory.PlannerRefused, "fp32"),
    ],
)
def test_pipeline_set_ups_the_planner_does_not_follow_are_named(keywords, error, words):
    with pytest.raises(error, match=words):
        memory.estimate_training_memory(tiny_llama(), "adamw", BATCH_SIZE, SEQ_LEN, **keywords)
