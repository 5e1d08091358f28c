"""What each family of transformers model trains on: its input (token ids, pixel values, audio) and its head's labels (lesson 4).

The course's training step (``training_memory.training_batch``) gives a model
the input its family reads and the labels its fine-tuning head takes:

- :func:`head_of` names the head from transformers' own tables of which class
  does which task (the Auto classes' mappings), so every family's class names
  are known as transformers knows them: ``MarianMTModel`` is a translation
  model like ``BartForConditionalGeneration``, ``ViTForImageClassification``
  an image classifier, ``WhisperForConditionalGeneration`` a speech-to-text
  model.
- :func:`model_inputs` makes the input the model's ``main_input_name`` names:
  token ids, pixel values (images), log-mel input features (Whisper's speech
  encoder) or raw audio samples (wav2vec 2.0, HuBERT).
- :func:`length_limit` is the longest input the model takes, where its tables
  or its encoder set one.
- :func:`text_config` is the part of the config the token ids are read from:
  the config itself, or the text part a multimodal class nests
  (``Gemma3ForConditionalGeneration``'s ``text_config``, through transformers'
  ``get_text_config()``), so that such a class is planned trained on text.
- :func:`refuse_multimodal_input` refuses the classes whose forward pass
  needs an image and text together (CLIP's and SigLIP's contrastive models).

What ``seq_len`` means follows the input: tokens for token ids; for pixel
values the side of the square image in pixels (a ViT takes exactly its
``config.image_size``); for audio samples their number; for Whisper's input
features the decoder's label tokens, since its encoder always takes
``2 * max_source_positions`` frames (30 s of audio). The audio spectrogram
transformer (AST) reads (frames, mel bins) as its ``input_values``: it takes
exactly its config's ``max_length`` frames of ``num_mel_bins`` (its position
table is that size), whatever ``seq_len`` says.
"""

from __future__ import annotations

import torch

__all__ = ["INPUTS", "HEADS", "head_of", "main_input", "model_inputs", "length_limit", "random_in_training",
           "text_config", "refuse_multimodal_input"]

# The model's main input (transformers' ``main_input_name``) -> what the course's batch puts there.
INPUTS = {
    "input_ids": "token ids",
    "pixel_values": "pixel values (images)",
    "input_features": "input features (log-mel spectrogram frames)",
    "input_values": "audio samples (or a spectrogram's frames of mel bins, for AST)",
}

# transformers' Auto mappings -> the head's kind, as ``training_memory.head_kind`` names it.
HEADS = {
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "sequence classification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "token classification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "question answering",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "language model",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "language model",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "language model",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES": "language model",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "image classification",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": "audio classification",
}
_CLASSIFIERS = ("sequence classification", "image classification", "audio classification")


def head_of(class_name: str) -> str | None:
    """Return the kind of head of the transformers class ``class_name`` from the Auto mappings, or None if none lists it."""
    from transformers.models.auto import modeling_auto

    for table, kind in HEADS.items():
        for names in getattr(modeling_auto, table, {}).values():
            if class_name in (names if isinstance(names, (tuple, list)) else (names,)):
                return kind
    return None


def text_config(config):
    """Return the part of ``config`` that holds the vocabulary: its nested text config where it has one, else itself."""
    nested = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    return nested if hasattr(nested, "vocab_size") or not hasattr(config, "vocab_size") else config


def _listed_in(table: str, class_name: str) -> bool:
    """Return whether transformers' Auto mapping ``table`` lists the class ``class_name``."""
    from transformers.models.auto import modeling_auto

    return any(class_name in (names if isinstance(names, (tuple, list)) else (names,))
               for names in getattr(modeling_auto, table, {}).values())


def refuse_multimodal_input(model: torch.nn.Module) -> str | None:
    """Return why the course's batch cannot feed ``model`` (an image-and-text model), or None if it can.

    CLIP, SigLIP and their kin (transformers' zero-shot image classification
    table) train on pairs of an image and a caption, their loss comparing the
    two towers' embeddings; LLaVA and its kin (the image-text-to-text table)
    on an image and a text whose placeholder tokens its image features replace.
    The course's batch is of one kind of input. A class transformers also lists
    as a causal language model (Gemma 3's) is planned trained on text.
    """
    name = type(model).__name__
    if _listed_in("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", name):
        return (
            f"model: {name} is a contrastive image-text model: its training step takes images and their captions "
            f"together (multimodal input: pixel_values and input_ids, return_loss=True), and the course's batch is "
            f"of one input. Plan each tower with a head on its own (its vision model as an image classifier, its "
            f"text model as a sequence classifier), or measure the pair's step on your own batch with "
            f"measure_training_step_peak"
        )
    if _listed_in("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", name) and not _listed_in(
            "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", name):
        return (
            f"model: {name} trains on an image and a text together (multimodal input: pixel_values, and input_ids "
            f"holding one image placeholder token per image feature), and the course's batch is of one input. Plan "
            f"its language model alone (a causal LM built from its text_config) and its vision tower as an image "
            f"classifier, or measure the step on your own batch with measure_training_step_peak"
        )
    return None


