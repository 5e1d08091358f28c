"""Models used by the lessons: the tiny offline checkpoint and full-size architectures.

Introduced in lesson 1; lessons 2-5 use the full-size architectures to count
parameters and plan memory without downloading any weights:
:func:`well_known_architectures` (base models, lessons 2-3) and
:func:`fine_tuning_architectures` (the models people fine-tune, with their
heads, from the course's tiny model to a 70B-shaped Llama, lesson 4).
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from pathlib import Path

import torch
import transformers
from accelerate import init_empty_weights
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
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
from course_utils.validation import check_bool, check_choice, check_instance, check_positive_int

# The course ships a small DistilBERT pre-trained on its own corpus. It stands in
# for the hub checkpoint "distilbert-base-cased", which needs internet to download.
TINY_CHECKPOINT_DIR = DATA_DIR / "tiny-distilbert"
HUB_CHECKPOINT = "distilbert-base-cased"

# distilbert-base-cased's tokenizer has 28,996 entries; with two labels the
# sequence classifier has 65,783,042 parameters.
DISTILBERT_BASE_CASED_VOCAB_SIZE = 28_996


# What the hub accepts as a model id: "name" or "organisation/name".
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def load_pretrained_classifier(path: str | Path = TINY_CHECKPOINT_DIR, num_labels: int = 2) -> torch.nn.Module:
    """Return the sequence classifier saved at ``path`` with ``from_pretrained``.

    ``path`` is a local folder (str or Path). With internet, a hub model id
    such as ``"distilbert-base-cased"`` loads the hub model instead.
    """
    check_positive_int(num_labels, "num_labels")
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a folder (str or pathlib.Path) or a hub model id, got {type(path).__name__}")
    is_hub_id = isinstance(path, str) and _HUB_ID.fullmatch(path) is not None
    if not Path(path).expanduser().exists() and not is_hub_id:
        raise FileNotFoundError(
            f"path {str(path)!r} does not exist; the course's checkpoint is built with `make data`"
        )
    with no_loading_bar():
        return AutoModelForSequenceClassification.from_pretrained(str(Path(path).expanduser()) if not is_hub_id else path, num_labels=num_labels)


@contextlib.contextmanager
def no_loading_bar():
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
    check_positive_int(num_labels, "num_labels")
    return DistilBertConfig(vocab_size=DISTILBERT_BASE_CASED_VOCAB_SIZE, num_labels=num_labels)


def build_distilbert_base_cased(on_meta_device: bool = True) -> torch.nn.Module:
    """Return the distilbert-base-cased sequence classifier, built from its config.

    On the meta device (the default) no memory is allocated for the weights:
    enough to count parameters. With ``on_meta_device=False`` the weights are
    real, randomly initialised fp32 tensors (about 251 MiB).
    """
    check_bool(on_meta_device, "on_meta_device")
    config = distilbert_base_cased_config()
    if on_meta_device:
        with init_empty_weights():
            return AutoModelForSequenceClassification.from_config(config)
    return AutoModelForSequenceClassification.from_config(config)


def well_known_architectures() -> dict[str, torch.nn.Module]:
    """Return a few famous base models, built on the meta device (no weights allocated).

    Keys are display names; values are models whose parameters can be counted
    with :func:`count_parameters`. These are the bodies, without a task head: the
    Llama-2-7B body has 131M parameters fewer than the causal LM of
    :func:`fine_tuning_architectures`, whose untied LM head adds them.
    """
    configs = {
        "BERT-base": (BertModel, BertConfig()),
        "GPT-2": (GPT2Model, GPT2Config()),
        # The body alone: 6,607,343,616 parameters. With its LM head (a second 32,000 x 4,096 matrix, untied)
        # it is the 6,738,415,616 of "Llama-2-7B-shaped" in fine_tuning_architectures().
        "Llama-2-7B body (no LM head)": (
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
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_bool(trainable_only, "trainable_only")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# Shapes of the causal LMs people fine-tune, from their published configs (vocabulary 32,000).
_LLAMA_SHAPES = {
    # Llama-2-7B: multi-head attention, 6,738,415,616 parameters with its untied LM head.
    "Llama-2-7B-shaped": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "num_key_value_heads": 32},
    # Mistral-7B: grouped-query attention, 8 key/value heads for 32 query heads.
    "Mistral-7B-shaped (GQA)": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                                "num_attention_heads": 32, "num_key_value_heads": 8},
    # Llama-2-70B: grouped-query attention, 8 key/value heads for 64 query heads.
    "Llama-2-70B-shaped (GQA)": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                                 "num_attention_heads": 64, "num_key_value_heads": 8},
}


def fine_tuning_configs() -> dict[str, tuple[type, object]]:
    """Return ``{display name: (transformers Auto class, config)}`` for the architectures :func:`fine_tuning_architectures` builds."""
    configs = {
        "course model (tiny DistilBERT)": (
            AutoModelForSequenceClassification, AutoConfig.from_pretrained(TINY_CHECKPOINT_DIR, num_labels=2)
        ),
        "distilbert-base-cased": (AutoModelForSequenceClassification, distilbert_base_cased_config()),
        "BERT-base classifier": (AutoModelForSequenceClassification, BertConfig(num_labels=2)),
        "GPT-2 with its LM head": (AutoModelForCausalLM, GPT2Config()),
    }
    for name, shape in _LLAMA_SHAPES.items():
        configs[name] = (AutoModelForCausalLM, LlamaConfig(vocab_size=32000, **shape))
    return configs


TRAINED_PARTS = ("all", "head", "lora")
"""What :func:`build_for_training` trains: every parameter, only the head (the base model frozen), or LoRA adapters."""


def build_for_training(model_class, config, dtype: torch.dtype = torch.float32, checkpointing: bool = False,
                       train: str = "all") -> torch.nn.Module:
    """Return ``model_class.from_config(config)`` on the meta device (no weights), set up for training.

    The one builder of the model side of a training set-up (lessons 4 and 5):
    parameters in ``dtype`` (a floating-point ``torch.dtype``); with
    ``checkpointing``, activation checkpointing on (and the key/value cache,
    which is for generation, off); ``train`` (one of :data:`TRAINED_PARTS`)
    says which parameters train: "all", only the "head" (the base model's
    parameters frozen) or "lora" (PEFT's LoRA adapters, rank 16, on the
    architecture's default target modules). ``model_class`` is a transformers
    Auto class (``AutoModelForCausalLM``...); ``config`` is copied, not changed.
    """
    if not callable(getattr(model_class, "from_config", None)):
        raise TypeError(f"model_class must be a transformers model class (AutoModelForCausalLM...), got {model_class!r}")
    check_instance(config, "config", transformers.PretrainedConfig, "a transformers configuration (AutoConfig.for_model(...))")
    check_instance(dtype, "dtype", torch.dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16...), got {dtype}")
    check_bool(checkpointing, "checkpointing")
    check_choice(train, "train", TRAINED_PARTS)
    config = copy.deepcopy(config)
    if checkpointing and getattr(config, "use_cache", False):
        # A causal LM's key/value cache is for generation; a checkpointed model recomputes its forward
        # pass, and transformers would switch the cache off itself and say so on stderr.
        config.use_cache = False
    # ``with torch.device("meta")`` keeps tied weights tied (accelerate's ``init_empty_weights``
    # would untie GPT-2's head from its embeddings: 163.0M parameters instead of 124.4M).
    with torch.device("meta"):
        model = model_class.from_config(config, dtype=dtype)
    if model_class is AutoModelForCausalLM and getattr(model, "loss_type", None) is None:
        # transformers reads the loss from the class name; "GPT2LMHeadModel" names none, so it would
        # warn on the first loss and fall back to the causal-LM loss: name that loss.
        model.loss_type = "ForCausalLM"
    if checkpointing:
        model.activation_checkpointing_enable()
    if train == "head":
        for parameter in model.base_model.parameters():
            parameter.requires_grad_(False)
    elif train == "lora":
        model = _with_lora(model)
    return model


def _with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Return ``model`` wrapped by PEFT with LoRA adapters (rank 16, alpha 32) on its default target modules."""
    from peft import LoraConfig, get_peft_model

    task_type = "CAUSAL_LM" if type(model).__name__.endswith("ForCausalLM") else "SEQ_CLS"
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5 `is_gradient_checkpointing`, which transformers
        # renamed (FutureWarning); the answer is the same under both names.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, LoraConfig(task_type=task_type, r=16, lora_alpha=32))


def fine_tuning_architectures(dtype: torch.dtype = torch.float32, checkpointing: bool = False) -> dict[str, torch.nn.Module]:
    """Return ``{display name: model}``: the models people fine-tune, with their heads, on the meta device (no weights).

    Keys are display names: the course model and distilbert-base-cased
    (sequence classifiers), a BERT-base classifier, GPT-2 with its (tied) LM
    head, and Llama-shaped causal LMs at 7B (Llama-2, Mistral with
    grouped-query attention) and 70B (Llama-2, grouped-query attention).
    Parameters are in ``dtype`` (a floating-point ``torch.dtype``); with
    ``checkpointing`` every model has activation checkpointing on. These are the
    models lesson 4 plans and its explorer and benchmark follow, each made by
    :func:`build_for_training`, as lesson 5's are: the details that change a
    memory figure cannot drift apart.
    """
    check_instance(dtype, "dtype", torch.dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype (torch.float32, torch.bfloat16...), got {dtype}")
    check_bool(checkpointing, "checkpointing")
    return {name: build_for_training(model_class, config, dtype, checkpointing)
            for name, (model_class, config) in fine_tuning_configs().items()}
