"""The memory planner: the peak of one training step of any model, by running the step on fake tensors (lesson 4).

:func:`estimate_training_memory` rebuilds the model under torch's
``FakeTensorMode`` (tensors with shapes, dtypes and devices but no data: no
memory is allocated, no arithmetic is done) and follows on it the training
step :func:`course_utils.memory.training_memory.measure_training_step_peak` measures
for real (a warm-up step, then the measured step under torch's MemTracker), on
the same tracker. So it applies to any model and optimizer the real step
applies to, and what it follows is what runs:
torch's optimizers (their foreach and fused variants included), both
Adafactors, and bitsandbytes' 8-bit Adam and AdamW (their CPU update, written
in torch operations, is followed inside; see ``training_memory``).

A stack of identical blocks costs a fixed amount plus the same amount per
block, so for a deep model it follows copies with 1, 2 and 3 blocks (one block
deeper each, 2, 3 and 4, then 3, 4 and 5..., while a shallow copy peaks
elsewhere), checks that each quantity grows by the same number of bytes per
block, and extrapolates to the model's depth (``course_utils.memory.probes``). A model whose blocks differ
(some frozen, a mix of attention types) is followed whole, which is exact but
slower.

Fast enough for a slider: the forward and backward passes do not depend on
the optimizer (its state is there and unchanged, so it adds the same bytes to
every moment of them), and the optimizer step does not depend on the batch
(it starts from what the backward pass leaves and allocates the same on top),
so the two are followed apart, each cached, and added up. Changing the
optimizer re-runs only its step; changing the batch re-runs only the passes.
Whole answers are cached too, keyed by the model's fingerprint and the
:class:`~course_utils.memory.setup.TrainingSetup` (:func:`plan` takes one;
:func:`estimate_training_memory` makes one from its arguments, which checks
them): a repeated estimate costs milliseconds. The machinery, and the tests that hold every shortcut equal to
the byte to the full fake step, are in ``course_utils.memory.fake_step`` (with its
version notes); the tools it runs fake copies with in ``fake_tensors``, its one cache and
refusal in ``plan_cache``. What each process of a layout holds (``world_size``,
``sharding``, ``rank``) is decided in ``course_utils.memory.per_process``.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Callable, Iterator

import torch

from course_utils.layouts import SHARDING, Layout
from course_utils.memory.fake_step import passes
from course_utils.memory.per_process import blocks_followed, checked_layout, process_copy, records_timelines, whole_process
from course_utils.memory.plan_cache import PlannerRefused, cache, model_fingerprint
from course_utils.memory.model_families import length_limit, main_input, random_in_training, refuse_multimodal_input, text_config
from course_utils.memory.probes import PROBE_LAYERS, plan_by_probes, repeated_layers
from course_utils.memory.qlora import refuse_what_cannot_be_followed
from course_utils.memory.setup import TrainingSetup
from course_utils.memory.training_memory import TrainingMemory, head_kind
from course_utils.validation import check_choice, check_instance, check_int_in_range, check_positive_int

__all__ = ["DEVICE_NOTE", "estimate_training_memory", "plan", "PlannerRefused", "reporting_progress"]

DEVICE_NOTE = (
    "Follows the CPU's kernels and allocator, as the course's machine runs them: PyTorch's CPU attention "
    "kernels, optimizers updating one parameter at a time unless foreach=True or fused=True is passed, every "
    "tensor counted at its exact size. On a CUDA GPU the attention kernel differs (flash or memory-efficient "
    "attention keep less than the math kernel), torch.optim defaults to foreach (one extra copy of the "
    "parameters during the step), bitsandbytes runs fused CUDA kernels without the CPU update's fp32 working "
    "copies, the caching allocator rounds sizes up and keeps freed blocks, and CUDA itself takes a few hundred "
    "MiB: plan some headroom. bitsandbytes' paged optimizers (paged_adamw8bit, paged_adamw32bit) keep their state "
    "in CUDA unified memory, which pages it out to CPU memory when the GPU runs short (bitsandbytes' optimizer "
    "reference, huggingface.co/docs/bitsandbytes); on the CPU there is nothing to page, and the plan counts that "
    "state as resident."
)

_report: contextvars.ContextVar[Callable[[int, int], None] | None] = contextvars.ContextVar("report", default=None)


@contextlib.contextmanager
def reporting_progress(report: Callable[[int, int], None]) -> Iterator[None]:
    """Within this block, the planner calls ``report(done, total)`` each time it has followed a copy of a model.

    For a progress bar: ``total`` is the copies the estimate expects to follow
    (1 for a model followed whole, 3 for the probes, one more each time they
    slide a block deeper). A copy followed before comes from the cache at once.
    """
    if not callable(report):
        raise TypeError(f"report must be a function of (done, total), got {type(report).__name__}")
    token = _report.set(report)
    try:
        yield
    finally:
        _report.reset(token)


def estimate_training_memory(
    model: torch.nn.Module,
    optimizer: str,
    batch_size: int,
    seq_len: int,
    *,
    mixed_precision: str = "no",
    gradient_accumulation_steps: int = 1,
    world_size: int = 1,
    sharding: str = "none",
    rank: int = 0,
    layout: Layout | None = None,
    **optimizer_options: object,
) -> TrainingMemory:
    """Return the memory of one training step of ``model``, in bytes, followed on fake tensors (no memory used).

    - ``model``: a transformers model (base model, sequence or token
      classifier, question answering head, causal or masked LM, mixture of
      experts, encoder-decoder language model such as ``MarianMTModel`` or
      ``WhisperForConditionalGeneration``, image or audio classifier, or a
      PEFT model around one; see :func:`course_utils.memory.training_memory.head_kind`
      and :mod:`course_utils.memory.model_families` for the input each family gets),
      real, on the meta device or fake. Its dtype (pure bf16 storage when built in
      bf16), frozen parameters (``requires_grad``), LoRA adapters, 4-bit
      bitsandbytes weights (QLoRA, :mod:`course_utils.memory.qlora`) and
      activation checkpointing (``activation_checkpointing_enable()`` or
      torch's checkpoint wrappers) are read from it. It is not modified.
    - ``optimizer``: a name of :func:`course_utils.optimizers.make_optimizer`
      (``SUPPORTED_OPTIMIZERS``: torch's SGD, Adam, AdamW, Adafactor, Adadelta,
      Adagrad, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop; transformers'
      Adafactor; bitsandbytes' Adam8bit, AdamW8bit and paged AdamW,
      ``paged_adamw8bit`` and ``paged_adamw32bit``), with its constructor
      options (``foreach=True``, ``fused=True``, ``momentum=0.9``...).
    - ``batch_size``: sequences in one forward pass (the micro-batch when
      accumulating), each ``seq_len`` tokens; inputs are ``input_ids`` with the
      labels the head takes (:func:`course_utils.memory.training_memory.training_batch`);
      for images ``seq_len`` is the side of the image in pixels, for raw audio
      its samples, for Whisper the decoder's label tokens
      (:mod:`course_utils.memory.model_families`).
    - ``mixed_precision``: as Accelerate means it: "no", or "bf16" (fp32
      weights, gradients and state; the forward pass under CPU bf16 autocast).
      "fp16" is refused (Accelerate does not autocast fp16 on CPU).
    - ``gradient_accumulation_steps``: forward and backward passes per optimizer step.
    - ``world_size``, ``sharding``, ``rank`` (lesson 7): the memory of process
      ``rank`` of ``world_size`` data-parallel processes, each training on its
      own ``batch_size`` sequences. ``sharding`` is "ddp" (one process's step
      plus DDP's gradient buckets, ``per_process.with_ddp_buckets``; every process the
      same); "zero1" (the model in DDP, the optimizer torch's
      ``ZeroRedundancyOptimizer`` over its trainable parameters: the process
      holds the state of the whole tensors torch assigns it, so processes
      differ); "zero2" (FSDP2 with ``reshard_after_forward=False``) or
      "zero3"/"fsdp" (``fully_shard`` on each block, then the root), both
      followed on a fake process group (the last processes hold the padding of
      dim 0, so they may hold a few bytes less); or "none" (the default, one
      process).
    - ``layout`` (lesson 9; instead of ``world_size`` and ``sharding``): a
      :class:`course_utils.layouts.Layout`, which may split the model too, for
      process ``rank`` (the global rank). With ``tp`` > 1 (and
      ``sequence_parallel``), a run whose blocks are split by
      ``layouts.tensor_parallel_plan``, followed on a fake process group
      (``memory.tensor_parallel_step``). With ``pp`` stages, process ``rank``
      runs stage ``rank`` (``layouts.pipeline_stage``: a Llama-family causal
      LM, its blocks divided as torchtitan divides them) under torch's
      ``schedule`` ("gpipe" or "1f1b"): ``batch_size`` is then the whole batch,
      divided into ``layout.microbatches`` micro-batches (it must divide), and
      the activations are those the stage holds at the schedule's worst moment
      (``memory.pipeline_stages``).
      Context parallelism (``Layout("none", cp, cp=cp)``, a causal language
      model): process ``rank``'s step on its ``seq_len / cp`` tokens of each
      sequence, attention by a ring (``memory.context_parallel``).

    The step is the one :func:`course_utils.memory.training_memory.measure_training_step_peak`
    measures (see there). See :data:`DEVICE_NOTE` for whose kernels it follows.
    Raises :class:`PlannerRefused` (a ValueError) naming the model, what it
    cannot follow and what would make it work; any error while following the
    step reaches the caller as one (bad arguments raise ValueError or TypeError).
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    setup = TrainingSetup(optimizer, batch_size, seq_len, mixed_precision, gradient_accumulation_steps,
                          optimizer_options)
    return plan(model, setup, world_size=world_size, sharding=sharding, rank=rank, layout=layout)


def plan(model: torch.nn.Module, setup: TrainingSetup, *, world_size: int = 1,
         sharding: str = "none", rank: int = 0, layout: Layout | None = None) -> TrainingMemory:
    """Return the memory of one training step of ``model`` with ``setup`` (a :class:`TrainingSetup`), in bytes.

    :func:`estimate_training_memory` with the set-up's choices in one value
    (checked when it was made); see there for ``model``, ``world_size``,
    ``sharding``, ``rank`` and ``layout``. Cached by the model's fingerprint and the set-up.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(setup, "setup", TrainingSetup, "a TrainingSetup")
    check_positive_int(world_size, "world_size")
    check_choice(sharding, "sharding", SHARDING)
    if layout is None:
        check_int_in_range(rank, "rank", 0, world_size - 1)
        layout = Layout.of(sharding, world_size)
    else:
        layout = checked_layout(layout, setup, world_size, sharding, rank)
    if setup.seq_len % layout.cp:
        raise ValueError(f"seq_len must be divisible by the layout's cp={layout.cp}, got {setup.seq_len}")
    config = getattr(model, "config", None)
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    multimodal = refuse_multimodal_input(inner)
    if multimodal is not None:
        raise PlannerRefused(multimodal)
    if config is None or (getattr(model, "main_input_name", "input_ids") == "input_ids"
                          and not hasattr(text_config(config), "vocab_size")):
        raise PlannerRefused(
            f"model: the planner builds the batch from a transformers config (vocab_size, labels), its own or "
            f"its text part's (get_text_config()); {type(model).__name__} has none. Give the model a transformers "
            f"config, or measure its step on your own batch with measure_training_step_peak"
        )
    try:
        head_kind(model)  # refuses a head whose labels it does not know
        main_input(model)  # and an input it does not know
    except PlannerRefused:
        raise
    except ValueError as error:
        raise PlannerRefused(str(error)) from error
    refuse_what_cannot_be_followed(model, PlannerRefused)
    text = text_config(config)
    if getattr(text, "is_encoder_decoder", False) and getattr(text, "decoder_start_token_id", None) is None \
            and head_kind(model) == "language model":
        raise PlannerRefused(
            f"model: {type(model).__name__}'s config has no decoder_start_token_id, so its decoder cannot shift the "
            f"labels into its inputs (the real step fails too). Set config.decoder_start_token_id (T5 and its "
            f"family: the padding token, 0)"
        )
    random_draw = random_in_training(model)
    if random_draw is not None:
        raise PlannerRefused(random_draw)
    positions, why = _usable_positions(model, config)
    if positions is not None and setup.seq_len > positions:
        raise ValueError(f"seq_len must be at most the model's {positions} positions{why}, got {setup.seq_len}")
    fingerprint = model_fingerprint(model)  # once per estimate: every cache below is keyed by it
    key = ("estimate", fingerprint.passes, setup, layout, rank)
    if key not in cache:
        # The step's garbage collections (see measure_training_step_peak) then skip
        # the objects that exist already: most of their time, none of what they free.
        gc.freeze()
        try:
            planned = _plan(_Copies(model, setup, layout, fingerprint, rank))
            cache[key] = whole_process(planned, model, setup, layout, rank, fingerprint)
        except Exception as error:  # noqa: BLE001 - whatever stops the planner reaches the user as a refusal
            raise _refusal_naming(model, error) from error
        finally:
            gc.unfreeze()
    return cache[key]


def _refusal_naming(model: torch.nn.Module, error: Exception) -> PlannerRefused:
    """Return ``error`` as a :class:`PlannerRefused` that names ``model``'s class (an unforeseen error says what to do)."""
    name = type(model).__name__
    if isinstance(error, PlannerRefused):
        return error if name in str(error) else PlannerRefused(f"{error} (model: {name})")
    # The library's own words stay in the chained cause: a refusal's reason is the planner's.
    return PlannerRefused(
        f"model {name}: the planner could not follow its training step on fake tensors (an internal failure: "
        f"{type(error).__name__}, its message is this refusal's cause). Measure the step for real instead "
        f"(measure_training_step_peak on a small config of the same family)"
    )


def _plan(copies: _Copies) -> TrainingMemory:
    """Return the step's memory: the whole model followed, or copies with 1-3 blocks extrapolated."""
    layers, layer_list = blocks_followed(copies.model, copies.layout, copies.rank)
    # Probes cost about as much as a run of as many blocks as they have together: a shallow
    # model is followed whole, which is exact and no slower.
    if layer_list is None or layers <= sum(PROBE_LAYERS):
        return copies.follow(None)[0]
    copies.expected = len(PROBE_LAYERS)
    planned = plan_by_probes(layers, copies.follow, copies.expect_one_more, copies.timeline_of)
    if planned is None:
        copies.expect_one_more()
        planned = copies.follow(None)[0]
    return planned


class _Copies:
    """The copies of one model one estimate follows, counted for :func:`reporting_progress`.

    ``expected`` is raised before each copy beyond the first plan, so ``done`` never exceeds it.
    """

    def __init__(self, model, setup, layout, fingerprint, rank=0):
        self.model, self.setup, self.layout, self.rank = model, setup, layout, rank
        self.fingerprint = fingerprint
        self.done, self.expected, self._report = 0, 1, _report.get()

    def expect_one_more(self) -> None:
        """Count one more copy than planned (the probes slid deeper, or the model followed whole)."""
        self.expected += 1

    def timeline_of(self, layers: int) -> tuple | None:
        """Return the timeline of the passes :meth:`follow` followed on ``layers`` blocks (one process), else None."""
        if not records_timelines(self.layout):
            return None
        return passes(self.model, self.setup, layers, self.fingerprint).timeline  # from the cache

    def follow(self, layers: int | None) -> tuple[TrainingMemory, list]:
        """Return the step on the first ``layers`` blocks of the model (all if None), and report it."""
        run = process_copy(self.model, self.setup, self.layout, self.rank, layers, self.fingerprint)
        self.done += 1
        if self._report is not None:
            self._report(self.done, self.expected)
        return run


def _usable_positions(model: torch.nn.Module, config) -> tuple[int | None, str]:
    """Return how many tokens the model's position table takes (None if it has no limit), and why if not its size.

    A fake step cannot see an index past the table (it has no values to check),
    so a sequence the real step would refuse must be refused here.
    """
    positions, why = length_limit(model)
    if positions is None or why:
        return positions, why
    inputs = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    for module in model.modules():
        # RoBERTa and its family number positions from padding_idx + 1 (transformers'
        # create_position_ids_from_input_ids), so their table holds that many fewer tokens.
        if (isinstance(module, torch.nn.Embedding) and module is not inputs and module.num_embeddings == positions
                and module.padding_idx is not None):
            return positions - module.padding_idx - 1, f" (its table of {positions} starts at padding_idx + 1)"
    return positions, ""