def main_input(model: torch.nn.Module) -> str:
    """Return the name of the input ``model`` reads (``input_ids``, ``pixel_values``...), refusing one the course cannot make."""
    name = getattr(model, "main_input_name", "input_ids")
    if name not in INPUTS:
        raise ValueError(
            f"model: {type(model).__name__} reads {name!r}; the course's batch makes "
            f"{', '.join(f'{key} ({what})' for key, what in INPUTS.items())}"
        )
    return name


def model_inputs(model: torch.nn.Module, batch_size: int, seq_len: int,
                 generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """Return ``{main input name: tensor}`` for ``batch_size`` examples of length ``seq_len`` (see the module's note)."""
    name, config = main_input(model), model.config
    if name == "input_ids":
        return {name: decoder_labels(model, batch_size, seq_len, generator)}
    if name == "pixel_values":
        channels = getattr(config, "num_channels", 3)
        return {name: torch.randn(batch_size, channels, seq_len, seq_len, generator=generator)}
    if name == "input_values" and hasattr(config, "num_mel_bins") and hasattr(config, "max_length"):
        return {name: torch.randn(batch_size, config.max_length, config.num_mel_bins, generator=generator)}  # AST
    if name == "input_values":
        return {name: torch.randn(batch_size, seq_len, generator=generator)}
    frames = _whisper_frames(model)
    return {name: torch.randn(batch_size, config.num_mel_bins, frames, generator=generator)}


def decoder_labels(model: torch.nn.Module, batch_size: int, seq_len: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """Return token ids (batch_size, seq_len) that avoid the padding token: the input, or the labels of a model whose input is not token ids (Whisper's decoder)."""
    config = text_config(model.config)
    labels = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    pad = getattr(config, "pad_token_id", None)
    return labels if pad is None else torch.where(labels == pad, (pad + 1) % config.vocab_size, labels)


def is_classifier(kind: str) -> bool:
    """Return whether a head of ``kind`` takes one class per example."""
    return kind in _CLASSIFIERS


def _whisper_frames(model: torch.nn.Module) -> int:
    """Return the frames of input features a Whisper-style encoder takes (its convolutions halve them to its positions)."""
    config = model.config
    if not hasattr(config, "num_mel_bins") or not hasattr(config, "max_source_positions"):
        raise ValueError(
            f"model: {type(model).__name__} reads input_features; the course's batch makes them as Whisper's encoder "
            f"takes them (num_mel_bins x 2 * max_source_positions frames), and its config has no num_mel_bins or "
            f"max_source_positions"
        )
    return 2 * config.max_source_positions


def length_limit(model: torch.nn.Module) -> tuple[int | None, str]:
    """Return the largest ``seq_len`` ``model`` takes (None if its tables set none) and, if it is not its position table's size, why.

    A fake step cannot see an index past a table (it has no values to check), so
    a length the real step would refuse must be refused before it.
    """
    config = text_config(model.config)
    name = main_input(model)
    if name == "input_features":
        return getattr(config, "max_target_positions", None), " (its decoder's max_target_positions)"
    if name in ("pixel_values", "input_values"):
        return None, ""
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    # XLNet says -1: its relative positions are computed, not looked up in a table.
    if not isinstance(positions, int) or positions <= 0:
        return None, ""
    return positions, ""


# Config fields that make a training step's work random: which blocks run (LayerDrop), which frames or
# features are masked (SpecAugment in wav2vec 2.0, HuBERT, Whisper).
_RANDOM_IN_TRAINING = {
    "layerdrop": "each block is skipped at random",
    "encoder_layerdrop": "each encoder block is skipped at random",
    "decoder_layerdrop": "each decoder block is skipped at random",
    "mask_time_prob": "random spans of frames are masked (SpecAugment)",
    "mask_feature_prob": "random spans of features are masked (SpecAugment)",
}


def random_in_training(model: torch.nn.Module) -> str | None:
    """Return why ``model``'s training steps differ from one another at random (its config's LayerDrop, SpecAugment), or None.

    Such a step allocates what its random draw decides (a skipped block keeps
    no activations; a masked span's indices are as many as the draw picks), so
    no one step is *the* step, and a fake tensor has no values to draw from.
    """
    config = model.config
    # SpecAugment's masks apply only with apply_spec_augment (on in wav2vec 2.0, off in Whisper).
    spec_augment = getattr(config, "apply_spec_augment", True)
    reasons = [f"{field}={getattr(config, field)} ({why})" for field, why in _RANDOM_IN_TRAINING.items()
               if isinstance(getattr(config, field, None), (int, float)) and getattr(config, field) > 0
               and (spec_augment or not field.startswith("mask_"))]
    if not reasons:
        return None
    fields = " and ".join(reason.split("=")[0] for reason in reasons)
    return (
        f"model: {type(model).__name__}'s config has {'; '.join(reasons)}: in training, what each step holds "
        f"depends on a random draw, which the planner's fake tensors cannot make. Set {fields} to 0 on the "
        f"config to plan the step without it (with LayerDrop off every block runs: the most a step can hold)"
    )
