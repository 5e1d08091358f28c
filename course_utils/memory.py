"""How much memory training takes: optimizer state exact to the byte, and the peak of one step.

Lesson 2 compares optimizers by the state they keep (Adam's two moments,
Adafactor's factored statistics, bitsandbytes' 8-bit states); lesson 3 adds
weights, gradients and activations to find the peak of one training step.
Both lessons use this module, so that an estimate and the measurement it is
checked against speak the same vocabulary.

- :func:`estimate_optimizer_state` predicts, from parameter shapes and dtypes
  alone, the bytes an optimizer holds after its first ``step()``. It works on a
  model built on the meta device, so a 7B-parameter model costs nothing.
- :func:`make_optimizer` builds the real optimizer for the same name and
  options; :func:`measure_optimizer_state`, :func:`count_optimizer_state_elements`
  and :func:`describe_optimizer_state` read what it really holds.
- :func:`estimate_training_memory` derives the memory of one fp32 training step
  of a DistilBERT, BERT or GPT-2 (weights, gradients, optimizer state,
  activations, and the peak) from the model's config and the batch shape;
  :func:`measure_training_step_peak` measures the same step with torch's
  MemTracker; :func:`rule_of_thumb_training_memory` is the usual 16 bytes per
  parameter, for comparison.

All sizes are in bytes unless a name says otherwise.

bitsandbytes is imported only inside :func:`make_optimizer`:
``accelerate.notebook_launcher`` refuses to start once it has been imported.
"""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from course_utils.optimizers import (  # noqa: F401  (memory.make_optimizer stays importable)
    _OTHER_OPTIONS,
    _STATE_OPTIONS,
    SUPPORTED_OPTIMIZERS,
    _check_optimizer_name,
    _import_bitsandbytes_optim,
    _resolve_options,
    make_optimizer,
)

__all__ = [
    "SUPPORTED_OPTIMIZERS",
    "estimate_optimizer_state",
    "make_optimizer",
    "measure_optimizer_state",
    "count_optimizer_state_elements",
    "describe_optimizer_state",
    "PHASES",
    "TrainingMemory",
    "estimate_training_memory",
    "rule_of_thumb_training_memory",
    "measure_training_step_peak",
]

# bitsandbytes' 8-bit states: one absmax scale per block of 256 elements, and a
# 256-entry fp32 table (one entry per uint8 code) per state, shared by all tensors.
_BNB_BLOCK_SIZE = 256
_BNB_QMAP_ENTRIES = 256
_FP32_BYTES = 4


