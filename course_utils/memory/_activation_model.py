"""The course's analytical model of one fp32 training step: where autograd keeps each byte (lesson 4).

Private: lessons reach it through :func:`course_utils.memory.training_memory.explain_training_memory`.
It counts, tensor by tensor, what autograd saves in each block of a DistilBERT,
BERT or GPT-2 from transformers (base model or sequence classifier, fp32, the
default "sdpa" attention with dropout on, so PyTorch's math attention kernel on
CPU), and the three moments where a step can peak.

Fitted to (byte for byte against torch's MemTracker): torch 2.13.0+cpu and
transformers 5.24.0. It reads transformers' module layout and depends on what
their forward code keeps alive, so after upgrading either, rerun
``pytest tests/test_training_memory.py`` (the analytical model against real
measurements and against the planner) before trusting it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from course_utils.memory.optimizer_state import _nbytes, _state_bytes, _trainable_parameters
from course_utils.optimizers import resolve_options
from course_utils.validation import check_instance, check_positive_int

_FP32_BYTES = 4


# The optimizers and options the training estimate models. Other options change the
# optimizer's temporaries (foreach and fused work on all parameters at once, nesterov
# and coupled weight decay add a gradient-sized tensor) in ways it does not follow.
_TRAINING_OPTIONS: dict[str, frozenset[str]] = {
    "sgd": frozenset({"lr", "momentum", "dampening"}),
    "adamw": frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad"}),
}


def explain(model: torch.nn.Module, optimizer: str, batch_size: int, seq_len: int, **options: object) -> dict:
    """Return the analytical model's account of one fp32 training step of ``model`` on CPU, in bytes.

    ``model`` is a DistilBERT, BERT or GPT-2 from transformers, base model or
    sequence classifier, with the default ("sdpa") attention and attention
    dropout on; built on the meta device is fine, only its config and shapes
    are read. ``optimizer`` is ``"adamw"`` or ``"sgd"``, with the options
    listed in ``_TRAINING_OPTIONS``. The step is the one
    ``measure_training_step_peak`` measures: ``batch_size`` sequences of
    ``seq_len`` tokens without padding, dropout active, the classifier's
    cross-entropy (or a base model's mean hidden state) as loss, backward,
    ``optimizer.step()``, ``optimizer.zero_grad()``.

    Returns a dict: ``weights``, ``gradients``, ``optimizer_state``,
    ``embeddings`` (what autograd keeps from them), ``per_block`` (what it keeps
    in one block, by part, a dict), ``layers``, ``head`` (kept after the last
    block), ``activations`` (all of it once the loss exists) and
    ``peak_by_phase``. The peak is the largest of three moments: the end of
    the forward pass; the backward pass of each block, where its gradients
    pile up while its activations are freed; the optimizer step, with all
    gradients and the optimizer's temporaries.
    """
    if optimizer not in _TRAINING_OPTIONS:
        raise ValueError(f"optimizer must be one of {', '.join(_TRAINING_OPTIONS)}; got {optimizer!r}")
    for option in options:
        if option not in _TRAINING_OPTIONS[optimizer]:
            accepted = ", ".join(sorted(_TRAINING_OPTIONS[optimizer]))
            raise TypeError(f"unknown option {option!r} for the {optimizer!r} training estimate; accepted: {accepted}")
    resolved = resolve_options(optimizer, options)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(seq_len, "seq_len")
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

    per_block = _saved_per_block(net, sizes)
    block_saved = sum(per_block.values())
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
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer_state": optimizer_state,
        "embeddings": embeddings_saved,
        "per_block": per_block,
        "layers": net.layers,
        "head": head_saved - last_output_dropped,
        "activations": activations,
        "peak_by_phase": peaks,
    }


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
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
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


def _saved_per_block(net: _TextTransformer, s: _Sizes) -> dict[str, int]:
    """Return the bytes autograd keeps from one transformer block until its backward pass, by part.

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
    layer_norm_statistics = 2 * 2 * s.per_token
    feed_forward = _SAVED_BY_ACTIVATION[net.activation] * s.intermediate
    residual_path = 4 * s.hidden_state
    # DistilBERT's attention output goes to its residual sum without dropout.
    branches_with_dropout = 1 if net.family == "distilbert" else 2
    masks = branches_with_dropout * _dropout_mask(net.residual_dropout, s.hidden_state)
    return {
        "query, key, value and context copies": 4 * s.hidden_state,
        "attention probabilities, dropout mask, dropped": 3 * s.attention_scores,
        "LayerNorm statistics": layer_norm_statistics,
        "feed-forward activation": feed_forward,
        "residual path": residual_path,
        "residual dropout masks": masks,
    }


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
