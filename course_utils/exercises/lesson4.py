"""Exercises of lesson 4: the memory of a training step.

- ``q1``: will it fit? The peak of a training step when AdamW is swapped for 8-bit AdamW
- ``q2``: predict a peak: a BERT-mini-shaped model's step at 4 times the batch, judged by a real
  measurement and compared with the planner's estimate

The checks recognise the usual mistakes by computing them: each known mistake
is written out below, and a learner's answer that gives the same wrong result
gets that mistake's explanation.
"""

from __future__ import annotations

import math

import torch

from course_utils.exercises.core import ValueExercise
from course_utils.units import GIB, MIB
from course_utils.validation import check_positive_int

# --------------------------------------------------------------------------- q1: the peak with another optimizer

# The set-up of exercise 1: GPT-2 large (the base model), fp32, batches of 4 x 256 tokens, a 13 GiB budget.
GPT2_LARGE_CONFIG = {"n_embd": 1280, "n_layer": 36, "n_head": 20}
Q1_BATCH_SIZE = 4
Q1_SEQ_LEN = 256
Q1_BUDGET_GIB = 13

_q1_cache: dict[str, object] = {}


def q1_numbers() -> dict[str, object]:
    """Return the estimates exercise 1 is built on, in bytes: AdamW's step (planner), and the two optimizers' states."""
    if not _q1_cache:
        from transformers import GPT2Config, GPT2Model

        from course_utils import memory

        with torch.device("meta"):
            gpt2_large = GPT2Model(GPT2Config(**GPT2_LARGE_CONFIG))
        _q1_cache.update(
            adamw_step=memory.plan(gpt2_large, memory.TrainingSetup("adamw", Q1_BATCH_SIZE, Q1_SEQ_LEN)),
            adamw_state=memory.estimate_optimizer_state(gpt2_large, "adamw"),
            adamw8bit_state=memory.estimate_optimizer_state(gpt2_large, "adamw8bit"),
            parameters=sum(p.numel() for p in gpt2_large.parameters()),
        )
    return dict(_q1_cache)


class PeakWithEightBitAdamW(ValueExercise):
    title = "Exercise 1"
    variables = ["peak_8bit_gib"]
    # Counting 8-bit AdamW's state as exactly 2 bytes per parameter is close enough.
    rel_tol = 0.01
    unit = "GiB"
    hints = [
        "Start from AdamW's estimated peak, `fit_adamw_step.peak`: it already holds the weights, the activations "
        "or gradients of its phase, the temporaries and AdamW's state.",
        "Swapping the optimizer swaps only its state, which is held during the whole step: take `fit_adamw_state` "
        "away and add `fit_adamw8bit_state`.",
        "Everything is in bytes: divide by `1024**3` for GiB.",
    ]
    solution_code = "peak_8bit_gib = (fit_adamw_step.peak - fit_adamw_state + fit_adamw8bit_state) / 1024**3"
    correct_message = (
        f"Compare it with the {Q1_BUDGET_GIB} GiB budget, and with AdamW's peak: the optimizer decides whether the step fits."
    )

    def expected_values(self, **values):
        numbers = q1_numbers()
        step = numbers["adamw_step"]
        if step.phase_of_peak == "optimizer step":
            # The exercise relies on the optimizer's own step being beside the point.
            raise RuntimeError("exercise 1's set-up puts the peak in the optimizer step; choose another batch")
        return {"peak_8bit_gib": (step.peak - numbers["adamw_state"] + numbers["adamw8bit_state"]) / GIB}

    def diagnose(self, name, value, expected):
        numbers = q1_numbers()
        step, adamw_state, eight_bit = numbers["adamw_step"], numbers["adamw_state"], numbers["adamw8bit_state"]
        mistakes = [
            (step.peak, "That is AdamW's peak: swap AdamW's state for 8-bit AdamW's."),
            (step.peak - adamw_state, "You took AdamW's state away but added no state back: 8-bit AdamW keeps "
                                      "its two moving averages too, in about 2 bytes per parameter."),
            (step.peak - adamw_state + eight_bit / 4, "8-bit AdamW keeps about 2 bytes per parameter, "
                                                      "1 byte for each of its two states, not 0.5."),
            (step.peak - eight_bit, "You took 8-bit AdamW's state away from AdamW's peak, which never held it: "
                                    "take AdamW's state away (`fit_adamw_state`) and add 8-bit AdamW's."),
            (step.weights + step.gradients + eight_bit + step.activations,
             "That adds up all four parts, but they are never all alive at once: the backward pass frees "
             "activations as it creates gradients. Start from AdamW's estimated peak."),
            (step.weights + step.gradients + eight_bit,
             "That leaves out the activations, which are most of this step's memory. Start from AdamW's estimated peak."),
            (16 * numbers["parameters"], "That is the rule of thumb for AdamW: it knows nothing of activations. "
                                         "Start from AdamW's estimated peak."),
        ]
        # Two mistakes can land within the tolerance of each other (here peak - 8-bit state and the sum of
        # the four parts are 1 % apart): the nearest one is the learner's.
        return _nearest_mistake(value, [(bytes_ / GIB, explanation) for bytes_, explanation in mistakes],
                                self.rel_tol)


