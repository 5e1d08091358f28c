"""Specification of course_utils.memory.training_memory: the measured step and its analytical explanation (lesson 4).

The analytical model (``explain_training_memory``) is derived from each model's
config; it is checked against torch's MemTracker on a grid of configurations
fixed in advance (not tuned one by one): three families, base models and
classifiers, AdamW and SGD; and against the planner on the same grid.
Rerun after upgrading torch or transformers (course_utils/_activation_model.py
is fitted to their versions).
"""

import warnings
from dataclasses import dataclass, field

import pytest
import torch
from accelerate.utils import calculate_maximum_sizes
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    DistilBertModel,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2Model,
)

from course_utils import memory, models

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow

MiB = 2**20
TOLERANCE = 0.10  # the estimated peak must be within 10% of the measured one


@dataclass(frozen=True)
class Configuration:
    """One point of the grid: a small model, a batch shape and an optimizer."""

    family: str  # "distilbert", "bert" or "gpt2"
    classifier: bool
    vocab: int
    hidden: int
    layers: int
    heads: int
    batch_size: int
    seq_len: int
    optimizer: str
    options: dict = field(default_factory=dict)

    @property
    def name(self):
        kind = "cls" if self.classifier else "base"
        options = "".join(f"-{k}{v}" for k, v in self.options.items())
        return (
            f"{self.family}-{kind}-h{self.hidden}x{self.layers}-v{self.vocab}"
            f"-b{self.batch_size}x{self.seq_len}-{self.optimizer}{options}"
        )

    def build(self) -> torch.nn.Module:
        torch.manual_seed(0)
        if self.family == "distilbert":
            config = DistilBertConfig(
                vocab_size=self.vocab, dim=self.hidden, hidden_dim=4 * self.hidden,
                n_layers=self.layers, n_heads=self.heads,
            )
            return (DistilBertForSequenceClassification if self.classifier else DistilBertModel)(config)
        if self.family == "bert":
            config = BertConfig(
                vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=4 * self.hidden,
                num_hidden_layers=self.layers, num_attention_heads=self.heads,
            )
            return (BertForSequenceClassification if self.classifier else BertModel)(config)
        # A classifier needs a padding token to find each sequence's last token.
        config = GPT2Config(
            vocab_size=self.vocab, n_embd=self.hidden, n_layer=self.layers, n_head=self.heads,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )
        return (GPT2ForSequenceClassification if self.classifier else GPT2Model)(config)

    def batch(self, model) -> dict:
        generator = torch.Generator().manual_seed(1)
        # Token 0 is GPT-2's padding token here: sample real tokens only.
        batch = {"input_ids": torch.randint(1, self.vocab, (self.batch_size, self.seq_len), generator=generator)}
        if self.classifier:
            batch["labels"] = torch.randint(0, model.config.num_labels, (self.batch_size,), generator=generator)
        return batch


# Chosen before the estimate was compared with them: weight-heavy steps (real vocabularies,
# tiny batches) where the optimizer step or the end of backward peaks, activation-heavy
# ones where a block's backward peaks, and long sequences where attention scores weigh.
GRID = [
    Configuration("distilbert", True, 28996, 64, 2, 2, 2, 32, "adamw"),
    Configuration("distilbert", True, 1000, 128, 2, 4, 16, 128, "adamw"),
    Configuration("distilbert", True, 8000, 256, 4, 4, 8, 64, "sgd", {"momentum": 0.9}),
    Configuration("distilbert", False, 5000, 128, 3, 2, 4, 256, "adamw"),
    Configuration("bert", True, 28996, 128, 2, 4, 8, 64, "adamw"),
    Configuration("bert", True, 1000, 256, 4, 8, 16, 128, "sgd"),
    Configuration("bert", False, 30522, 64, 2, 2, 1, 16, "sgd", {"momentum": 0.9}),
    Configuration("bert", False, 2000, 192, 3, 3, 8, 256, "adamw"),
    Configuration("gpt2", True, 50257, 128, 2, 4, 4, 64, "adamw"),
    Configuration("gpt2", True, 1000, 256, 4, 8, 16, 128, "adamw"),
    Configuration("gpt2", False, 5000, 64, 2, 2, 8, 256, "sgd", {"momentum": 0.9}),
    Configuration("gpt2", False, 50257, 192, 3, 6, 2, 32, "sgd"),
]


