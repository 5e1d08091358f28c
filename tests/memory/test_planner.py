"""Specification of course_utils.memory.planner and its machinery, course_utils.memory.fake_step and probes (lesson 4).

Four promises: the planner's number is the number a real measured step gives
(here on tiny models, so the real step is cheap; benchmarks/bench_memory.py
checks a larger held-out grid); the forward and backward passes and the
optimizer step followed apart and added up, each from its cache, are exactly
the whole step followed on fake tensors with no shortcut; extrapolating from
1, 2 and 3 blocks gives exactly what that full fake run of the whole depth
gives; and what it cannot follow is refused with the reason.
"""

import warnings

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    DistilBertConfig,
    GPT2Config,
    LlamaConfig,
)

from course_utils import memory
from course_utils.memory import fake_step, planner
from course_utils.memory import probes as probing

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow

VOCAB = 300


def distilbert(layers=4, dtype=torch.float32, vocab_size=VOCAB, **extra):
    config = DistilBertConfig(vocab_size=vocab_size, dim=32, hidden_dim=80, n_layers=layers, n_heads=2, **extra)
    return AutoModelForSequenceClassification.from_config(config, dtype=dtype)


def gpt2_lm(layers=4, dtype=torch.float32):
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=2, bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def llama(layers=4, dtype=torch.float32):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def bert_base(layers=4):
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                num_attention_heads=2))


def lora(model):
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def checkpointed(model):
    model.activation_checkpointing_enable()
    return model


def frozen_base(model):
    model.base_model.requires_grad_(False)
    return model


def measure(model, optimizer, batch_size, seq_len, mixed_precision="no", steps=1, **options):
    trainable = [p for p in model.parameters() if p.requires_grad]
    real_optimizer = memory.make_optimizer(optimizer, trainable, **options)
    batch = memory.training_batch(model, batch_size, seq_len, generator=torch.Generator().manual_seed(0))
    return memory.measure_training_step_peak(
        model, real_optimizer, batch, mixed_precision=mixed_precision, gradient_accumulation_steps=steps
    )


# (name, build, optimizer, options, batch_size, seq_len, mixed_precision, accumulation steps)
SETUPS = [
    ("distilbert-checkpointing", lambda: checkpointed(distilbert()), "adamw", {}, 2, 32, "no", 1),
    ("distilbert-frozen-encoder", lambda: frozen_base(distilbert()), "adamw", {}, 2, 16, "no", 1),
    ("distilbert-accumulation", distilbert, "sgd", {"momentum": 0.9}, 2, 16, "no", 2),
    ("gpt2-lm-bf16-autocast", gpt2_lm, "adamw", {"foreach": True}, 2, 16, "bf16", 1),
    ("llama-gqa-pure-bf16", lambda: llama(dtype=torch.bfloat16), "adamw", {}, 1, 32, "no", 1),
    ("llama-gqa-adafactor", llama, "adafactor", {}, 2, 16, "no", 1),
    ("bert-base-torch-adafactor", lambda: bert_base(layers=2), "torch_adafactor", {}, 2, 16, "no", 1),
    # A 16k-element embedding: bitsandbytes' fp32 working copies of it make the optimizer step the peak.
    ("llama-gqa-lora", lambda: lora(llama(layers=2)), "adamw", {}, 2, 16, "no", 1),
    ("gpt2-lm-rmsprop-momentum", lambda: gpt2_lm(layers=2), "rmsprop", {"momentum": 0.9}, 2, 16, "no", 1),
    ("distilbert-adamw8bit", lambda: distilbert(layers=2, vocab_size=512), "adamw8bit", {}, 1, 8, "no", 1),
]


@pytest.mark.parametrize("setup", SETUPS, ids=[s[0] for s in SETUPS])
def test_the_planner_gives_the_peak_a_real_step_measures(setup):
    name, build, optimizer, options, batch_size, seq_len, mixed_precision, steps = setup
    torch.manual_seed(0)
    model = build()
    planned = memory.estimate_training_memory(
        model, optimizer, batch_size, seq_len, mixed_precision=mixed_precision, gradient_accumulation_steps=steps,
        **options,
    )
    measured = measure(model, optimizer, batch_size, seq_len, mixed_precision, steps, **options)
    assert abs(planned.peak - measured.peak) <= 0.02 * measured.peak, (planned, measured)
    assert (planned.weights, planned.gradients, planned.optimizer_state) == (
        measured.weights, measured.gradients, measured.optimizer_state,
    )
    assert planned.phase_of_peak == measured.phase_of_peak


def step_of(optimizer, options, batch_size, seq_len, mixed_precision="no", steps=1):
    return memory.TrainingSetup(optimizer, batch_size, seq_len, mixed_precision, steps, options)


