"""Specification of course_utils.memory.step_timeline: the planner's step, operation by operation (lesson 4).

The timeline is the planner's own record (its peak is the planner's peak);
for a deep model, copies with fewer blocks extended to the full depth give
exactly, point for point, the timeline of the whole model; and it shows what
lesson 4 says it shows: checkpointing flattens the forward ramp, 8-bit
AdamW's CPU temporaries sit in the optimizer step.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, BertModel, GPT2Config

from course_utils import memory
from course_utils.memory import DRAWN_PARTS, plan_step_timeline

pytestmark = pytest.mark.slow

VOCAB = 300


def gpt2_lm(layers, checkpointing=False):
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=2, bos_token_id=0, eos_token_id=0,
                        loss_type="ForCausalLM", use_cache=False)
    model = AutoModelForCausalLM.from_config(config)
    if checkpointing:
        model.activation_checkpointing_enable()
    return model


def bert_base(layers):
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                num_attention_heads=2))


@pytest.mark.parametrize("build, optimizer, steps", [
    (lambda: gpt2_lm(layers=7, checkpointing=True), "adamw", 2),
    # BERT's shallowest copies behave differently (its first block): the checks must find that.
    (lambda: bert_base(layers=7), "sgd", 1),
], ids=["gpt2-checkpointing-accumulation-2", "bert"])
def test_a_deep_model_s_extrapolated_timeline_is_the_whole_model_s_point_for_point(build, optimizer, steps):
    torch.manual_seed(0)
    model = build()
    timeline = plan_step_timeline(model, optimizer, 2, 16, gradient_accumulation_steps=steps)
    whole = plan_step_timeline(model, optimizer, 2, 16, gradient_accumulation_steps=steps, whole=True)
    assert timeline.extrapolated and not whole.extrapolated and (timeline.blocks, timeline.blocks_drawn) == (7, 7)
    assert timeline.phases == whole.phases and timeline.operations == whole.operations
    assert np.array_equal(timeline.held, whole.held)


def test_the_timeline_is_the_planner_s_step_and_is_cached():
    torch.manual_seed(0)
    model = gpt2_lm(layers=2)
    planned = memory.estimate_training_memory(model, "adamw", 2, 16, gradient_accumulation_steps=2)
    timeline = plan_step_timeline(model, "adamw", 2, 16, gradient_accumulation_steps=2)
    assert timeline.peak == planned.peak
    assert timeline.phases[timeline.peak_index].split(" ")[0] == planned.phase_of_peak.split(" ")[0]
    parts = dict(zip(DRAWN_PARTS, timeline.held.T))
    assert set(parts["weights"]) == {planned.weights}
    assert parts["optimizer state"].max() == planned.optimizer_state
    last_backward = max(i for i, phase in enumerate(timeline.phases) if phase == "backward 2")
    assert parts["gradients"][last_backward] == planned.gradients  # the sum being added in is one more, for a moment
    phases = sorted(set(timeline.phases), key=timeline.phases.index)
    assert phases == ["forward 1", "backward 1", "forward 2", "backward 2", "optimizer step", "zero_grad"]
    assert plan_step_timeline(model, "adamw", 2, 16, gradient_accumulation_steps=2) is timeline


def test_checkpointing_flattens_the_forward_ramp():
    ramps = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        timeline = plan_step_timeline(gpt2_lm(layers=4, checkpointing=checkpointing), "sgd", 4, 32)
        forward = np.array([phase == "forward 1" for phase in timeline.phases])
        ramps[checkpointing] = timeline.held[forward, DRAWN_PARTS.index("activations")].max()
    assert ramps[True] < ramps[False] / 2


def test_8bit_adamw_s_cpu_temporaries_sit_in_the_optimizer_step():
    torch.manual_seed(0)
    timeline = plan_step_timeline(gpt2_lm(layers=2), "adamw8bit", 1, 8)
    temporaries = timeline.held[:, DRAWN_PARTS.index("temporaries")]
    assert timeline.phases[int(np.argmax(temporaries))] == "optimizer step"
    # bitsandbytes' CPU update holds fp32 working copies of a parameter's states: more than its 1-byte states.
    largest = max(p.numel() for p in gpt2_lm(layers=2).parameters())
    assert temporaries.max() >= 4 * largest


def test_refused_like_the_planner():
    with pytest.raises(ValueError, match="optimizer"):
        plan_step_timeline(gpt2_lm(layers=1), "nope", 2, 16)
    with pytest.raises(ValueError, match="batch_size"):
        plan_step_timeline(gpt2_lm(layers=1), "adamw", 0, 16)
    with pytest.raises(TypeError, match="whole"):
        plan_step_timeline(gpt2_lm(layers=1), "adamw", 2, 16, whole="yes")


def test_the_planner_s_peak_is_the_whole_fake_step_s_highest_point_on_gpt2():
    from course_utils import models

    model = models.fine_tuning_architectures()["GPT-2 with its LM head"]
    planned = memory.estimate_training_memory(model, "adamw", 4, 128, mixed_precision="bf16")
    whole = plan_step_timeline(model, "adamw", 4, 128, mixed_precision="bf16", whole=True)
    assert planned.peak == whole.peak
