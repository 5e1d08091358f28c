"""How much memory training takes: the memory wing of the course, one package, one import (lessons 2-5, 7).

``from course_utils import memory`` is the face: every public name a lesson,
an exercise, a plot or a benchmark uses is here. Sizes are in bytes.

Its rooms, each named for its idea (the arrow is "imports"):

- ``setup``: :class:`TrainingSetup`, one training set-up (optimizer and its
  options, micro-batch, length, precision, accumulation), checked once when
  made, frozen and hashable: its own cache key. The model side (dtype,
  checkpointing, which parameters train) is the model's, built by
  :func:`course_utils.models.build_for_training`.
- ``step``: the course's training step, written once (:func:`step.training_step`,
  :data:`PHASES`); ``_step_tracker``: the MemTracker it is measured with.
- ``training_memory``: :class:`TrainingMemory`, the step measured for real
  (:func:`measure_training_step_peak`, :func:`measure` of a set-up), its batch
  (:func:`training_batch`, :func:`head_kind`), the analytical explanation
  (:func:`explain_training_memory`, from ``_activation_model``) and the
  16-bytes-per-parameter rule.
- ``plan_cache``: the planner's one cache (``plan_cache.cache``), the
  model's fingerprint its keys hold (taken once per estimate), and
  :class:`PlannerRefused`, how every part of the planner refuses.
- ``fake_tensors``: the fake-tensor tools: a model's fake copy (the first
  blocks only, for the probes), its optimizer, and what a fake step needs
  answered (transformers' mask builder, an optimizer's value reads) or refused.
- ``fake_step``: the fake passes: the step on fake tensors, its passes and its
  optimizer step followed apart, each cached in the one cache, keyed by the
  model's fingerprint and the set-up.
- ``probes``: a deep model followed as copies with 1, 2 and 3 blocks, the
  loop that slides them deeper and the arithmetic that extrapolates them.
- ``per_process``: the planner per process (lesson 7): the one place that
  decides what each process of a layout (:class:`course_utils.layouts.Layout`)
  holds: one process's step under DDP, FSDP2 (the model laid out by
  ``layouts.apply_layout``, as the real runs lay it out, on a fake process
  group) or ZeRO-1, and DDP's buckets; ``tensor_parallel_step``: one process's
  step under tensor parallelism (lesson 9), the layout's split copy followed on
  the same fake group (``estimate_training_memory(layout=Layout(..., tp=N))``); ``context_parallel``:
  one process of a context-parallel layout (lesson 9), its copy laid out and
  its part of the batch taken by ``layouts``' functions in a fake process
  group; with expert parallelism, under a stated balanced routing.
- ``pipeline_stages``: one pipeline stage's step (lesson 9): the stage
  ``layouts.pipeline_stage`` builds, run by torch's GPipe or 1F1B schedule
  (``layouts.pipeline_schedule``), measured on gloo and planned on a fake
  process group; ``per_process`` sends a pipeline layout there.
- ``planner``: the entry, :func:`estimate_training_memory` and
  :func:`plan` (a model and a :class:`TrainingSetup`): validation, the
  cache of whole answers, progress reports.
- ``optimizer_state``: the bytes an optimizer keeps, estimated from shapes and measured.
- ``model_families``: what each family of model trains on, its input (token
  ids, pixel values, audio) and its head's labels, read from transformers' own
  tables (used by ``training_memory``'s batch).
- ``qlora``: a QLoRA recipe's model (4-bit bitsandbytes base, LoRA adapters)
  built without downloads (:func:`qlora_model`), what the fake copy needs
  of its 4-bit weights, and their quantisation states shown to MemTracker as
  weights (used by ``training_memory``, ``fake_step`` and ``planner``).
- ``fake_kernels``: the CPU's answer where torch's fake kernel differs from
  the CPU kernel (grouped experts in fp32, a norm's fp32 statistics; used by ``fake_step``).
- ``kernel_buffers``: the buffers some CPU kernels allocate and free inside
  themselves (convolutions, batch norm's backward, 16-bit products), probed
  once per signature on real tensors, which the tracker adds to its peak (used by ``_step_tracker``).
- ``allocator_record``: the CPU allocator's own record of a step, from torch's
  profiler (:func:`recording_allocator`, :func:`measure_allocator_rise`): the
  third instrument beside the tracker and the planner (lessons 4, 7).
- ``step_timeline``: the planner's step operation by operation
  (:func:`plan_step_timeline`, :func:`plan_timeline` of a set-up; a :class:`StepTimeline`): each part's bytes
  after every operation, a deep model's extrapolated from its copies (lesson 4).

Imports run one way: setup <- step <- training_memory <- probes <- fake_tensors <- fake_step
<- tensor_parallel_step, context_parallel <- per_process <- planner <- step_timeline <- this face (plan_cache <- fake_tensors; step <- allocator_record <- kernel_buffers <- _step_tracker; step <- allocator_record <- this face;
tensor_parallel_step calls per_process's fake copy (``sharded_fake_copy``) at run time, not at import; model_families and qlora <- training_memory; qlora <- plan_cache, fake_tensors and fake_step; fake_kernels <- fake_step; qlora <- planner);
``optimizer_state``, ``setup``, ``fake_tensors`` and ``per_process`` use :mod:`course_utils.optimizers` (outside: it builds optimizers for every
lesson), ``per_process`` and ``planner`` use :mod:`course_utils.layouts` (outside: the real runs lay models out with it too).
Each question has one entry here: how much a step takes (:func:`estimate_training_memory`, or :func:`plan` of a
:class:`TrainingSetup`; per process with ``world_size``, ``sharding`` and ``rank``), what it takes for real
(:func:`measure_training_step_peak`, :func:`measure`), how it moves (:func:`plan_step_timeline`, :func:`plan_timeline`),
what an optimizer keeps (:func:`estimate_optimizer_state`, :func:`measure_optimizer_state`). Nothing here imports a loop, a plot, an exercise or a lesson helper
(``levers``, ``plots``, ``exercises`` import this package, never the other
way), and no module outside the package imports an underscore name from it
(nor does it import one from outside): what lesson 7 needs of the sharded
step, to measure it for real in launched processes, is here under public names (:func:`measure_fsdp_step`,
:func:`fsdp_step`, :func:`fsdp_tracker`, :func:`fsdp_snapshot`, :func:`fsdp_memory`, :func:`zero1_optimizer`,
:func:`measure_zero1_step`). The planner's own parts (``per_process.fsdp_probe``, one process's sharded
step on a fake process group, and ``per_process.sharded_fake_copy``, the model laid out there) stay in
their room, for the tests that hold them exact: planning has one entry, :func:`estimate_training_memory`.
"""

