"""The memory of one training step: its four parts, its three moments, and how to measure it (lesson 4).

A training step holds the weights, the gradients, the optimizer's state and
the activations autograd saves for the backward pass; its peak falls in one of
three phases (:data:`PHASES`). This module measures that step for real and
explains it:

- :func:`measure_training_step_peak` runs one real step (after a warm-up step)
  under torch's MemTracker and returns a :class:`TrainingMemory`; it handles
  frozen parameters, activation checkpointing, Accelerate's bf16 autocast and
  gradient accumulation.
- :func:`training_batch` makes the batch the course's step uses: ``input_ids``
  and the labels the model's head takes.
- :func:`explain_training_memory` is the course's analytical model (fp32
  DistilBERT, BERT and GPT-2): where the bytes go, block by block, as a
  :class:`StepBreakdown` the lesson can print.
- :func:`rule_of_thumb_training_memory` is the usual 16 bytes per parameter.

The estimate for any model, :func:`course_utils.memory.planner.estimate_training_memory`,
follows this same step on fake tensors. All sizes are in bytes.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from course_utils.memory import _activation_model, model_families
from course_utils.memory._step_tracker import StepTracker
from course_utils.memory.qlora import track_quant_states
from course_utils.memory.setup import MIXED_PRECISION, TrainingSetup, check_mixed_precision
from course_utils.memory.step import PHASES, default_loss, training_step
from course_utils.optimizers import make_optimizer
from course_utils.validation import check_instance, check_int_in_range, check_positive_int

__all__ = [
    "PHASES", "MIXED_PRECISION", "TrainingMemory", "StepBreakdown", "measure_training_step_peak", "training_batch",
    "head_kind", "explain_training_memory", "rule_of_thumb_training_memory", "measure",
]



@dataclass(frozen=True)
class TrainingMemory:
    """Memory of one training step, every field in bytes (``phase_of_peak`` excepted).

    - ``weights``: parameters and buffers, and 4-bit weights' quantisation
      states (QLoRA: :func:`course_utils.memory.qlora.quant_state_bytes`).
    - ``gradients``: every parameter gradient, as held when the optimizer steps.
    - ``optimizer_state``: what the optimizer keeps between steps.
    - ``activations``: tensors still alive once the forward pass and the loss
      are done (the last micro-batch's, when accumulating), nearly all of them
      saved by autograd for the backward pass.
    - ``peak``: the most memory held at once over forward, backward and
      optimizer step, temporaries included.
    - ``phase_of_peak``: the one of :data:`PHASES` where the peak is.
    - ``peak_by_phase``: the most memory held during each phase, by phase name.
    """

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int
    phase_of_peak: str
    peak_by_phase: Mapping[str, int] = field(default_factory=dict, compare=False)


# --------------------------------------------------------------------------- the batch


def head_kind(model: torch.nn.Module) -> str:
    """Return what ``model``'s head trains on: "sequence classification", "token classification", "question answering", "language model", "image classification", "audio classification" or "base".

    Read from the transformers class name (a PEFT model is read through its base
    model), as transformers' Auto classes list it for each task
    (:func:`course_utils.memory.model_families.head_of`), else from its suffix. A
    "base" model has no head and no loss: the course's step takes the mean of
    its last hidden state. An encoder-decoder base model is refused: its
    decoder needs inputs the course's batch has no way to give it (a
    ``...ForConditionalGeneration`` language model makes them from the labels).
    """
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    name = type(inner).__name__
    config = getattr(inner, "config", None)
    known = model_families.head_of(name)  # transformers' own tables: every family's class names
    if known is not None:
        return known
    if getattr(config, "is_encoder_decoder", False) and not name.endswith("ForConditionalGeneration"):
        raise ValueError(
            f"model: {name} is an encoder-decoder model whose decoder needs inputs the course's batch (input_ids and "
            f"labels) does not give it; its ...ForConditionalGeneration language model makes them from the labels"
        )
    if name.endswith("ForSequenceClassification"):
        return "sequence classification"
    if name.endswith("ForTokenClassification"):
        return "token classification"
    if name.endswith("ForQuestionAnswering"):
        return "question answering"
    if name.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM")) or (
        name.endswith("ForConditionalGeneration") and getattr(config, "is_encoder_decoder", False)
    ):
        return "language model"
    # A base model is its own base_model; a head whose name ends in "Model" (GPT2DoubleHeadsModel) is not.
    if name.endswith("Model") and config is not None and getattr(inner, "base_model", None) is inner:
        return "base"
    raise ValueError(
        f"model: the course's training step knows the inputs of transformers base models, sequence and token "
        f"classifiers, question answering heads, causal and masked language models (and encoder-decoder "
        f"language models), image and audio classifiers; got {name}, whose labels it does not make. Plan the same "
        f"body with one of these heads, or measure your head's step on your own batch (measure_training_step_peak)"
    )


def training_batch(
    model: torch.nn.Module, batch_size: int, seq_len: int, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Return one batch for ``model``: ``input_ids`` of shape (batch_size, seq_len) and the labels its head takes.

    A model whose input is not token ids gets the input its family reads
    (pixel values, input features, audio samples; ``seq_len`` then means what
    :mod:`course_utils.memory.model_families` says). Sequence, image and audio
    classifiers get one class per example, token classifiers one per
    token, question answering heads one answer span per sequence
    (``start_positions``, ``end_positions``), language models
    ``labels = input_ids`` (the model shifts them), base models no labels. Token ids avoid the padding token, so every sequence is
    full length. Made under fake tensors, the batch is fake too.
    """
    kind = head_kind(model)  # first: it names a model that has no config
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
    if generator is not None:
        check_instance(generator, "generator", torch.Generator, "a torch.Generator or None")
    config = model.config
    # The input the model's family reads: token ids, pixel values or audio (see model_families).
    batch = model_families.model_inputs(model, batch_size, seq_len, generator)
    ids = batch.get("input_ids")
    if model_families.is_classifier(kind):
        batch["labels"] = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
    elif kind == "token classification":
        batch["labels"] = torch.randint(0, config.num_labels, (batch_size, seq_len), generator=generator)
    elif kind == "question answering":
        starts = torch.randint(0, seq_len, (batch_size,), generator=generator)
        batch["start_positions"] = starts
        batch["end_positions"] = (starts + 1).clamp(max=seq_len - 1)
    elif kind == "language model":
        batch["labels"] = ids if ids is not None else model_families.decoder_labels(model, batch_size, seq_len, generator)
    return batch