# Passes and optimizer step followed apart and added up, against the whole step followed on fake
# tensors with no shortcut (the real warm-up, every micro-batch): the same bytes, phase by phase.
COMPOSED = [
    ("distilbert-adamw", lambda: distilbert(layers=2), step_of("adamw", {}, 2, 16)),
    ("distilbert-checkpointing-foreach", lambda: checkpointed(distilbert(layers=2)),
     step_of("adamw", {"foreach": True}, 2, 16)),
    ("distilbert-fused-accumulation-3", lambda: distilbert(layers=2), step_of("adamw", {"fused": True}, 2, 16, "no", 3)),
    ("gpt2-lm-autocast-sgd-accumulation-2", lambda: gpt2_lm(layers=2),
     step_of("sgd", {"momentum": 0.9}, 2, 16, "bf16", 2)),
    ("llama-gqa-pure-bf16-adafactor", lambda: llama(layers=2, dtype=torch.bfloat16), step_of("adafactor", {}, 1, 32)),
    # The pooler gets no gradient: the real warm-up gives it no optimizer state.
    ("bert-base-torch-adafactor", lambda: bert_base(layers=2), step_of("torch_adafactor", {}, 2, 16)),
    ("llama-gqa-lora-accumulation-2", lambda: lora(llama(layers=2)), step_of("adamw", {}, 2, 16, "no", 2)),
    ("distilbert-frozen-encoder-adamw8bit", lambda: frozen_base(distilbert(layers=2, vocab_size=512)),
     step_of("adamw8bit", {}, 1, 8)),
    ("distilbert-adamw8bit", lambda: distilbert(layers=2, vocab_size=512), step_of("adamw8bit", {}, 1, 8)),
]


@pytest.mark.parametrize("case", COMPOSED, ids=[c[0] for c in COMPOSED])
def test_passes_and_optimizer_step_added_up_are_exactly_the_full_fake_step(case):
    name, build, step = case
    torch.manual_seed(0)
    model = build()
    composed, micro_batch_peaks = fake_step.planned_probe(model, step, layers=None)
    full = fake_step.full_fake_step(model, step)
    assert composed == full
    assert dict(composed.peak_by_phase) == dict(full.peak_by_phase)
    assert len(micro_batch_peaks) == step.gradient_accumulation_steps


def test_a_changed_optimizer_reuses_the_passes_and_a_changed_batch_reuses_the_optimizer_step():
    with torch.device("meta"):
        model = gpt2_lm(layers=2)
    adamw, sgd = step_of("adamw", {}, 2, 12), step_of("sgd", {"momentum": 0.9}, 2, 12)
    passes = fake_step.passes(model, adamw, None)
    assert fake_step.passes(model, sgd, None) is passes
    phase = fake_step.optimizer_phase(model, adamw, None, passes.gets_gradient)
    longer = fake_step.passes(model, step_of("adamw", {}, 2, 20), None)
    assert longer is not passes
    assert fake_step.optimizer_phase(model, step_of("adamw", {}, 2, 20), None, longer.gets_gradient) is phase
    assert fake_step.planned_probe(model, sgd, None)[0] == fake_step.full_fake_step(model, sgd)


def test_micro_batches_that_stopped_at_a_repeat_serve_more_accumulation_steps_exactly():
    model = distilbert(layers=2)
    two, eight = step_of("adamw", {}, 2, 16, "no", 2), step_of("adamw", {}, 2, 16, "no", 8)
    ran = fake_step.passes(model, two, None)
    assert ran.repeated and len(ran.micro_batch_peaks) == 2
    assert fake_step.passes(model, eight, None) is ran
    assert fake_step.planned_probe(model, eight, None)[0] == fake_step.full_fake_step(model, eight)


EXTRAPOLATED = [
    ("distilbert", lambda: distilbert(layers=5), "adamw", {}, "no"),
    ("gpt2-lm-autocast", lambda: gpt2_lm(layers=4), "sgd", {"momentum": 0.9}, "bf16"),
    ("llama-gqa-bf16-checkpointing", lambda: checkpointed(llama(layers=4, dtype=torch.bfloat16)), "adamw",
     {"foreach": True}, "no"),
]