def estimate_and_measure(configuration: Configuration):
    """Return (estimate, measurement) for one grid point; the measurement takes two real steps."""
    model = configuration.build()
    estimate = memory.explain_training_memory(
        model, configuration.optimizer, configuration.batch_size, configuration.seq_len, **configuration.options
    ).as_training_memory()
    optimizer = memory.make_optimizer(configuration.optimizer, model.parameters(), **configuration.options)
    measured = memory.measure_training_step_peak(model, optimizer, configuration.batch(model))
    return model, estimate, measured


@pytest.fixture(scope="module", params=GRID, ids=[c.name for c in GRID])
def grid_point(request):
    return request.param, *estimate_and_measure(request.param)


def test_estimated_peak_is_within_ten_percent_of_the_measured_peak(grid_point):
    configuration, model, estimate, measured = grid_point
    error = (estimate.peak - measured.peak) / measured.peak
    assert abs(error) <= TOLERANCE, f"{configuration.name}: estimate {estimate.peak} vs measured {measured.peak}"


def test_weights_gradients_and_optimizer_state_are_exact(grid_point):
    configuration, model, estimate, measured = grid_point
    assert (estimate.weights, estimate.gradients, estimate.optimizer_state) == (
        measured.weights,
        measured.gradients,
        measured.optimizer_state,
    )


def test_activations_left_by_the_forward_pass_are_within_one_percent(grid_point):
    configuration, model, estimate, measured = grid_point
    assert abs(estimate.activations - measured.activations) <= 0.01 * measured.activations


# --------------------------------------------------------------------------- distilbert-base-cased


def test_analytical_model_agrees_with_the_planner_on_the_grid(grid_point):
    configuration, model, explained, measured = grid_point
    planned = memory.estimate_training_memory(
        model, configuration.optimizer, configuration.batch_size, configuration.seq_len, **configuration.options
    )
    assert abs(explained.peak - planned.peak) <= TOLERANCE * planned.peak
    assert (explained.weights, explained.gradients, explained.optimizer_state) == (
        planned.weights, planned.gradients, planned.optimizer_state,
    )


def test_the_breakdown_adds_up_to_its_activations():
    model = GRID[1].build()
    breakdown = memory.explain_training_memory(model, "adamw", 4, 32)
    assert breakdown.embeddings + breakdown.layers * sum(breakdown.per_block.values()) + breakdown.head == (
        breakdown.activations
    )
    assert breakdown.layers == 2 and all(value >= 0 for value in breakdown.per_block.values())


def test_distilbert_base_cased_step_peaks_at_1628_mib_in_backward_and_1174_mib_in_the_optimizer_step():
    model = models.build_distilbert_base_cased()  # meta device: nothing is allocated
    large = memory.explain_training_memory(model, "adamw", batch_size=16, seq_len=128)
    small = memory.explain_training_memory(model, "adamw", batch_size=8, seq_len=64)
    assert (round(large.peak / MiB), large.phase_of_peak) == (1628, "backward")
    assert (round(small.peak / MiB), small.phase_of_peak) == (1174, "optimizer step")
    assert large.optimizer_state == small.optimizer_state == 526_264_752


# --------------------------------------------------------------------------- the rule of thumb


def test_rule_of_thumb_is_sixteen_bytes_per_fp32_parameter():
    model = torch.nn.Linear(10, 10)
    assert memory.rule_of_thumb_training_memory(model) == 16 * 110


def test_rule_of_thumb_is_what_accelerate_estimate_memory_reports_for_adam_in_float32():
    # `accelerate estimate-memory` reports four times the model's size (parameters and buffers).
    model = GRID[4].build()
    total_size, _ = calculate_maximum_sizes(model)
    assert memory.rule_of_thumb_training_memory(model) == 4 * total_size


def test_rule_of_thumb_misses_a_step_whose_activations_dominate():
    configuration, model, estimate, measured = (GRID[1], *estimate_and_measure(GRID[1]))
    assert memory.rule_of_thumb_training_memory(model) < 0.5 * measured.peak


# --------------------------------------------------------------------------- measurement