def _trainable_parameters(model: object) -> list[torch.nn.Parameter]:
    """Return the parameters an optimizer would keep state for: trainable, each tied tensor once."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    # model.parameters() already yields a tied (shared) parameter once.
    return [p for p in model.parameters() if p.requires_grad]


# --------------------------------------------------------------------------- estimate


def estimate_optimizer_state(model: torch.nn.Module, optimizer: str, **options: object) -> int:
    """Return the bytes of state ``optimizer`` will hold for ``model`` after its first ``step()``.

    Only the trainable parameters' shapes and dtypes are read, so ``model``
    may live on the meta device. ``optimizer`` is one of
    :data:`SUPPORTED_OPTIMIZERS`; ``options`` are the constructor options of
    :func:`make_optimizer` (those that do not change the state are accepted
    and ignored). Assumes every trainable parameter receives a gradient: a
    parameter that the loss does not reach gets no state.
    """
    name = _check_optimizer_name(optimizer)
    resolved = _resolve_options(name, options)
    return _state_bytes(_trainable_parameters(model), name, resolved)


def _state_bytes(parameters: list[torch.Tensor], name: str, resolved: dict[str, object]) -> int:
    """Return the optimizer state bytes for ``parameters`` (each one gets a gradient), options resolved."""
    if name == "sgd":
        return sum(_sgd_state_bytes(p, **resolved) for p in parameters)
    if name in ("adam", "adamw"):
        return sum(_adam_state_bytes(p, **resolved) for p in parameters)
    if name == "adafactor":
        return sum(_transformers_adafactor_state_bytes(p, **resolved) for p in parameters)
    if name == "torch_adafactor":
        return sum(_torch_adafactor_state_bytes(p) for p in parameters)
    return _bitsandbytes_state_bytes(parameters, **resolved)


def _nbytes(num_elements: int, dtype: torch.dtype) -> int:
    """Return the bytes of ``num_elements`` elements of ``dtype``."""
    return num_elements * dtype.itemsize


def _sgd_state_bytes(p: torch.Tensor, momentum: float) -> int:
    """Return the bytes SGD keeps for ``p``: nothing without momentum, else a buffer like the gradient."""
    return _nbytes(p.numel(), p.dtype) if momentum != 0 else 0


def _scalar_dtype(fused: bool | None = None) -> torch.dtype:
    """Return the dtype torch.optim gives its 0-d ``step`` tensors (its ``_get_scalar_dtype``)."""
    if fused:
        return torch.float32
    # `capturable` and `foreach` only move `step` to the parameter's device; its dtype
    # follows the default dtype, fp64 only when that is fp64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _adam_state_bytes(p: torch.Tensor, amsgrad: bool, fused: bool | None) -> int:
    """Return the bytes Adam and AdamW keep for ``p``: its moments, and a 0-d ``step`` tensor."""
    moments = 3 if amsgrad else 2  # exp_avg, exp_avg_sq (and max_exp_avg_sq), like the parameter
    return moments * _nbytes(p.numel(), p.dtype) + _scalar_dtype(fused).itemsize


def _transformers_adafactor_state_bytes(p: torch.Tensor, beta1: float | None) -> int:
    """Return the bytes transformers' Adafactor keeps for ``p``."""
    # Statistics are computed from the gradient upcast to fp32 when it is fp16/bf16.
    dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    shape = p.shape
    if len(shape) >= 2:
        # Factored second moment: one value per row, one per column (leading dims kept).
        elements = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        elements = p.numel()  # full exp_avg_sq for vectors and scalars
    if beta1 is not None:
        elements += p.numel()  # exp_avg, the first moment
    # `RMS` is a 0-d tensor computed from the parameter in fp32 (or its own dtype
    # if wider); `step` is a Python int and holds no tensor memory.
    return _nbytes(elements, dtype) + dtype.itemsize


def _torch_adafactor_state_bytes(p: torch.Tensor) -> int:
    """Return the bytes torch.optim.Adafactor keeps for ``p``: statistics in the gradient's dtype, and ``step``."""
    shape = p.shape
    if len(shape) > 1:
        # row_var keeps the shape with its last dim set to 1, col_var with its second-to-last dim set to 1.
        elements = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    else:
        elements = p.numel()  # variance, like the parameter
    return _nbytes(elements, p.dtype) + _scalar_dtype().itemsize


def _bitsandbytes_state_bytes(parameters: list[torch.Tensor], min_8bit_size: int) -> int:
    """Return the bytes bitsandbytes' Adam8bit or AdamW8bit keeps for all of ``parameters``, shared tables once."""
    total = 0
    any_8bit = False
    for p in parameters:
        n = p.numel()
        if n < min_8bit_size:
            total += 2 * _nbytes(n, torch.float32)  # state1 and state2 stay fp32 for small tensors
        else:
            any_8bit = True
            blocks = math.ceil(n / _BNB_BLOCK_SIZE)
            total += 2 * (n + blocks * _FP32_BYTES)  # uint8 state1/state2 plus fp32 absmax1/absmax2
    if any_8bit:
        total += 2 * _BNB_QMAP_ENTRIES * _FP32_BYTES  # qmap1 and qmap2, shared by every 8-bit tensor
    return total


# --------------------------------------------------------------------------- measurement