@pytest.mark.parametrize("case", EXTRAPOLATED, ids=[c[0] for c in EXTRAPOLATED])
def test_extrapolating_from_one_two_and_three_blocks_is_exactly_the_full_fake_run(case):
    name, build, optimizer, options, mixed_precision = case
    with torch.device("meta"):
        model = build()
    step = step_of(optimizer, options, 2, 24, mixed_precision)
    layers, layer_list = probing.repeated_layers(model)
    assert layer_list is not None and layers > max(probing.PROBE_LAYERS)
    probes = [fake_step.planned_probe(model, step, layers=k)[0] for k in probing.PROBE_LAYERS]
    extrapolated = probing.extrapolate(probes, layers)
    full = fake_step.full_fake_step(model, step)
    assert extrapolated == full
    assert dict(extrapolated.peak_by_phase) == dict(full.peak_by_phase)


def _switching_probe(blocks: int) -> tuple:
    """A made-up copy with ``blocks`` blocks whose backward peaks inside a block while shallow, by its head when deep.

    Bytes held after each operation: the head's gradient grows 30 B per block
    (every block's activations are still held), a block's moments 10 B per block.
    """
    import numpy as np

    forward = [100] + [100 + 10 * (i + 1) for i in range(blocks)] + [105 + 10 * blocks]
    backward = [200 + 30 * blocks] + [300 + 10 * blocks - 5 * p for p in range(blocks)] + [250 + 10 * blocks]
    timeline = (("forward 1", ["embed"] + ["block"] * blocks + ["head"], np.array(forward)),
                ("backward 1", ["head grad"] + ["block grad"] * blocks + ["embed grad"], np.array(backward)))
    state = 1000 + 7 * blocks  # held through the passes, not in their timeline
    peaks = {"forward": max(forward) + state, "backward": max(backward) + state, "optimizer step": 0}
    memory_ = memory.TrainingMemory(weights=blocks, gradients=blocks, optimizer_state=state, activations=blocks,
                                    peak=max(peaks.values()), phase_of_peak=max(peaks, key=peaks.get),
                                    peak_by_phase=peaks)
    return memory_, [(peaks["forward"], peaks["backward"])], timeline


def test_a_pass_whose_highest_moment_moves_as_blocks_are_added_is_extrapolated_moment_by_moment():
    """As GPT-2's backward (bf16, 4 x 128), whose peak moves from inside a block to the head's softmax gradient."""
    # Copies with 2, 3 and 4 blocks: a block's operations line up with the one before it (deepening.deepen).
    memories, peaks, timelines = zip(*(_switching_probe(k) for k in (2, 3, 4)))
    deep = _switching_probe(12)[0]
    # Each pass's peak alone grows linearly over 2-4 blocks, and misses the head's moment.
    assert probing.extrapolate(list(memories), 12, 2, list(peaks)).peak_by_phase["backward"] == 420 + 1084
    extrapolated = probing.extrapolate(list(memories), 12, 2, list(peaks), list(timelines))
    assert dict(extrapolated.peak_by_phase) == dict(deep.peak_by_phase)
    assert extrapolated.peak_by_phase["backward"] == 200 + 30 * 12 + 1000 + 7 * 12


def test_when_one_block_peaks_elsewhere_two_three_and_four_blocks_extrapolate_exactly():
    """distilbert-base-cased at 8 x 128: with one block the backward pass peaks as the embeddings'
    gradients arrive, with two or more in the first block's backward (about 10 s)."""
    from course_utils import models

    model = models.build_distilbert_base_cased()
    step = step_of("adamw", {}, 8, 128)
    probes = [fake_step.planned_probe(model, step, layers=k)[0] for k in (1, 2, 3, 4)]
    assert probing.extrapolate(probes[:3], 6) is None
    full = fake_step.full_fake_step(model, step)
    assert probing.extrapolate(probes[1:], 6, first=2) == full
    assert memory.estimate_training_memory(model, "adamw", 8, 128) == full


def test_blocks_that_differ_are_run_whole_not_extrapolated():
    model = llama(layers=5)
    model.model.layers[:2].requires_grad_(False)
    assert probing.repeated_layers(model)[1] is None
    planned = memory.estimate_training_memory(model, "adamw", 2, 16)
    assert planned.peak == measure(model, "adamw", 2, 16).peak


def test_a_meta_model_is_planned_as_its_real_twin_and_left_as_it_was():
    torch.manual_seed(0)
    real = distilbert()
    with torch.device("meta"):
        meta = distilbert()
    meta.distilbert.embeddings.requires_grad_(False)
    real.distilbert.embeddings.requires_grad_(False)
    assert memory.estimate_training_memory(meta, "adamw", 2, 16) == memory.estimate_training_memory(
        real, "adamw", 2, 16
    )
    assert all(p.device.type == "meta" for p in meta.parameters())
    assert not meta.distilbert.embeddings.word_embeddings.weight.requires_grad