from course_utils.memory.allocator_record import AllocatorRecord, measure_allocator_rise, recording_allocator
from course_utils.memory.optimizer_state import (
    ESTIMATED_OPTIMIZERS,
    count_optimizer_state_elements,
    describe_optimizer_state,
    estimate_optimizer_state,
    measure_optimizer_state,
)
from course_utils.optimizers import SUPPORTED_OPTIMIZERS, make_optimizer
from course_utils.memory.planner import DEVICE_NOTE, PlannerRefused, estimate_training_memory, plan, reporting_progress
from course_utils.memory.qlora import qlora_model, quant_state_bytes
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.step_timeline import DRAWN_PARTS, StepTimeline, plan_step_timeline, plan_timeline
# Lesson 7 measures the per-process planner's step for real in launched processes (course_utils.sharding).
from course_utils.memory.per_process import (
    fsdp_memory, fsdp_snapshot, fsdp_step, fsdp_tracker, measure_fsdp_step, measure_zero1_step, zero1_optimizer,
)
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
    "qlora_model",
    "quant_state_bytes",
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
    "fsdp_tracker",
    "fsdp_snapshot",
    "fsdp_memory",
    "zero1_optimizer",
    "measure_zero1_step",
    "AllocatorRecord",
    "recording_allocator",
    "measure_allocator_rise",
    "DRAWN_PARTS",
    "StepTimeline",
    "plan_step_timeline",
    "plan_timeline",
]
