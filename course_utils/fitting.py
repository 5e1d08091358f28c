"""Does it fit? The planner's memory of a step beside the measured one, and levers combined on full-size models (lesson 5).

- :func:`plan_and_measure` runs the planner (lesson 4's
  :func:`course_utils.memory.estimate_training_memory`) and the real
  measurement (:func:`course_utils.memory.measure_training_step_peak`) on the
  same step; :func:`memory_table` puts several of those side by side.
- :class:`Levers` names one combination of the levers of lesson 5;
  :func:`build_with_levers` applies it to a model built from a config on the
  meta device (no weights), and :func:`plan_with_levers` asks the planner what
  one step of it needs.

All sizes are in bytes.
"""

from __future__ import annotations

import copy
import gc
import warnings
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from course_utils import memory, optimizers
from course_utils.units import MIB, format_bytes
from course_utils.validation import (
    check_bool, check_choice, check_instance, check_int_in_range, check_positive_int, check_positive_number,
)

TRAINED_PARTS = ("all", "head", "lora")
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


def plan_and_measure(model, batch_size, seq_len, *, mixed_precision="no", gradient_accumulation_steps=1,
                     optimizer="adamw", seed=0):
    """Return a :class:`MemoryCheck` of one AdamW (or ``optimizer``) step of ``model`` on a batch of that shape.

    The measurement trains a copy of ``model`` on
    :func:`course_utils.memory.training_batch` (every sequence ``seq_len``
    tokens), so ``model`` itself is left as it was; its optimizer holds the
    trainable parameters only.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    check_int_in_range(seed, "seed", 0, 2**64 - 1)  # what torch.Generator.manual_seed takes
    options = {"mixed_precision": mixed_precision, "gradient_accumulation_steps": gradient_accumulation_steps}
    try:
        planned, refusal = memory.estimate_training_memory(model, optimizer, batch_size, seq_len, **options), None
    except memory.PlannerRefused as error:
        planned, refusal = None, str(error)
    spare = copy.deepcopy(model)
    trainable = [parameter for parameter in spare.parameters() if parameter.requires_grad]
    step_optimizer = optimizers.make_optimizer(optimizer, trainable, lr=1e-3)
    batch = memory.training_batch(spare, batch_size, seq_len, generator=torch.Generator().manual_seed(seed))
    # The measurement collects garbage after each forward pass (see measure_training_step_peak);
    # in a notebook that has imported transformers, a full collection walks half a million
    # objects (about 0.5 s). Frozen, they are skipped: they all exist before the step, so
    # nothing the step allocates is among them. The planner does the same.
    gc.freeze()
    try:
        measured = memory.measure_training_step_peak(spare, step_optimizer, batch, **options)
    finally:
        gc.unfreeze()
    return MemoryCheck(planned, measured, refusal)


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
        check_choice(self.train, "train", TRAINED_PARTS)
        check_positive_int(self.micro_batch_size, "micro_batch_size")
        check_positive_int(self.gradient_accumulation_steps, "gradient_accumulation_steps")

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

    ``model_class`` is a transformers Auto class (``AutoModelForCausalLM``...).
    LoRA uses PEFT's default target modules for the architecture (rank 16).
    """
    check_instance(levers, "levers", Levers, "a Levers")
    if not callable(getattr(model_class, "from_config", None)):
        raise TypeError(f"model_class must be a transformers model class (AutoModelForCausalLM...), got {model_class!r}")
    check_instance(config, "config", PretrainedConfig, "a transformers configuration (AutoConfig.for_model(...))")
    dtype = torch.bfloat16 if levers.bf16_weights else torch.float32
    with torch.device("meta"):
        model = model_class.from_config(copy.deepcopy(config), dtype=dtype)
    if levers.activation_checkpointing:
        # A causal LM's key/value cache is for generation; transformers switches it off (and says so on
        # stderr) when checkpointing: switch it off first.
        if getattr(model.config, "use_cache", False):
            model.config.use_cache = False
        model.activation_checkpointing_enable()
    if levers.train == "head":
        for parameter in model.base_model.parameters():
            parameter.requires_grad_(False)
    elif levers.train == "lora":
        model = _with_lora(model)
    return model


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    task_type = "CAUSAL_LM" if type(model).__name__.endswith("ForCausalLM") else "SEQ_CLS"
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5 `is_gradient_checkpointing`, which transformers
        # renamed (FutureWarning); the answer is the same under both names.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, LoraConfig(task_type=task_type, r=16, lora_alpha=32))


def plan_with_levers(model_class, config, levers, seq_len, optimizer="adamw"):
    """Return the planner's :class:`course_utils.memory.TrainingMemory` of one step with ``levers`` (bytes).

    Two or more micro-batches are planned as two: from the second on, each
    micro-batch meets the same gradients held from the ones before, so the
    peak is the same (``tests/test_fitting.py`` holds it, planned and
    measured), and following each extra micro-batch on fake tensors costs seconds.

    Raises :class:`course_utils.memory.PlannerRefused` when the planner cannot follow the step.
    """
    model = build_with_levers(model_class, config, levers)
    return memory.estimate_training_memory(
        model, optimizer, levers.micro_batch_size, seq_len, mixed_precision=levers.mixed_precision,
        gradient_accumulation_steps=min(levers.gradient_accumulation_steps, 2),
    )


def describe_fit(plan, budget):
    """Return one line: the planned peak against ``budget`` (bytes), and whether it fits."""
    check_instance(plan, "plan", memory.TrainingMemory, "a TrainingMemory (what the planner returns)")
    check_positive_number(budget, "budget")
    verdict = "fits" if plan.peak <= budget else "does NOT fit"
    return (f"peak {format_bytes(plan.peak)} ({plan.phase_of_peak}) against a budget of {format_bytes(budget)}: "
            f"{verdict}; weights {format_bytes(plan.weights)}, gradients {format_bytes(plan.gradients)}, "
            f"optimizer state {format_bytes(plan.optimizer_state)}, activations {format_bytes(plan.activations)}")