def test_a_repeated_estimate_comes_from_the_cache_and_a_changed_one_does_not():
    with torch.device("meta"):
        model = distilbert()
    first = memory.estimate_training_memory(model, "adamw", 2, 16)
    assert memory.estimate_training_memory(model, "adamw", 2, 16) is first
    assert memory.estimate_training_memory(model, "adamw", 2, 16, foreach=True) is not first
    model.activation_checkpointing_enable()
    assert memory.estimate_training_memory(model, "adamw", 2, 16).activations < first.activations


def test_a_training_set_up_is_its_own_cache_key_however_its_options_are_spelled():
    with torch.device("meta"):
        model = distilbert(layers=2)
    setup = memory.TrainingSetup("adamw", 2, 16, options={"betas": [0.9, 0.99], "foreach": True})
    same = memory.TrainingSetup("adamw", 2, 16, options={"foreach": True, "betas": (0.9, 0.99)})
    assert setup == same and hash(setup) == hash(same) and len({setup, same}) == 1
    planned = memory.plan(model, setup)
    assert memory.plan(model, same) is planned
    assert memory.estimate_training_memory(model, "adamw", 2, 16, foreach=True, betas=(0.9, 0.99)) is planned
    assert memory.plan(model, memory.TrainingSetup("adamw", 2, 16)) is not planned


def test_the_attention_kernel_is_part_of_the_set_up_and_each_is_planned_as_measured():
    # Eager attention keeps the score matrices for the backward pass, SDPA's fused kernel
    # does not; the config's JSON leaves the choice out, so it once shared one cache entry.
    peaks = {}
    for attention in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = llama(layers=2)
        model.config._attn_implementation = attention
        peaks[attention] = memory.estimate_training_memory(model, "adamw", 2, 64).peak
        assert peaks[attention] == measure(model, "adamw", 2, 64, "no", 1).peak, attention
    assert peaks["eager"] > peaks["sdpa"]


def test_progress_is_reported_once_per_model_copy_followed_and_only_inside_the_block():
    with torch.device("meta"):
        deep, shallow = gpt2_lm(layers=8), gpt2_lm(layers=2)
    reports = {}
    for name, model in (("deep", deep), ("shallow", shallow), ("deep again", deep)):
        reports[name] = []
        with planner.reporting_progress(lambda done, total, seen=reports[name]: seen.append((done, total))):
            memory.estimate_training_memory(model, "sgd", 2, 24)
    memory.estimate_training_memory(deep, "sgd", 2, 25)  # outside any block: nobody to tell
    # The probes with 1, 2 and 3 blocks (one more for each slide deeper, announced as it starts).
    done, totals = zip(*reports["deep"])
    assert done == tuple(range(1, len(done) + 1)) and totals[0] == 3 and totals[-1] == done[-1]
    assert list(totals) == sorted(totals)
    assert reports["shallow"] == [(1, 1)]  # followed whole
    assert reports["deep again"] == []  # the whole answer comes from the cache


def test_it_says_whose_kernels_it_follows():
    assert "CPU" in planner.DEVICE_NOTE and "CUDA" in planner.DEVICE_NOTE
    assert memory.DEVICE_NOTE is planner.DEVICE_NOTE


# --------------------------------------------------------------------------- refusals


def test_fp16_mixed_precision_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="fp16.*Accelerate 1.15 turns on fp16 autocast only on a GPU"):
        memory.estimate_training_memory(distilbert(), "adamw", 2, 16, mixed_precision="fp16")
    with pytest.raises(ValueError, match="mixed_precision must be one of 'no', 'bf16', 'fp16'"):
        memory.estimate_training_memory(distilbert(), "adamw", 2, 16, mixed_precision="bf32")


def test_a_model_without_a_config_or_a_known_head_is_refused_by_name():
    with pytest.raises(planner.PlannerRefused, match="Linear has none"):
        memory.estimate_training_memory(torch.nn.Linear(3, 3), "adamw", 2, 8)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        memory.estimate_training_memory("distilbert", "adamw", 2, 8)


def test_a_model_with_nothing_to_train_is_refused():
    model = distilbert()
    model.requires_grad_(False)
    with pytest.raises(planner.PlannerRefused, match="no parameter requires grad"):
        memory.estimate_training_memory(model, "adamw", 2, 8)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ((0, 8), ValueError, "batch_size must be a positive int"),
        ((2, True), ValueError, "seq_len must be a positive int"),
        ((2, 600), ValueError, "seq_len must be at most the model's 512 positions, got 600"),
    ],
)
def test_bad_batch_shapes_are_named(arguments, error, message):
    with pytest.raises(error, match=message):
        memory.estimate_training_memory(distilbert(), "adamw", *arguments)