# --------------------------------------------------------------------------- the measurement


def measure_training_step_peak(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, torch.Tensor],
    loss_fn: Callable[[object], torch.Tensor] = default_loss, *, mixed_precision: str = "no",
    gradient_accumulation_steps: int = 1,
) -> TrainingMemory:
    """Return the memory of one training step of ``model`` on ``batch``, measured with torch's MemTracker.

    The step is, for each of ``gradient_accumulation_steps`` micro-batches
    (``batch`` each time), ``loss_fn(model(**batch))`` divided by the number of
    micro-batches, ``.backward()``; then ``optimizer.step()`` and
    ``optimizer.zero_grad()``, in training mode. ``mixed_precision="bf16"``
    runs the forward pass as Accelerate's prepared model does: under CPU bf16
    autocast, its outputs converted to fp32. ("fp16" is refused: Accelerate 1.15
    does not autocast on CPU with fp16.) A warm-up step runs first, so that the
    optimizer state exists as from the second step on; the second step is
    measured. The default loss is the model's own (put labels in ``batch``),
    or for a base model the mean of its last hidden state. Frozen parameters
    and activation checkpointing are the model's own. The model's weights take
    the two steps: pass a model you can spare.

    MemTracker sees every tensor storage torch's operations allocate; the
    course's tracker (``course_utils.memory._step_tracker``) adds the random-number
    state activation checkpointing saves and the buffers convolutions, batch
    norm's backward and 16-bit products allocate inside their kernels
    (:mod:`course_utils.memory.kernel_buffers`), counts autograd's gradient
    sums in place as an untracked step does them, and hooks nothing that would
    keep a tensor alive. The CPU allocator's record of the same step run with no
    tracker (:func:`course_utils.memory.measure_allocator_rise`)
    rises as far above the weights and optimizer state as this peak, but for
    0-dim tensors torch makes inside an operation (8 bytes at most each).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    if not isinstance(batch, Mapping) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
        raise TypeError(f"batch must be a mapping of argument names to tensors, got {type(batch).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function of the model's outputs, got {type(loss_fn).__name__}")
    check_mixed_precision(mixed_precision)
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    return _measure_step(model, optimizer, batch, loss_fn, mixed_precision, gradient_accumulation_steps)


def measure(model: torch.nn.Module, setup: TrainingSetup, *, seed: int = 0) -> TrainingMemory:
    """Return :func:`measure_training_step_peak` of ``setup`` on a copy of ``model`` (left as it was), in bytes.

    The step the planner follows for ``setup``, run for real: the optimizer
    (``lr=1e-3`` unless the set-up's options say otherwise) over the copy's
    trainable parameters, on :func:`training_batch` drawn with ``seed``.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(setup, "setup", TrainingSetup, "a TrainingSetup")
    check_int_in_range(seed, "seed", 0, 2**64 - 1)  # what torch.Generator.manual_seed takes
    spare = copy.deepcopy(model)
    trainable = [parameter for parameter in spare.parameters() if parameter.requires_grad]
    optimizer = make_optimizer(setup.optimizer, trainable, **{"lr": 1e-3, **setup.optimizer_options})
    batch = training_batch(spare, setup.batch_size, setup.seq_len, generator=torch.Generator().manual_seed(seed))
    # The measurement collects garbage after each forward pass (see measure_training_step_peak);
    # in a notebook that has imported transformers, a full collection walks half a million
    # objects (about 0.5 s). Frozen, they are skipped: they all exist before the step, so
    # nothing the step allocates is among them. The planner does the same.
    gc.freeze()
    try:
        return _measure_step(spare, optimizer, batch, default_loss, setup.mixed_precision,
                             setup.gradient_accumulation_steps)
    finally:
        gc.unfreeze()


def _measure_step(model, optimizer, batch, loss_fn, mixed_precision, steps,
                  in_optimizer_step=contextlib.nullcontext, state_held_by=None) -> TrainingMemory:
    """Return :func:`measure_training_step_peak`'s measurement (its arguments checked).

    ``state_held_by``: the optimizer that holds the state, told to the tracker
    (``optimizer`` unless it wraps another, as ZeRO-1's does).
    """
    return _measure_step_and_micro_batches(model, optimizer, batch, loss_fn, mixed_precision, steps,
                                           in_optimizer_step, state_held_by)[0]


def _measure_step_and_micro_batches(model, optimizer, batch, loss_fn, mixed_precision, steps,
                                    in_optimizer_step=contextlib.nullcontext,
                                    state_held_by=None) -> tuple[TrainingMemory, list]:
    """Return :func:`_measure_step`'s measurement and each micro-batch's (forward, backward) peak (for the probes)."""
    model.train()
    with warnings.catch_warnings():
        # transformers builds some modules inside forward (the classifier's ReLU,
        # CrossEntropyLoss); they are gone by backward, and MemTracker warns that it
        # skips their hooks. Totals are unaffected.
        warnings.filterwarnings("ignore", message="Module is None. Skipping", category=UserWarning)
        # Warm-up. The model's outputs are dropped as soon as the loss exists, as in a loop that keeps only the loss.
        training_step(model, optimizer, batch, loss_fn, mixed_precision, steps, None, in_optimizer_step)
        tracker = StepTracker()
        tracker.track_external(model, state_held_by or optimizer)
        track_quant_states(tracker, model)  # a 4-bit weight's scales are weights too (QLoRA)
        with tracker:
            tracker.start_phase()
            seen = training_step(model, optimizer, batch, loss_fn, mixed_precision, steps, tracker, in_optimizer_step)
    peaks = seen["peak_by_phase"]
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    after_step = seen["after_step"]
    return TrainingMemory(
        weights=after_step["Parameter"] + after_step["Buffer"], gradients=seen["after_backward"]["Gradient"],
        optimizer_state=after_step["Optstate"], activations=seen["after_forward"]["Activation"],
        peak=peaks[phase_of_peak], phase_of_peak=phase_of_peak, peak_by_phase=peaks,
    ), seen["micro_batch_peaks"]


# --------------------------------------------------------------------------- the explanation


@dataclass(frozen=True)
class StepBreakdown:
    """Where the bytes of one fp32 training step go, from the course's analytical model (bytes).

    ``activations`` is ``embeddings + layers * sum(per_block.values()) + head``:
    what autograd keeps from the embeddings, from each of the ``layers``
    identical blocks (``per_block``, by part: the dict the lesson prints) and
    after the last block. ``peak_by_phase`` is the model's peak of each phase.
    """

    weights: int
    gradients: int
    optimizer_state: int
    embeddings: int
    per_block: Mapping[str, int]
    layers: int
    head: int
    activations: int
    peak_by_phase: Mapping[str, int]

    @property
    def phase_of_peak(self) -> str:
        """The phase (one of :data:`PHASES`) where the peak is."""
        return max(PHASES, key=self.peak_by_phase.__getitem__)

    @property
    def peak(self) -> int:
        """The most bytes held at once over the step."""
        return self.peak_by_phase[self.phase_of_peak]

    def as_training_memory(self) -> TrainingMemory:
        """Return the same totals as a :class:`TrainingMemory`."""
        return TrainingMemory(
            weights=self.weights, gradients=self.gradients, optimizer_state=self.optimizer_state,
            activations=self.activations, peak=self.peak, phase_of_peak=self.phase_of_peak,
            peak_by_phase=dict(self.peak_by_phase),
        )


def explain_training_memory(
    model: torch.nn.Module, optimizer: str, batch_size: int, seq_len: int, **options: object
) -> StepBreakdown:
    """Return the analytical account of one fp32 training step of ``model`` on CPU, in bytes.

    ``model`` is a DistilBERT, BERT or GPT-2 from transformers (base model or
    sequence classifier, fp32, "sdpa" attention with dropout on, nothing frozen,
    no checkpointing), possibly on the meta device; ``optimizer`` is ``"adamw"``
    or ``"sgd"`` (``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad``;
    ``momentum``, ``dampening``). Anything else is refused with the reason; the
    planner (:func:`course_utils.memory.planner.estimate_training_memory`) covers it.
    """
    return StepBreakdown(**_activation_model.explain(model, optimizer, batch_size, seq_len, **options))


def rule_of_thumb_training_memory(model: torch.nn.Module) -> int:
    """Return the usual rule for training with Adam, in bytes: 16 per fp32 parameter, no activations.

    4 bytes of weights, 4 of gradients, 8 of Adam's two moments: four times
    the model's size. Buffers count four times too: this is exactly what
    ``accelerate estimate-memory`` reports as "Training using Adam" for
    float32 (four times the size from ``accelerate.utils.calculate_maximum_sizes``).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    tensors = [*model.parameters(), *model.buffers()]
    return 4 * sum(t.numel() * t.element_size() for t in tensors)