def test_measuring_a_step_prints_and_warns_nothing(capfd):
    configuration = GRID[0]
    model = configuration.build()
    optimizer = memory.make_optimizer("adamw", model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory.measure_training_step_peak(model, optimizer, configuration.batch(model))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_a_model_with_frozen_parameters_is_measured_with_gradients_for_the_trainable_ones_only():
    model = GRID[0].build()
    model.distilbert.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = memory.make_optimizer("adamw", trainable)
    measured = memory.measure_training_step_peak(model, optimizer, GRID[0].batch(model))
    assert measured.gradients == sum(p.numel() * p.element_size() for p in trainable)
    assert measured.optimizer_state == memory.estimate_optimizer_state(model, "adamw")


def test_accumulating_keeps_the_gradients_through_the_second_forward_pass():
    model = GRID[0].build()
    batch = GRID[0].batch(model)
    once = memory.measure_training_step_peak(model, memory.make_optimizer("sgd", model.parameters()), batch)
    twice = memory.measure_training_step_peak(
        model, memory.make_optimizer("sgd", model.parameters()), batch, gradient_accumulation_steps=2
    )
    # The second forward pass runs beside the first one's gradients; the loss divided by 2 adds a few bytes.
    extra = twice.peak_by_phase["forward"] - (once.peak_by_phase["forward"] + once.gradients)
    assert 0 <= extra < 1024


def test_the_8bit_adamw_step_is_seen_inside_bitsandbytes_20_bytes_per_element_of_the_largest_tensor():
    model = torch.nn.Linear(5000, 100)
    optimizer = memory.make_optimizer("adamw8bit", model.parameters())
    batch = {"input": torch.randn(2, 5000)}
    measured = memory.measure_training_step_peak(model, optimizer, batch, loss_fn=lambda output: output.mean())
    held = measured.weights + measured.gradients + measured.optimizer_state
    # Dequantised fp32 moments, the fp32 gradient copy, the square root and the denominator.
    assert measured.peak_by_phase["optimizer step"] - held == 20 * 5000 * 100


def test_measurement_refuses_a_batch_that_is_not_a_mapping_of_tensors():
    model = GRID[0].build()
    optimizer = memory.make_optimizer("sgd", model.parameters())
    with pytest.raises(TypeError, match="batch must be a mapping of argument names to tensors"):
        memory.measure_training_step_peak(model, optimizer, [torch.zeros(2, 3, dtype=torch.long)])


# --------------------------------------------------------------------------- errors


def _small_distilbert(**config):
    return DistilBertForSequenceClassification(
        DistilBertConfig(vocab_size=100, dim=32, hidden_dim=64, n_layers=1, n_heads=2, **config)
    )


def test_explanation_refuses_a_model_it_does_not_model():
    with pytest.raises(ValueError, match="model must be one of DistilBertModel, .*GPT2ForSequenceClassification"):
        memory.explain_training_memory(torch.nn.Linear(3, 3), "adamw", 2, 8)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        memory.explain_training_memory("distilbert", "adamw", 2, 8)


def test_explanation_refuses_an_optimizer_or_option_it_does_not_model():
    model = _small_distilbert()
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adamw; got 'adafactor'"):
        memory.explain_training_memory(model, "adafactor", 2, 8)
    with pytest.raises(TypeError, match="unknown option 'foreach' for the 'adamw' training estimate"):
        memory.explain_training_memory(model, "adamw", 2, 8, foreach=True)


@pytest.mark.parametrize("batch_size, seq_len, name", [(0, 8, "batch_size"), (2, 1.5, "seq_len")])
def test_explanation_refuses_a_bad_batch_shape(batch_size, seq_len, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        memory.explain_training_memory(_small_distilbert(), "adamw", batch_size, seq_len)


def test_explanation_refuses_sequences_longer_than_the_model_positions():
    with pytest.raises(ValueError, match="seq_len must be at most the model's 512 positions, got 513"):
        memory.explain_training_memory(_small_distilbert(), "adamw", 1, 513)


def test_explanation_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="models fp32 training; model has parameters in torch.bfloat16"):
        memory.explain_training_memory(_small_distilbert().to(torch.bfloat16), "adamw", 2, 8)
    with pytest.raises(ValueError, match="attention dropout 0"):
        memory.explain_training_memory(_small_distilbert(attention_dropout=0.0), "adamw", 2, 8)