def _nearest_mistake(value, mistakes, rel_tol):
    """Return the explanation of the mistake in ``mistakes`` ((value, explanation) pairs) nearest ``value``,
    if it is within ``rel_tol``; else None."""
    near = [(abs(value - wrong) / abs(wrong), explanation) for wrong, explanation in mistakes
            if wrong and math.isclose(value, wrong, rel_tol=rel_tol)]
    return min(near)[1] if near else None


# --------------------------------------------------------------------------- q2: predict a peak

# A model shaped like google/bert_uncased_L-4_H-256_A-4 ("BERT-mini", 11.2M parameters) as a sequence
# classifier, fp32, AdamW: measured at Q2_GIVEN_BATCH sequences, predicted at Q2_BATCH, Q2_SEQ_LEN tokens each.
# Big enough that weights and state are a good part of the step, small enough to measure in seconds.
BERT_MINI_CONFIG = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
Q2_SEQ_LEN = 128
Q2_GIVEN_BATCH = 4
Q2_BATCH = 16
# A prediction within this share of the measured peak is judged right: careful reasoning from the given
# step lands within about 2 %; adding up all four parts lands more than 5 % high.
Q2_TOLERANCE = 0.03
# A prediction off by a unit's factor is named as a unit slip when it is within this share once converted.
UNIT_SLIP_TOLERANCE = 0.1

_q2_cache: dict[object, object] = {}


def q2_model() -> torch.nn.Module:
    """Return a fresh BERT-mini-shaped sequence classifier (random weights, seed 0), fp32."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**BERT_MINI_CONFIG, num_labels=2))


def q2_step(batch_size: int):
    """Return the measured memory (a TrainingMemory, bytes) of one step of exercise 2's model: fp32, AdamW.

    ``batch_size`` sequences of ``Q2_SEQ_LEN`` tokens. Measured once per kernel (seconds), then cached.
    """
    check_positive_int(batch_size, "batch_size")
    if batch_size not in _q2_cache:
        from course_utils import memory, optimizers

        model = q2_model()
        batch = memory.training_batch(model, batch_size, Q2_SEQ_LEN, generator=torch.Generator().manual_seed(0))
        optimizer = optimizers.make_optimizer("adamw", model.parameters(), lr=2e-5)
        _q2_cache[batch_size] = memory.measure_training_step_peak(model, optimizer, batch)
    return _q2_cache[batch_size]


def q2_planned():
    """Return the planner's estimate (a TrainingMemory, bytes) of the step exercise 2 asks about."""
    if "planned" not in _q2_cache:
        from course_utils import memory

        _q2_cache["planned"] = memory.plan(q2_model(), memory.TrainingSetup("adamw", Q2_BATCH, Q2_SEQ_LEN))
    return _q2_cache["planned"]