def _state_storages(optimizer: object):
    """Yield ``(state name, tensor)`` for each distinct storage held in ``optimizer.state``, first holder wins."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    seen: set[tuple[torch.device, int]] = set()
    for per_parameter in optimizer.state.values():
        for state_name, value in per_parameter.items():
            # Python numbers (bitsandbytes' and transformers' `step`) hold no tensor memory.
            if not isinstance(value, torch.Tensor):
                continue
            storage = value.untyped_storage()
            # Tensors can share a storage (bitsandbytes' qmap tables): count it once.
            key = (value.device, storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            yield state_name, value


def measure_optimizer_state(optimizer: torch.optim.Optimizer) -> int:
    """Return the bytes held by the tensors in ``optimizer.state``, each storage counted once."""
    return sum(tensor.untyped_storage().nbytes() for _, tensor in _state_storages(optimizer))


def count_optimizer_state_elements(optimizer: torch.optim.Optimizer) -> int:
    """Return the number of elements (not bytes) held in ``optimizer.state``, each storage counted once."""
    return sum(tensor.untyped_storage().nbytes() // tensor.element_size() for _, tensor in _state_storages(optimizer))


def describe_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, dict[str, object]]:
    """Return, per state name (``"exp_avg"``, ``"qmap1"``...), what ``optimizer`` holds under it.

    Each value is ``{"dtype": str, "tensors": int, "elements": int, "bytes": int}``;
    ``dtype`` lists every dtype seen, e.g. ``"float32, uint8"``. A storage shared
    by several tensors is counted once, under the first name that holds it.
    Summing ``"bytes"`` gives :func:`measure_optimizer_state`.
    """
    rows: dict[str, dict[str, object]] = {}
    dtypes: dict[str, set[str]] = {}
    for state_name, tensor in _state_storages(optimizer):
        row = rows.setdefault(state_name, {"dtype": "", "tensors": 0, "elements": 0, "bytes": 0})
        nbytes = tensor.untyped_storage().nbytes()
        row["tensors"] += 1
        row["elements"] += nbytes // tensor.element_size()
        row["bytes"] += nbytes
        dtypes.setdefault(state_name, set()).add(str(tensor.dtype).removeprefix("torch."))
    for state_name, row in rows.items():
        row["dtype"] = ", ".join(sorted(dtypes[state_name]))
    return rows


# --------------------------------------------------------------------------- one training step: the estimate

PHASES = ("forward", "backward", "optimizer step")


@dataclass(frozen=True)
class TrainingMemory:
    """Memory of one training step, every field in bytes (``phase_of_peak`` excepted).

    - ``weights``: parameters and buffers.
    - ``gradients``: every parameter gradient, as held when the optimizer steps.
    - ``optimizer_state``: what the optimizer keeps between steps.
    - ``activations``: tensors still alive once the forward pass and the loss
      are done, nearly all of them saved by autograd for the backward pass.
    - ``peak``: the most memory held at once over forward, backward and
      optimizer step, temporaries included.
    - ``phase_of_peak``: the one of :data:`PHASES` where the peak is.
    """

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int
    phase_of_peak: str


# The optimizers and options the training estimate models. Other options change the
# optimizer's temporaries (foreach and fused work on all parameters at once, nesterov
# and coupled weight decay add a gradient-sized tensor) in ways it does not follow.
_TRAINING_OPTIONS: dict[str, frozenset[str]] = {
    "sgd": frozenset({"lr", "momentum", "dampening"}),
    "adamw": frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad"}),
}


def estimate_training_memory(
    model: torch.nn.Module, optimizer: str, batch_size: int, seq_len: int, **options: object
) -> TrainingMemory:
    """Return the estimated memory, in bytes, of one fp32 training step of ``model`` on CPU.

    ``model`` is a DistilBERT, BERT or GPT-2 from transformers, base model or
    sequence classifier, with the default ("sdpa") attention and attention
    dropout on; built on the meta device is fine, only its config and shapes
    are read. ``optimizer`` is ``"adamw"`` or ``"sgd"``, with the options
    listed in ``_TRAINING_OPTIONS``. The step is the one
    :func:`measure_training_step_peak` measures: ``batch_size`` sequences of
    ``seq_len`` tokens without padding, dropout active, the classifier's
    cross-entropy (or a base model's mean hidden state) as loss, backward,
    ``optimizer.step()``, ``optimizer.zero_grad()``.

    Activations are counted from what autograd saves in each block (see
    :func:`_saved_per_block`). The peak is the largest of three moments: the
    end of the forward pass; the backward pass of each block, where its
    gradients pile up while its activations are freed; the optimizer step,
    with all gradients and the optimizer's temporaries.
    """
    if optimizer not in _TRAINING_OPTIONS:
        raise ValueError(f"optimizer must be one of {', '.join(_TRAINING_OPTIONS)}; got {optimizer!r}")
    for option in options:
        if option not in _TRAINING_OPTIONS[optimizer]:
            accepted = ", ".join(sorted(_TRAINING_OPTIONS[optimizer]))
            raise TypeError(f"unknown option {option!r} for the {optimizer!r} training estimate; accepted: {accepted}")
    resolved = _resolve_options(optimizer, options)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    net = _describe_text_transformer(model)
    if seq_len > model.config.max_position_embeddings:
        raise ValueError(
            f"seq_len must be at most the model's {model.config.max_position_embeddings} positions, got {seq_len}"
        )
    sizes = _Sizes.of(net, batch_size, seq_len)

    trained = net.embeddings + [p for block in net.blocks for p in _trainable_parameters(block)] + net.head
    weights = _parameter_bytes(model.parameters()) + _parameter_bytes(model.buffers())
    gradients = _parameter_bytes(trained)
    optimizer_state = _state_bytes(trained, optimizer, resolved)
    held_throughout = weights + optimizer_state

    block_saved = _saved_per_block(net, sizes)
    embeddings_saved = _saved_by_embeddings(net, sizes)
    head_saved = _saved_by_head(net, sizes)
    # A base BERT's or DistilBERT's last hidden state is only averaged into the loss: nothing keeps it.
    last_output_dropped = 0 if net.has_classifier or net.family == "gpt2" else sizes.hidden_state
    activations = embeddings_saved + net.layers * block_saved + head_saved - last_output_dropped
    # The forward pass ends at `activations`, and may rise above it just before it returns.
    peaks = {"forward": held_throughout + activations + max(0, _forward_peak_extra(net, sizes, head_saved))}

    # Backward, block by block from the last one: each block adds its gradients and frees what
    # it saved. When a block starts, the gradient flowing in (one hidden state) has taken the
    # place of the block's output, which the layer above has freed; the head's tensors are gone.
    level = held_throughout + embeddings_saved + net.layers * block_saved + _parameter_bytes(net.head)
    backward_peak = level
    for block in reversed(net.blocks):
        backward_peak = max(backward_peak, level + _block_backward_extra(net, sizes, block, block_saved))
        level += _parameter_bytes(_trainable_parameters(block)) - block_saved
    # The embeddings' gradients come last, while the gradient of their output is still held.
    peaks["backward"] = max(backward_peak, held_throughout + gradients + sizes.hidden_state)

    peaks["optimizer step"] = held_throughout + gradients + _optimizer_temporaries(trained, optimizer)
    phase_of_peak = max(PHASES, key=peaks.__getitem__)
    return TrainingMemory(
        weights=weights,
        gradients=gradients,
        optimizer_state=optimizer_state,
        activations=activations,
        peak=peaks[phase_of_peak],
        phase_of_peak=phase_of_peak,
    )


def _parameter_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Return the bytes of ``tensors`` (parameters or buffers), each at its own dtype."""
    return sum(_nbytes(t.numel(), t.dtype) for t in tensors)


@dataclass(frozen=True)
class _TextTransformer:
    """What the training estimate reads from a model: its config's sizes and dropouts, its parameter groups."""

    family: str  # "distilbert", "bert" or "gpt2"
    has_classifier: bool  # a sequence-classification head, or a base model
    hidden: int
    intermediate: int  # the feed-forward width
    layers: int
    heads: int
    num_labels: int
    activation: str  # "gelu", "relu" or "gelu_new"
    residual_dropout: float  # on each block's branches before their residual sum
    embedding_dropout: float
    attention_dropout: float
    classifier_dropout: float
    use_cache: bool  # GPT-2 keeps a copy of every block's keys until its forward returns
    embeddings: list[torch.nn.Parameter]  # trainable ones
    blocks: list[torch.nn.Module]
    head: list[torch.nn.Parameter]  # trainable and reached by the loss: final LayerNorm, pooler, classifier


def _describe_text_transformer(model: object) -> _TextTransformer:
    """Return what the estimate needs from a DistilBERT, BERT or GPT-2 model (base or classifier)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    from transformers import (
        BertForSequenceClassification,
        BertModel,
        DistilBertForSequenceClassification,
        DistilBertModel,
        GPT2ForSequenceClassification,
        GPT2Model,
    )

    families = {
        DistilBertModel: ("distilbert", False),
        DistilBertForSequenceClassification: ("distilbert", True),
        BertModel: ("bert", False),
        BertForSequenceClassification: ("bert", True),
        GPT2Model: ("gpt2", False),
        GPT2ForSequenceClassification: ("gpt2", True),
    }
    if type(model) not in families:
        raise ValueError(f"model must be one of {', '.join(c.__name__ for c in families)}; got {type(model).__name__}")
    not_fp32 = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if not_fp32:
        raise ValueError(f"the estimate models fp32 training; model has parameters in {', '.join(not_fp32)}")
    config = model.config
    if config._attn_implementation != "sdpa":
        raise ValueError(
            f"the estimate models the default 'sdpa' attention; model uses {config._attn_implementation!r}"
        )
    family, has_classifier = families[type(model)]
    describe = {"distilbert": _describe_distilbert, "bert": _describe_bert, "gpt2": _describe_gpt2}[family]
    sizes, embeddings, blocks = describe(model, config, has_classifier)
    if sizes["activation"] not in _SAVED_BY_ACTIVATION:
        raise ValueError(
            f"the estimate models the activations {', '.join(_SAVED_BY_ACTIVATION)}; model uses {sizes['activation']!r}"
        )
    if sizes["attention_dropout"] <= 0:
        raise ValueError(
            "the estimate models attention with dropout on (PyTorch's math attention kernel); with attention "
            "dropout 0 PyTorch picks its fused kernel, which keeps other tensors"
        )
    # A base BERT computes a pooled output that its loss (the mean hidden state)
    # never reaches: the pooler gets no gradient and no optimizer state.
    unreached = model.pooler if family == "bert" and not has_classifier and model.pooler is not None else None
    elsewhere = {id(p) for module in (embeddings, blocks, unreached) if module is not None for p in module.parameters()}
    return _TextTransformer(
        family=family,
        has_classifier=has_classifier,
        num_labels=config.num_labels,
        **sizes,
        embeddings=_trainable_parameters(embeddings),
        blocks=list(blocks),
        head=[p for p in _trainable_parameters(model) if id(p) not in elsewhere],
    )


def _describe_distilbert(model, config, has_classifier):
    """Return the sizes and dropouts of a DistilBERT's config, its embeddings module and its blocks."""
    base = model.distilbert if has_classifier else model
    sizes = {
        "hidden": config.dim,
        "intermediate": config.hidden_dim,
        "layers": config.n_layers,
        "heads": config.n_heads,
        "activation": config.activation,
        "residual_dropout": config.dropout,
        "embedding_dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "classifier_dropout": config.seq_classif_dropout,
        "use_cache": False,
    }
    return sizes, base.embeddings, base.transformer.layer


def _describe_bert(model, config, has_classifier):
    """Return the sizes and dropouts of a BERT's config, its embeddings module and its blocks."""
    base = model.bert if has_classifier else model
    classifier_dropout = config.classifier_dropout
    sizes = {
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "activation": config.hidden_act,
        "residual_dropout": config.hidden_dropout_prob,
        "embedding_dropout": config.hidden_dropout_prob,
        "attention_dropout": config.attention_probs_dropout_prob,
        "classifier_dropout": config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout,
        "use_cache": False,
    }
    return sizes, base.embeddings, base.encoder.layer


def _describe_gpt2(model, config, has_classifier):
    """Return the sizes and dropouts of a GPT-2's config, its embeddings (as one module) and its blocks."""
    base = model.transformer if has_classifier else model
    sizes = {
        "hidden": config.n_embd,
        "intermediate": config.n_inner or 4 * config.n_embd,
        "layers": config.n_layer,
        "heads": config.n_head,
        "activation": config.activation_function,
        "residual_dropout": config.resid_pdrop,
        "embedding_dropout": config.embd_pdrop,
        "attention_dropout": config.attn_pdrop,
        "classifier_dropout": 0.0,  # GPT-2's classifier has no dropout
        "use_cache": bool(config.use_cache),
    }
    return sizes, torch.nn.ModuleList([base.wte, base.wpe]), base.h


@dataclass(frozen=True)
class _Sizes:
    """Bytes of the fp32 tensors a training step is made of (``batch_size`` and ``seq_len`` excepted)."""

    batch_size: int
    seq_len: int
    hidden_state: int  # one value per token and hidden unit
    intermediate: int  # one value per token and feed-forward unit
    attention_scores: int  # one value per head and pair of tokens
    per_token: int  # one value per token: LayerNorm's mean, or its inverse std
    per_sequence_hidden: int  # one value per sequence and hidden unit: the classifier's input
    feed_forward_weight: int  # the feed-forward output projection's weight
    position_embeddings: int  # one value per position and hidden unit

    @classmethod
    def of(cls, net: _TextTransformer, batch_size: int, seq_len: int) -> _Sizes:
        tokens = batch_size * seq_len
        return cls(
            batch_size=batch_size,
            seq_len=seq_len,
            hidden_state=_FP32_BYTES * tokens * net.hidden,
            intermediate=_FP32_BYTES * tokens * net.intermediate,
            attention_scores=_FP32_BYTES * batch_size * net.heads * seq_len * seq_len,
            per_token=_FP32_BYTES * tokens,
            per_sequence_hidden=_FP32_BYTES * batch_size * net.hidden,
            feed_forward_weight=_FP32_BYTES * net.intermediate * net.hidden,
            position_embeddings=_FP32_BYTES * seq_len * net.hidden,
        )


# Intermediate-sized tensors (tokens x feed-forward units) autograd keeps per activation:
# GELU keeps its input, and the next Linear keeps GELU's output; ReLU's output serves
# both; transformers' "gelu_new" is the tanh formula written in Python and keeps five:
# its input, 0.5 * input, the tanh, 1 + tanh and the product.
_SAVED_BY_ACTIVATION = {"gelu": 2, "relu": 1, "gelu_new": 5}
# Intermediate-sized gradients the activation's backward holds at once: ReLU keeps its
# output for its own backward; gelu_new's final product yields two gradients at once.
_HELD_IN_ACTIVATION_BACKWARD = {"gelu": 1, "relu": 2, "gelu_new": 2}


def _dropout_mask(probability: float, size: int) -> int:
    """Return ``size`` if the dropout is on (p > 0), else 0: on CPU a dropout keeps an fp32 mask like its input."""
    return size if probability > 0 else 0


def _saved_per_block(net: _TextTransformer, s: _Sizes) -> int:
    """Return the bytes autograd keeps from one transformer block until its backward pass.

    Common to the three families, with PyTorch's math attention kernel:
    - query, key and value, copied contiguous for the batched matmuls: 3 hidden states;
    - softmax output, attention-dropout mask and dropped probabilities: 3 score tensors;
    - the attention context, copied contiguous for the output projection: 1 hidden state;
    - per LayerNorm (two), a mean and an inverse std per token;
    - the feed-forward activation's tensors (``_SAVED_BY_ACTIVATION``);
    - a dropout mask per residual branch with dropout;
    - four hidden states on the residual path. Post-LN (BERT, DistilBERT): each
      LayerNorm's input (a residual sum) and output (the next projection's input,
      the second one being the block's output). Pre-LN (GPT-2): each LayerNorm's
      output, the sum between attention and MLP, and the block's output.
    """
    attention = 4 * s.hidden_state + 3 * s.attention_scores
    layer_norm_statistics = 2 * 2 * s.per_token
    feed_forward = _SAVED_BY_ACTIVATION[net.activation] * s.intermediate
    residual_path = 4 * s.hidden_state
    # DistilBERT's attention output goes to its residual sum without dropout.
    branches_with_dropout = 1 if net.family == "distilbert" else 2
    masks = branches_with_dropout * _dropout_mask(net.residual_dropout, s.hidden_state)
    return attention + layer_norm_statistics + feed_forward + residual_path + masks


def _saved_by_embeddings(net: _TextTransformer, s: _Sizes) -> int:
    """Return the bytes autograd keeps from the embeddings: what makes the first block's input."""
    mask = _dropout_mask(net.embedding_dropout, s.hidden_state)
    if net.family == "gpt2":
        # The sum of token and position embeddings, or with dropout its mask and the dropped sum.
        return s.hidden_state + mask
    # The sum, kept with its statistics by the LayerNorm, and the LayerNorm's output,
    # or with dropout its mask and the dropped output.
    saved = 2 * s.hidden_state + 2 * s.per_token + mask
    if net.family == "bert":
        saved += 8 * s.seq_len  # token_type_ids gathered from a buffer: one int64 per position
    return saved


def _saved_by_head(net: _TextTransformer, s: _Sizes) -> int:
    """Return the bytes kept after the last block: final LayerNorm, classifier, loss."""
    saved = 2 * s.per_token if net.family == "gpt2" else 0  # ln_f's statistics
    if not net.has_classifier:
        return saved + _FP32_BYTES  # the loss
    logits = _FP32_BYTES * s.batch_size * net.num_labels
    loss_and_weight = 2 * _FP32_BYTES
    if net.family == "gpt2":
        # ln_f's output (GPT-2 scores every token) and each sequence's last-token index;
        # cross-entropy keeps its log-softmax.
        return saved + s.hidden_state + 8 * s.batch_size + logits + loss_and_weight
    # The first token of each sequence through a Linear and an activation (its output
    # kept), dropout, the classifier; cross-entropy keeps its log-softmax.
    dropout = 2 * _dropout_mask(net.classifier_dropout, s.per_sequence_hidden)  # mask and output
    return s.per_sequence_hidden + dropout + logits + loss_and_weight


def _forward_peak_extra(net: _TextTransformer, s: _Sizes, head_saved: int) -> int:
    """Return how far the forward pass rises above what it leaves behind: tensors held until it returns.

    The rise is at the last block's final residual sum, where local variables of
    the model's Python code still hold branch outputs.
    """
    if net.family == "gpt2":
        # The block holds its attention output, its MLP output and the MLP's dropout output;
        # GPT2Model holds the token and position embeddings, and its cache a copy of every
        # block's keys. The block's output, ln_f and the head are not made yet.
        branch_outputs = 2 * s.hidden_state + _dropout_mask(net.residual_dropout, s.hidden_state)
        cache = net.layers * s.hidden_state if net.use_cache else 0
        held = branch_outputs + cache + s.hidden_state + s.position_embeddings
        return held - s.hidden_state - head_saved
    # The feed-forward output is held while the last LayerNorm runs; the head is not made
    # yet. A base model's last hidden state is alive until the loss is taken.
    if net.has_classifier:
        return s.hidden_state - head_saved
    return 2 * s.hidden_state


def _block_backward_extra(net: _TextTransformer, s: _Sizes, block: torch.nn.Module, block_saved: int) -> int:
    """Return the most bytes one block's backward pass holds above the level it starts at.

    Two candidates: the feed-forward part, where the activation's gradients meet
    the output projection's weight gradient; and the attention core, where the
    gradient of the attention probabilities (one score tensor) arrives while the
    block has freed everything but its attention's saved tensors.
    """
    if net.family == "gpt2":
        layer_norm_first = 0  # pre-LN: the block's backward starts with the MLP's dropout
    else:
        # Post-LN: the last LayerNorm's backward makes one gradient and its weight gradients,
        # and frees its input, its statistics and the incoming gradient.
        layer_norm_first = 2 * _FP32_BYTES * net.hidden - s.hidden_state - 2 * s.per_token
    projection_gradients = s.feed_forward_weight + _FP32_BYTES * net.hidden  # weight and bias
    # With dropout, the gradient through its mask is freed once the projection is done.
    dropped_gradient = _dropout_mask(net.residual_dropout, s.hidden_state)
    held_in_activation = _HELD_IN_ACTIVATION_BACKWARD[net.activation] * s.intermediate - dropped_gradient
    feed_forward = layer_norm_first + projection_gradients + max(s.intermediate, held_in_activation)

    # Still kept at the attention core: query, key and value copies and the three score
    # tensors (and GPT-2's first LayerNorm, whose backward comes after). The block's
    # output was freed before the block began.
    kept = 3 * s.hidden_state + 3 * s.attention_scores
    if net.family == "gpt2":
        kept += s.hidden_state + 2 * s.per_token
    freed = block_saved - kept - s.hidden_state
    # Every gradient of the block exists by then but those of the modules run before the core.
    gradients = _parameter_bytes(_trainable_parameters(block))
    gradients -= _parameter_bytes(_trainable_parameters(_modules_before_attention_core(net, block)))
    # The gradient of the probabilities, of the values and a contiguous copy of the context's.
    attention = s.attention_scores + 2 * s.hidden_state + gradients - freed
    return max(feed_forward, attention)


def _modules_before_attention_core(net: _TextTransformer, block: torch.nn.Module) -> torch.nn.Module:
    """Return the modules of ``block`` that run before the attention core: their gradients come after it."""
    if net.family == "gpt2":
        return torch.nn.ModuleList([block.ln_1, block.attn.c_attn])
    if net.family == "distilbert":
        attention = block.attention
        return torch.nn.ModuleList([attention.q_lin, attention.k_lin, attention.v_lin])
    attention = block.attention.self
    return torch.nn.ModuleList([attention.query, attention.key, attention.value])


def _optimizer_temporaries(parameters: list[torch.Tensor], optimizer: str) -> int:
    """Return the most bytes of temporaries the optimizer step holds at once (CPU: one parameter at a time).

    On CPU torch.optim updates one parameter after another. AdamW computes
    ``denom = exp_avg_sq.sqrt() / c``: two parameter-sized tensors, the square
    root freed after the division; ``denom`` lives on (a Python variable) into
    the next parameter's iteration. SGD, without nesterov or weight decay,
    works in place.
    """
    if optimizer == "sgd":
        return 0
    most = previous = 0
    for p in parameters:
        current = _nbytes(p.numel(), p.dtype)
        most = max(most, previous + 2 * current)
        previous = current
    return most


def rule_of_thumb_training_memory(model: torch.nn.Module) -> int:
    """Return the usual rule for training with Adam, in bytes: 16 per fp32 parameter, no activations.

    4 bytes of weights, 4 of gradients, 8 of Adam's two moments: four times
    the model's size. Buffers count four times too: this is exactly what
    ``accelerate estimate-memory`` reports as "Training using Adam" for
    float32 (four times the size from ``accelerate.utils.calculate_maximum_sizes``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return 4 * (_parameter_bytes(model.parameters()) + _parameter_bytes(model.buffers()))


# --------------------------------------------------------------------------- one training step: the measurement


def _default_loss(outputs) -> torch.Tensor:
    """Return the model's own loss, or for a base model (no labels, no loss) the mean of its last hidden state."""
    loss = getattr(outputs, "loss", None)
    if loss is not None:
        return loss
    return outputs.last_hidden_state.mean()


def measure_training_step_peak(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, torch.Tensor],
    loss_fn: Callable[[object], torch.Tensor] = _default_loss,
) -> TrainingMemory:
    """Return the memory of one training step of ``model`` on ``batch``, measured with torch's MemTracker.

    The step is ``loss_fn(model(**batch)).backward()``, ``optimizer.step()``,
    ``optimizer.zero_grad()``, in training mode. A warm-up step runs first, so
    that the optimizer state exists as from the second step on; the second
    step is measured. The default loss is the model's own (put labels in
    ``batch``), or for a base model the mean of its last hidden state. The
    model's weights take the two steps: pass a model you can spare.

    MemTracker sees every tensor storage PyTorch allocates. Its module hooks
    can hold a gradient longer than autograd alone: a module called with two
    tensors (BERT's output layers) keeps the first one's gradient until the
    second's arrives, which can raise BERT's backward peak by up to one
    feed-forward-sized tensor over an untracked run.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(batch, Mapping) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
        raise TypeError(f"batch must be a mapping of argument names to tensors, got {type(batch).__name__}")
    from torch.distributed._tools.mem_tracker import MemTracker

    model.train()
    # Warm-up. The model's outputs are dropped as soon as the loss exists, as in a loop that keeps only the loss.
    loss_fn(model(**batch)).backward()
    optimizer.step()
    optimizer.zero_grad()

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    running_peaks = []  # the peak so far, after each phase
    with warnings.catch_warnings():
        # transformers builds some modules inside forward (the classifier's ReLU,
        # CrossEntropyLoss); they are gone by backward, and MemTracker warns that it
        # skips their hooks. Totals are unaffected.
        warnings.filterwarnings("ignore", message="Module is None. Skipping", category=UserWarning)
        with tracker:
            loss = loss_fn(model(**batch))
            # MemTracker's hooks put the model's outputs in reference cycles: an output
            # the loss does not use (BERT's pooler branch) would otherwise live until the
            # next garbage collection, when without the tracker it is freed at once.
            gc.collect()
            after_forward = _cpu_snapshot(tracker, "current")
            running_peaks.append(_cpu_snapshot(tracker, "peak")["Total"])
            loss.backward()
            after_backward = _cpu_snapshot(tracker, "current")
            running_peaks.append(_cpu_snapshot(tracker, "peak")["Total"])
            del loss
            optimizer.step()
            optimizer.zero_grad()
            after_step = _cpu_snapshot(tracker, "current")
            running_peaks.append(_cpu_snapshot(tracker, "peak")["Total"])
    peak = running_peaks[-1]
    return TrainingMemory(
        weights=after_step["Parameter"] + after_step["Buffer"],
        gradients=after_backward["Gradient"],
        optimizer_state=after_step["Optstate"],
        activations=after_forward["Activation"],
        peak=peak,
        phase_of_peak=PHASES[running_peaks.index(peak)],
    )


def _cpu_snapshot(tracker, kind: str) -> dict[str, int]:
    """Return MemTracker's ``kind`` snapshot ("current" or "peak") of the CPU as {category: bytes}."""
    snapshot = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    # Keys are MemTracker's category enum members (their value is the name) and the string "Total".
    by_name = {getattr(key, "value", key): int(value) for key, value in snapshot.items()}
    categories = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other", "Total")
    return {name: by_name.get(name, 0) for name in categories}
