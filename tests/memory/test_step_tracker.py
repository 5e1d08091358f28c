"""Specification of the course's three instruments of a training step's memory (lesson 4): they agree.

The planner (fake tensors), the measured step (``StepTracker``, a MemTracker)
and the CPU allocator's own record of the same step run with no tracker
installed (``allocator_record``, from torch's profiler) give the same peak:
planned and measured to the byte; measured and the allocator to the byte but
for 0-dim tensors (at most 8 bytes each: a Python number made into a tensor
inside an operation, a scalar cast to another dtype) that torch allocates
below any dispatch mode, so no tracker can see them. On small models with
checkpointing, LoRA, accumulation and mixed precision combined.
"""

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, DistilBertConfig, GPT2Config, LlamaConfig

from course_utils import memory
from course_utils.memory import step
from course_utils.memory.allocator_record import measure_allocator_rise, recording_allocator

pytestmark = pytest.mark.slow

VOCAB = 300


def distilbert(layers, vocab_size=VOCAB):
    config = DistilBertConfig(vocab_size=vocab_size, dim=32, hidden_dim=80, n_layers=layers, n_heads=2)
    return AutoModelForSequenceClassification.from_config(config)


def gpt2_lm(layers):
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=2, bos_token_id=0, eos_token_id=0,
                        loss_type="ForCausalLM")
    return AutoModelForCausalLM.from_config(config)


def llama(layers):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2)
    return AutoModelForCausalLM.from_config(config)


def lora(model):
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def checkpointed(model):
    model.config.use_cache = False  # the cache is for generation; transformers says so when checkpointing
    model.activation_checkpointing_enable()
    return model

# (name, build, optimizer, options, mixed_precision, accumulation steps)
SETUPS = [
    ("llama-lora-checkpointing-accumulation-4", lambda: checkpointed(lora(llama(layers=2))), "adamw", {}, "no", 4),
    ("llama-checkpointing-accumulation-4", lambda: checkpointed(llama(layers=2)), "adamw", {}, "no", 4),
    ("gpt2-lm-checkpointing-bf16-accumulation-2-foreach", lambda: checkpointed(gpt2_lm(layers=2)), "adamw",
     {"foreach": True}, "bf16", 2),
    ("distilbert-checkpointing-adamw8bit", lambda: checkpointed(distilbert(layers=2, vocab_size=512)), "adamw8bit",
     {}, "no", 1),
]
SMALLEST_TENSOR_A_TRACKER_MISSES = 8  # bytes: a 0-dim float64 or int64


def _built(setup):
    name, build, optimizer, options, mixed_precision, steps = setup
    torch.manual_seed(0)
    model = build()
    real_optimizer = memory.make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], **options)
    batch = memory.training_batch(model, 2, 16, generator=torch.Generator().manual_seed(0))
    return model, real_optimizer, batch, {"mixed_precision": mixed_precision, "gradient_accumulation_steps": steps}


@pytest.mark.parametrize("setup", SETUPS, ids=[s[0] for s in SETUPS])
def test_planned_measured_and_the_allocator_agree(setup):
    name, build, optimizer, options, mixed_precision, steps = setup
    model, real_optimizer, batch, choices = _built(setup)
    planned = memory.estimate_training_memory(model, optimizer, 2, 16, **choices, **options)
    measured = memory.measure_training_step_peak(model, real_optimizer, batch, **choices)
    assert planned == measured and planned.peak_by_phase == measured.peak_by_phase, (planned, measured)

    model, real_optimizer, batch, choices = _built(setup)
    allocator = measure_allocator_rise(model, real_optimizer, batch, **choices)
    tracked_rise = measured.peak - measured.weights - measured.optimizer_state
    unseen = sum(size for size, _ in allocator.live_at_peak if size <= SMALLEST_TENSOR_A_TRACKER_MISSES)
    assert 0 <= allocator.rise - tracked_rise <= unseen, (allocator.rise, tracked_rise, allocator.live_at_peak[-8:])


def test_the_tracker_does_not_change_what_it_measures():
    # Before: MemTracker's module hooks held gradients until a module's every input had one,
    # 39,008 bytes more at this step's peak with the tracker installed than without.
    rises = []
    for tracked in (False, True):
        model, real_optimizer, batch, options = _built(SETUPS[0])
        model.train()
        # Both runs: a warm-up step untracked, then the step, tracked or not.
        with recording_allocator() as allocator:
            if tracked:
                memory.measure_training_step_peak(model, real_optimizer, batch, **options)
            else:
                for _ in range(2):
                    step.training_step(model, real_optimizer, batch, step.default_loss, options["mixed_precision"],
                                       options["gradient_accumulation_steps"])
        rises.append(allocator.rise)
    assert rises[0] == rises[1]


def test_checkpointing_s_random_states_are_counted_for_every_block():
    with_states = []
    for layers in (2, 3):
        torch.manual_seed(0)
        timeline = memory.plan_step_timeline(checkpointed(llama(layers=layers)), "sgd", 1, 8)
        # One saved by each block's forward pass; the backward pass's recomputation takes another
        # for a moment (torch.random.fork_rng), counted as the backward pass's temporary.
        with_states.append([phase for phase, operation in zip(timeline.phases, timeline.operations)
                            if operation == "get_rng_state"])
    assert with_states == [["forward 1"] * 2 + ["backward 1"] * 2, ["forward 1"] * 3 + ["backward 1"] * 3]


def test_the_allocator_record_sees_an_allocation_and_its_free():
    with recording_allocator() as record:
        kept = torch.empty(1000, dtype=torch.float32)
        dropped = torch.empty(500, dtype=torch.float64)
        del dropped
    assert record.rise == 8000 and record.totals[-1] == 4000 and record.threads == 1
    assert (4000, "aten::empty") in record.live_at_peak and kept.numel() == 1000


def test_measure_allocator_rise_names_bad_arguments():
    model, optimizer, batch, _ = _built(SETUPS[1])
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        measure_allocator_rise("llama", optimizer, batch)
    with pytest.raises(TypeError, match="batch must be a mapping"):
        measure_allocator_rise(model, optimizer, [1, 2])
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        measure_allocator_rise(model, optimizer, batch, gradient_accumulation_steps=0)
