"""course_utils.levers and plots.levers: planned beside measured, lever combinations on meta-device models, lesson 5's figures."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import levers, memory, models
from course_utils.plots import levers as lever_plots
from course_utils.units import GB, MIB

SMALL_LLAMA = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4)


def test_the_planned_peak_of_a_course_model_step_is_within_2_percent_of_the_measured_one():
    model = models.load_pretrained_classifier()
    before = [p.detach().clone() for p in model.parameters()]
    check = levers.plan_and_measure(model, memory.TrainingSetup("adamw", 8, 32))
    assert check.planned is not None and check.gap < 0.02
    # AdamW: two moments shaped like each trained parameter, and a 4-byte step counter per parameter tensor
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    assert check.measured.optimizer_state == 2 * check.measured.gradients + 4 * tensors
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before)), "the measurement trains a copy"


def test_a_frozen_encoder_has_gradients_and_state_for_the_head_only():
    model = models.load_pretrained_classifier()
    for parameter in model.distilbert.parameters():
        parameter.requires_grad_(False)
    check = levers.plan_and_measure(model, memory.TrainingSetup("adamw", 8, 32))
    head_bytes = 4 * models.count_parameters(model, trainable_only=True)
    assert check.measured.gradients == head_bytes and check.measured.optimizer_state >= 2 * head_bytes


def test_memory_table_shows_both_peaks_and_the_gap_and_names_a_refusal():
    check = levers.plan_and_measure(models.load_pretrained_classifier(), memory.TrainingSetup("adamw", 4, 16))
    refused = levers.MemoryCheck(planned=None, measured=check.measured, refusal="it cannot")
    table = levers.memory_table({"planned": check, "refused one": refused})
    assert f"{check.measured.peak / MIB:,.2f}" in table and "%" in table
    assert "refused (below)" in table and "*refused one*: the planner refused: it cannot" in table


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mixed_precision": "fp16"}, "mixed_precision must be one of"),
        ({"train": "encoder"}, "train must be one of"),
        ({"micro_batch_size": 0}, "micro_batch_size must be a positive int"),
        ({"activation_checkpointing": "yes"}, "activation_checkpointing must be True or False"),
    ],
)
def test_levers_name_a_bad_field(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        levers.Levers(**options)


def test_levers_effective_batch_and_description():
    levers_ = levers.Levers(bf16_weights=True, activation_checkpointing=True, train="lora", micro_batch_size=4,
                             gradient_accumulation_steps=8)
    assert levers_.effective_batch_size == 32
    assert levers_.describe() == "bf16 weights, checkpointing, LoRA, 4 x 8"


def test_build_with_levers_applies_each_lever_on_the_meta_device():
    head_only = levers.build_with_levers(AutoModelForCausalLM, SMALL_LLAMA, levers.Levers(train="head"))
    trainable = {name for name, p in head_only.named_parameters() if p.requires_grad}
    assert trainable == {"lm_head.weight"} and next(head_only.parameters()).device.type == "meta"
    lora = levers.build_with_levers(AutoModelForCausalLM, SMALL_LLAMA, levers.Levers(
        train="lora", bf16_weights=True, activation_checkpointing=True))
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert lora.get_base_model().is_activation_checkpointing and lora.get_base_model().config.use_cache is False
    assert next(lora.get_base_model().model.embed_tokens.parameters()).dtype == torch.bfloat16


def test_plan_with_levers_shrinks_the_peak_lever_by_lever():
    plain = levers.plan_with_levers(AutoModelForCausalLM, SMALL_LLAMA, levers.Levers(micro_batch_size=4), 64)
    checkpointed = levers.plan_with_levers(
        AutoModelForCausalLM, SMALL_LLAMA, levers.Levers(micro_batch_size=4, activation_checkpointing=True), 64)
    assert checkpointed.activations < plain.activations
    assert "fits" in levers.describe_fit(plain, plain.peak) and "does NOT fit" in levers.describe_fit(plain, plain.peak - 1)


def test_lesson_5_figures_carry_titles_and_labelled_axes():
    figures = [
        lever_plots.plot_vanishing_updates([2.0**-10, 2.0**-6], {"float32": [1.0, 1.0], "bfloat16": [0.0, 1.0]},
                                             threshold=1 / 256),
        lever_plots.plot_gradient_norms([0.5, 2.0, 0.8], max_grad_norm=1.0),
        lever_plots.plot_memory_against_parameters({"a": [(1e9, 10 * GB), (7e9, 60 * GB)]}, budget=24 * GB),
        lever_plots.plot_scores_over_seeds({"full": {0: 0.7, 1: 0.66}, "LoRA": {0: 0.65, 1: 0.6}}, baseline=0.577,
                                             highlight=0),
    ]
    for figure in figures:
        ax = figure.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert ax.get_legend() is not None


def test_four_micro_batches_peak_like_two_planned_and_measured():
    model = models.load_pretrained_classifier()
    two, four = (levers.plan_and_measure(model, memory.TrainingSetup("adamw", 8, 32, gradient_accumulation_steps=k)) for k in (2, 4))
    assert two.measured.peak == four.measured.peak and two.planned.peak == four.planned.peak
    one = levers.plan_and_measure(model, memory.TrainingSetup("adamw", 8, 32))
    assert two.measured.peak > one.measured.peak  # the gradients held across micro-batches


def test_scores_over_seeds_draws_one_point_per_seed_and_refuses_empty_input():
    figure = lever_plots.plot_scores_over_seeds({"full": {0: 0.7, 1: 0.66, 2: 0.68}, "LoRA": {0: 0.65}})
    ax = figure.axes[0]
    from matplotlib.collections import PathCollection

    points = [collection.get_offsets() for collection in ax.collections if isinstance(collection, PathCollection)]
    assert sorted(len(p) for p in points) == [1, 3]
    assert "GiB" not in ax.get_ylabel()
    with pytest.raises(ValueError, match="scores must be"):
        lever_plots.plot_scores_over_seeds({})


def test_fine_tuning_variants_train_what_they_say():
    from course_utils import fine_tuning_variants, models

    counts = {name: models.count_parameters(fine_tuning_variants.make_variant(name, models.load_pretrained_classifier()),
                                            trainable_only=True) for name in fine_tuning_variants.VARIANTS}
    full, frozen, lora = counts.values()
    assert frozen < lora < full
    with pytest.raises(ValueError, match="name must be one of"):
        fine_tuning_variants.make_variant("LoRA", models.load_pretrained_classifier())
