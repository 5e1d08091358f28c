"""Models used by the lessons: the tiny offline checkpoint and full-size architectures.

Introduced in lesson 1; lessons 2 and 3 use the full-size architectures to count
parameters and optimizer memory without downloading any weights.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import transformers
from accelerate import init_empty_weights
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    DistilBertConfig,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaModel,
)

from course_utils import DATA_DIR

# The course ships a small DistilBERT pre-trained on its own corpus. It stands in
# for the hub checkpoint "distilbert-base-cased", which needs internet to download.
TINY_CHECKPOINT_DIR = DATA_DIR / "tiny-distilbert"
HUB_CHECKPOINT = "distilbert-base-cased"

# distilbert-base-cased's tokenizer has 28,996 entries; with two labels the
# sequence classifier has 65,783,042 parameters.
DISTILBERT_BASE_CASED_VOCAB_SIZE = 28_996


def load_pretrained_classifier(path: str | Path = TINY_CHECKPOINT_DIR, num_labels: int = 2) -> torch.nn.Module:
    """Return the sequence classifier saved at ``path`` with ``from_pretrained``.

    With internet, passing ``"distilbert-base-cased"`` loads the hub model instead.
    """
    if not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"num_labels must be a positive int, got {num_labels!r}")
    if isinstance(path, Path) and not path.exists():
        raise FileNotFoundError(
            f"path {str(path)!r} does not exist; build the course assets with `make data`"
        )
    with _no_loading_bar():
        return AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=num_labels)


@contextlib.contextmanager
def _no_loading_bar():
    """Hide transformers' "Loading weights" bar: it flashes for a fraction of a second and only adds noise."""
    was_enabled = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers.utils.logging.enable_progress_bar()


def distilbert_base_cased_config(num_labels: int = 2) -> DistilBertConfig:
    """Return the configuration of distilbert-base-cased with a classification head."""
    return DistilBertConfig(vocab_size=DISTILBERT_BASE_CASED_VOCAB_SIZE, num_labels=num_labels)


def build_distilbert_base_cased(on_meta_device: bool = True) -> torch.nn.Module:
    """Return the distilbert-base-cased sequence classifier, built from its config.

    On the meta device (the default) no memory is allocated for the weights:
    enough to count parameters. With ``on_meta_device=False`` the weights are
    real, randomly initialised fp32 tensors (about 251 MiB).
    """
    config = distilbert_base_cased_config()
    if on_meta_device:
        with init_empty_weights():
            return AutoModelForSequenceClassification.from_config(config)
    return AutoModelForSequenceClassification.from_config(config)


def well_known_architectures() -> dict[str, torch.nn.Module]:
    """Return a few famous base models, built on the meta device (no weights allocated).

    Keys are display names; values are models whose parameters can be counted
    with :func:`count_parameters`.
    """
    configs = {
        "BERT-base": (BertModel, BertConfig()),
        "GPT-2": (GPT2Model, GPT2Config()),
        "Llama 7B-shaped": (
            LlamaModel,
            LlamaConfig(
                hidden_size=4096,
                intermediate_size=11008,
                num_hidden_layers=32,
                num_attention_heads=32,
                vocab_size=32000,
            ),
        ),
    }
    models = {}
    with init_empty_weights():
        for name, (model_class, config) in configs.items():
            models[name] = model_class(config)
    return models


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Return the number of parameters (elements, not bytes) of ``model``.

    Shared (tied) parameters are counted once, as ``model.parameters()`` yields them once.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