def test_unknown_optimizers_and_options_are_named():
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adam, adamw"):
        memory.estimate_training_memory(distilbert(), "lbfgs", 2, 8)
    with pytest.raises(TypeError, match="unknown option 'momentum' for optimizer 'adamw'"):
        memory.estimate_training_memory(distilbert(), "adamw", 2, 8, momentum=0.9)
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be a positive int"):
        memory.estimate_training_memory(distilbert(), "adamw", 2, 8, gradient_accumulation_steps=0)


def test_planning_prints_and_warns_nothing(capfd):
    with torch.device("meta"):
        model = checkpointed(gpt2_lm(layers=2))
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory.estimate_training_memory(model, "adamw", 2, 16, mixed_precision="bf16")
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


# Set-ups found by benchmarks/planner_sweep.py, each held to what a real step measures.


def test_a_checkpointed_decoder_builds_no_causal_mask_that_the_real_step_skips():
    # No cache under checkpointing: transformers reads the position ids' values to detect packed
    # sequences; on fake tensors it used to assume tracing and keep a (2, 1, 64, 64) mask alive.
    torch.manual_seed(0)
    model = checkpointed(llama(layers=2))
    planned = memory.estimate_training_memory(model, "sgd", 2, 64)
    measured = measure(model, "sgd", 2, 64)
    assert (planned.activations, planned.peak) == (measured.activations, measured.peak)


def test_question_answering_heads_get_an_answer_span_and_are_planned():
    from transformers import RobertaConfig, RobertaForQuestionAnswering

    torch.manual_seed(0)
    model = RobertaForQuestionAnswering(RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2))
    batch = memory.training_batch(model, 3, 17)
    assert batch["start_positions"].shape == batch["end_positions"].shape == (3,)
    assert int(batch["end_positions"].max()) < 17
    planned = memory.estimate_training_memory(model, "adamw", 3, 17)
    assert planned.peak == measure(model, "adamw", 3, 17).peak


def test_an_encoder_decoder_language_model_is_planned_and_its_other_heads_refused_by_name():
    from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration, T5Model

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      decoder_start_token_id=0)
    # BART's decoder makes itself an all-ones padding mask, which the real step reads and then skips.
    bart = BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64)
    for model in (T5ForConditionalGeneration(config), BartForConditionalGeneration(bart)):
        torch.manual_seed(0)
        planned = memory.estimate_training_memory(model, "adamw", 2, 32)
        assert planned.peak == measure(model, "adamw", 2, 32).peak, type(model).__name__
    with pytest.raises(ValueError, match="T5Model is an encoder-decoder model whose decoder needs inputs"):
        memory.estimate_training_memory(T5Model(config), "adamw", 2, 16)


def test_a_head_whose_name_ends_in_model_is_not_taken_for_a_base_model():
    from transformers import GPT2DoubleHeadsModel

    model = GPT2DoubleHeadsModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="got GPT2DoubleHeadsModel"):
        memory.estimate_training_memory(model, "adamw", 2, 16)


def test_a_value_dependent_shape_is_refused_naming_the_operation():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    # DeBERTa-v2's classification loss picks the labelled rows with nonzero().
    model = DebertaV2ForSequenceClassification(DebertaV2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(planner.PlannerRefused, match="calls aten.nonzero.default, whose result depends on tensor"):
        memory.estimate_training_memory(model, "adamw", 2, 16)


def test_an_error_of_the_model_itself_is_refused_naming_it():
    from transformers import T5Config, T5ForConditionalGeneration

    # A config without decoder_start_token_id: T5 cannot make its decoder inputs, on real tensors either.
    model = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                num_heads=4))
    with pytest.raises(planner.PlannerRefused, match="T5ForConditionalGeneration's config has no decoder_start_token_id.*Set config.decoder_start_token_id"):
        memory.estimate_training_memory(model, "adamw", 2, 16)


def test_a_sequence_past_robertas_position_table_is_refused_as_the_real_step_fails():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    # RoBERTa numbers positions from padding_idx + 1 = 2: its 40-row table takes 38 tokens. A fake
    # step sees no index out of range, so without the check it would plan a step that cannot run.
    model = RobertaForSequenceClassification(RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=40, pad_token_id=1))
    with pytest.raises(RuntimeError, match="out of bounds"):
        model(**memory.training_batch(model, 1, 39))
    with pytest.raises(ValueError, match=r"at most the model's 38 positions \(its table of 40 starts at padding_idx"):
        memory.estimate_training_memory(model, "adamw", 1, 39)
    assert memory.estimate_training_memory(model, "adamw", 1, 38).peak == measure(model, "adamw", 1, 38).peak