def _q2_mistakes(given) -> list[tuple[float, str]]:
    """The usual wrong predictions from the given step, in bytes, with what each gets wrong."""
    factor = Q2_BATCH / Q2_GIVEN_BATCH
    held = given.weights + given.optimizer_state
    step_peak = given.peak_by_phase["optimizer step"]
    return [
        (given.peak, "That is the peak of the smaller batch: the activations grow with the batch size."),
        (given.weights + given.optimizer_state + factor * (step_peak - held),
         "That scales the optimizer step's peak, but what the step holds on top of weights and state (the "
         "gradients and the step's temporaries) does not depend on the batch. Scale what the forward and "
         "backward passes hold on top of them."),
        (factor * given.peak, f"That multiplies the whole peak by {factor:g}, but the weights and the optimizer "
                              "state do not grow with the batch: only what the step adds on top of them does."),
        (given.weights + given.gradients + given.optimizer_state + factor * given.activations,
         "That adds up all four parts, but they are never all alive at once: during the backward pass, "
         "activations are freed as gradients are created."),
        (4 * given.weights, "That is the 16-bytes-per-parameter rule: it has no activations at all."),
        (given.weights + factor * (given.peak - held),
         "You left out the optimizer state: AdamW's moving averages are held during the whole step."),
    ]


class PredictThePeak(ValueExercise):
    title = "Exercise 2"
    variables = ["predicted_peak_mib"]
    unit = "MiB"
    rel_tol = Q2_TOLERANCE
    hints = [
        "Look at each phase's peak in `given_step.peak_by_phase`: the weights and the optimizer state are held "
        "in all three and do not depend on the batch.",
        f"What the forward and backward passes hold on top of them is mostly activations, which grow in "
        f"proportion to the batch ({Q2_BATCH} sequences instead of {Q2_GIVEN_BATCH}); what the optimizer step "
        "holds on top (gradients, temporaries) does not change.",
        "The step's peak is the largest of the three phases' peaks. All numbers are in bytes: divide by "
        "`1024**2` for MiB.",
    ]
    solution_code = f"""
        held = given_step.weights + given_step.optimizer_state  # held throughout, whatever the batch
        backward = held + {Q2_BATCH} / {Q2_GIVEN_BATCH} * (given_step.peak_by_phase["backward"] - held)
        predicted_peak_mib = max(backward, given_step.peak_by_phase["optimizer step"]) / 1024**2
    """

    def expected_values(self, **values):
        return {"predicted_peak_mib": q2_step(Q2_BATCH).peak / MIB}

    def check_answer(self, predicted_peak_mib):
        super().check_answer(predicted_peak_mib=predicted_peak_mib)  # judged against the measurement
        measured, planned = q2_step(Q2_BATCH), q2_planned()
        # Shown only to a right answer, so a wrong one never reveals the number.
        self.correct_message = (
            f"Measured: {measured.peak / MIB:,.1f} MiB, during the {measured.phase_of_peak}; the planner, on fake "
            f"tensors: {planned.peak / MIB:,.1f} MiB ({planned.phase_of_peak}); you said "
            f"{float(predicted_peak_mib):,.1f} MiB."
        )

    def diagnose(self, name, value, expected):
        # Unit slips of a prediction that is otherwise near: values_match's own unit check wants an exact
        # factor, and a prediction is only near. A factor of 1,024 is never a near miss, so the margin is wide.
        unit_slips = ((1 / MIB, "a number of bytes"), (1024, "GiB (divided by `1024**3`)"),
                      (1 / 1024, "KiB (divided by 1,024 once)"))
        for factor, unit in unit_slips:
            if math.isclose(value * factor, expected, rel_tol=UNIT_SLIP_TOLERANCE):
                return f"That looks like {unit}: `predicted_peak_mib` is in MiB (divide the bytes by `1024**2`)."
        return _nearest_mistake(value, [(bytes_ / MIB, explanation) for bytes_, explanation in
                                        _q2_mistakes(q2_step(Q2_GIVEN_BATCH))], 0.01)


q1 = PeakWithEightBitAdamW()
q2 = PredictThePeak()

__all__ = ["q1", "q2", "q1_numbers", "q2_model", "q2_step", "q2_planned", "Q1_BATCH_SIZE", "Q1_SEQ_LEN", "Q1_BUDGET_GIB",
           "Q2_SEQ_LEN", "Q2_GIVEN_BATCH", "Q2_BATCH", "Q2_TOLERANCE"]
