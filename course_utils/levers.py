"""Lesson 5's levers combined (:class:`Levers`) and planned on full-size models; the planner's memory of a step beside the measured one.

- :func:`plan_and_measure` runs the planner (lesson 4's
  :func:`course_utils.memory.plan`) and the real measurement
  (:func:`course_utils.memory.measure`) on the same
  :class:`course_utils.memory.TrainingSetup`; :func:`memory_table` puts several of those side by side.
- :class:`Levers` names one combination of the levers of lesson 5;
  :func:`build_with_levers` applies it to a model built from a config on the
  meta device (no weights), and :func:`plan_with_levers` asks the planner what
  one step of it needs.

All sizes are in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from course_utils import memory, models
from course_utils.units import MIB, format_bytes
from course_utils.validation import (
    check_bool, check_choice, check_instance, check_int_in_range, check_positive_int, check_positive_number,
)

_FIELDS = (("weights", "weights"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
           ("activations", "activations"))


@dataclass(frozen=True)
class MemoryCheck:
    """One training step, planned and measured: two :class:`course_utils.memory.TrainingMemory`.

    ``planned`` is None when the planner refused the step; ``refusal`` then says why.
    """

    planned: memory.TrainingMemory | None
    measured: memory.TrainingMemory
    refusal: str | None = None

    @property
    def gap(self) -> float | None:
        """Return |planned peak - measured peak| / measured peak (a fraction), or None if refused."""
        if self.planned is None:
            return None
        return abs(self.planned.peak - self.measured.peak) / self.measured.peak


def plan_and_measure(model, setup, *, seed=0):
    """Return a :class:`MemoryCheck` of one training step of ``model`` with ``setup``, planned and measured.

    ``setup`` is a :class:`course_utils.memory.TrainingSetup` (optimizer,
    micro-batch, length, precision, accumulation). Both sides follow it: the
    planner (:func:`course_utils.memory.plan`) and the measurement
    (:func:`course_utils.memory.measure`, which trains a copy of ``model`` on a
    batch drawn with ``seed``, so ``model`` itself is left as it was).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(setup, "setup", memory.TrainingSetup,
                   "a memory.TrainingSetup, such as memory.TrainingSetup('adamw', batch_size=8, seq_len=128)")
    check_int_in_range(seed, "seed", 0, 2**64 - 1)  # what torch.Generator.manual_seed takes
    try:
        planned, refusal = memory.plan(model, setup), None
    except memory.PlannerRefused as error:
        planned, refusal = None, str(error)
    return MemoryCheck(planned, memory.measure(model, setup, seed=seed), refusal)


def memory_table(checks):
    """Return a Markdown table of ``checks`` ({row name: MemoryCheck}): the measured parts and both peaks, in MiB."""
    if not isinstance(checks, dict) or not checks:
        raise ValueError("checks must be a non-empty dict of row name -> MemoryCheck")
    header = "| step | " + " | ".join(label for _, label in _FIELDS) + " | peak, planned | peak, measured | gap |"
    lines = [header, "|" + " --- |" * (len(_FIELDS) + 4)]
    for name, check in checks.items():
        check_instance(check, f"checks[{name!r}]", MemoryCheck, "a MemoryCheck")
        parts = " | ".join(f"{getattr(check.measured, field) / MIB:,.2f}" for field, _ in _FIELDS)
        if check.planned is None:
            planned, gap = "refused (below)", "n/a"
        else:
            planned, gap = f"{check.planned.peak / MIB:,.2f}", f"{100 * check.gap:.2f}%"
        lines.append(f"| {name} | {parts} | {planned} | {check.measured.peak / MIB:,.2f} | {gap} |")
    refusals = [f"- *{name}*: the planner refused: {check.refusal}" for name, check in checks.items() if check.refusal]
    footer = "Sizes in MiB: the four parts as measured, the peak as planned and as measured."
    return "\n".join(lines + ([""] + refusals if refusals else []) + ["", footer])


