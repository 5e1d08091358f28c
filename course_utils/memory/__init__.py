"""How much memory training takes: one import for the course's estimates and measurements (lessons 2-5).

The ideas live in their own modules; this one gathers their public names, so
``from course_utils import memory`` keeps working whatever the layout:

- :mod:`course_utils.optimizers`: :func:`make_optimizer` and :data:`SUPPORTED_OPTIMIZERS`.
- :mod:`course_utils.memory.optimizer_state`: the bytes an optimizer keeps, estimated
  exactly from parameter shapes (:func:`estimate_optimizer_state`) and measured
  (:func:`measure_optimizer_state`, :func:`count_optimizer_state_elements`,
  :func:`describe_optimizer_state`).
- :mod:`course_utils.memory.training_memory`: one training step measured with torch's
  MemTracker (:func:`measure_training_step_peak`, :class:`TrainingMemory`,
  :data:`PHASES`), the batch it uses (:func:`training_batch`), the analytical
  explanation, block by block (:func:`explain_training_memory`), and the
  16-bytes-per-parameter rule (:func:`rule_of_thumb_training_memory`).
- :mod:`course_utils.memory.planner`: :func:`estimate_training_memory`, the same step
  followed on fake tensors for any model, from tiny to 70B (:data:`DEVICE_NOTE`
  says whose kernels it follows).

All sizes are in bytes.
"""

from course_utils.memory.optimizer_state import (
    ESTIMATED_OPTIMIZERS,
    count_optimizer_state_elements,
    describe_optimizer_state,
    estimate_optimizer_state,
    measure_optimizer_state,
)
from course_utils.optimizers import SUPPORTED_OPTIMIZERS, make_optimizer
from course_utils.memory.planner import DEVICE_NOTE, PlannerRefused, estimate_training_memory, plan, reporting_progress
from course_utils.memory.setup import TrainingSetup
# Lesson 7 measures the per-process planner's step for real in launched processes (course_utils.sharding).
from course_utils.memory._sharded_step import _memory as fsdp_memory
from course_utils.memory._sharded_step import _snapshot as fsdp_snapshot
from course_utils.memory._sharded_step import _step as fsdp_step
from course_utils.memory._sharded_step import measure_fsdp_step
from course_utils.memory.training_memory import (
    MIXED_PRECISION,
    PHASES,
    StepBreakdown,
    TrainingMemory,
    explain_training_memory,
    head_kind,
    measure,
    measure_training_step_peak,
    rule_of_thumb_training_memory,
    training_batch,
)

__all__ = [
    "SUPPORTED_OPTIMIZERS",
    "make_optimizer",
    "ESTIMATED_OPTIMIZERS",
    "estimate_optimizer_state",
    "measure_optimizer_state",
    "count_optimizer_state_elements",
    "describe_optimizer_state",
    "PHASES",
    "MIXED_PRECISION",
    "TrainingMemory",
    "StepBreakdown",
    "measure_training_step_peak",
    "measure",
    "training_batch",
    "head_kind",
    "explain_training_memory",
    "rule_of_thumb_training_memory",
    "DEVICE_NOTE",
    "PlannerRefused",
    "estimate_training_memory",
    "TrainingSetup",
    "plan",
    "reporting_progress",
    "measure_fsdp_step",
    "fsdp_step",
    "fsdp_snapshot",
    "fsdp_memory",
]