@dataclass(frozen=True)
class Levers:
    """One combination of lesson 5's levers.

    - ``bf16_weights``: pure bf16 storage (weights, gradients and AdamW state in bf16);
    - ``mixed_precision``: "no" or "bf16" (Accelerate's autocast, fp32 storage);
    - ``activation_checkpointing``: recompute each block's forward during backward;
    - ``train``: "all" parameters, only the "head" (the rest frozen), or "lora" adapters;
    - ``micro_batch_size`` and ``gradient_accumulation_steps``: the effective batch is their product.
    """

    bf16_weights: bool = False
    mixed_precision: str = "no"
    activation_checkpointing: bool = False
    train: str = "all"
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1

    def __post_init__(self):
        check_bool(self.bf16_weights, "bf16_weights")
        check_choice(self.mixed_precision, "mixed_precision", ("no", "bf16"))
        check_bool(self.activation_checkpointing, "activation_checkpointing")
        check_choice(self.train, "train", models.TRAINED_PARTS)
        check_positive_int(self.micro_batch_size, "micro_batch_size")
        check_positive_int(self.gradient_accumulation_steps, "gradient_accumulation_steps")

    def setup(self, seq_len: int, optimizer: str = "adamw") -> memory.TrainingSetup:
        """Return the :class:`course_utils.memory.TrainingSetup` the planner follows for these levers.

        Two or more micro-batches are planned as two: from the second on, each
        micro-batch meets the same gradients held from the ones before, so the
        peak is the same (``tests/training/test_levers.py`` holds it, planned and
        measured), and following each extra micro-batch on fake tensors costs seconds.
        """
        return memory.TrainingSetup(optimizer, self.micro_batch_size, seq_len, self.mixed_precision,
                                    min(self.gradient_accumulation_steps, 2))

    @property
    def effective_batch_size(self) -> int:
        """Return the sequences per optimizer step on one process: micro-batch x accumulation steps."""
        return self.micro_batch_size * self.gradient_accumulation_steps

    def describe(self) -> str:
        """Return the combination in words, e.g. ``"bf16 weights, checkpointing, LoRA, 4 x 8"``."""
        parts = ["bf16 weights" if self.bf16_weights else "fp32 weights"]
        if self.mixed_precision == "bf16":
            parts.append("bf16 autocast")
        if self.activation_checkpointing:
            parts.append("checkpointing")
        parts.append({"all": "all trained", "head": "head only", "lora": "LoRA"}[self.train])
        parts.append(f"{self.micro_batch_size} x {self.gradient_accumulation_steps}")
        return ", ".join(parts)


def build_with_levers(model_class, config, levers):
    """Return ``model_class.from_config(config)`` on the meta device (no weights) with ``levers`` applied.

    The model side of ``levers`` (its dtype, checkpointing, which parameters
    train), built by :func:`course_utils.models.build_for_training`, as lesson 4's models are.
    ``model_class`` is a transformers Auto class (``AutoModelForCausalLM``...).
    LoRA uses PEFT's default target modules for the architecture (rank 16).
    """
    check_instance(levers, "levers", Levers, "a Levers")
    dtype = torch.bfloat16 if levers.bf16_weights else torch.float32
    return models.build_for_training(model_class, config, dtype, levers.activation_checkpointing, levers.train)


def plan_with_levers(model_class, config, levers, seq_len, optimizer="adamw"):
    """Return the planner's :class:`course_utils.memory.TrainingMemory` of one step with ``levers`` (bytes).

    Raises :class:`course_utils.memory.PlannerRefused` when the planner cannot follow the step.
    """
    model = build_with_levers(model_class, config, levers)
    return memory.plan(model, levers.setup(seq_len, optimizer))


def describe_fit(plan, budget):
    """Return one line: the planned peak against ``budget`` (bytes), and whether it fits."""
    check_instance(plan, "plan", memory.TrainingMemory, "a TrainingMemory (what the planner returns)")
    check_positive_number(budget, "budget")
    verdict = "fits" if plan.peak <= budget else "does NOT fit"
    return (f"peak {format_bytes(plan.peak)} ({plan.phase_of_peak}) against a budget of {format_bytes(budget)}: "
            f"{verdict}; weights {format_bytes(plan.weights)}, gradients {format_bytes(plan.gradients)}, "
            f"optimizer state {format_bytes(plan.optimizer_state)}, activations {format_bytes(plan.activations)}")
