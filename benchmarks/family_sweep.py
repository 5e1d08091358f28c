"""Sweep the planner over every architecture in transformers' task tables, each built small from its own config.

``planner_sweep`` runs set-ups written by hand. This sweep writes none: for each
model type that transformers' Auto task tables list (the ones the planner's
heads read, ``model_families.HEADS``), it takes the first head class the tables
give it, builds the type's default config with its sizes made small
(:func:`small_config`: widths, depths, heads, experts, vocabulary, image and
audio sizes, in the config and in each config it nests), builds the model with
real tensors, plans one AdamW step with ``memory.estimate_training_memory`` and
measures the same step with ``memory.measure_training_step_peak``
(``planner_sweep.one_row``). Each family ends in one of:

- **planned**: the plan against the measurement, within 2 % or not;
- **refused**: the planner's own reason (a family it does not follow, said by name);
- **crashed**: the planner or the measurement failed (what the sweep looks for);
- **real step fails too**: refused or crashed, and the same step run for real fails as well (the
  small config does not take the sweep's input: the shrinker's limit, not the planner's);
- **not built**: the small config or the model could not be built (transformers' own error: the
  shrinker does not know that family's sizes; nothing about the planner).

It prints one line per family and the counts; ``make bench`` runs it whole.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.family_sweep [MODEL_TYPE ...]
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
import warnings
from collections import Counter

import torch
from transformers.models.auto import configuration_auto, modeling_auto
from transformers.utils import logging as transformers_logging

from benchmarks.planner_sweep import describe, one_row
from course_utils import memory
from course_utils.memory import model_families

BATCH_SIZE, SEQ_LEN = 2, 16

# Small sizes, by the names configs give them. Widths stay divisible by every head count below.
SMALL = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "embedding_size", "word_embed_proj_dim",
                     "projection_dim", "text_embed_dim", "vision_embed_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "decoder_num_key_value_heads"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
                     "d_inner", "ffn_hidden_size"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
    "head_dim": 16,
    "rotary_dim": 8,  # GPT-J and CodeGen rotate the first rotary_dim of each head's 16 dimensions
    # DeepSeek's routing picks groups of experts first: one group holds the 4 experts.
    **dict.fromkeys(("n_group", "topk_group"), 1),
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "image_size": 64,
    "patch_size": 8,
    "window_size": 4,  # Swin's windows tile the 8 x 8 patches of a 64-pixel image
    "num_channels": 3,
    "num_mel_bins": 16,
    "max_source_positions": 16,
    "max_target_positions": 64,
    "num_labels": 3,
    # Hybrids place their attention and expert layers by offset and period: both kinds within the 2 layers.
    **dict.fromkeys(("attn_layer_offset", "expert_layer_offset"), 1),
    **dict.fromkeys(("attn_layer_period", "expert_layer_period"), 2),
    # The planner follows one fixed step: random layer skipping and SpecAugment off, as its refusal asks.
    **dict.fromkeys(("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "mask_time_prob", "mask_feature_prob"), 0.0),
}
# A list of per-stage depths (convolutional and hierarchical vision models): one block per stage.
STAGE_DEPTHS = ("depths", "layers_per_block", "num_layers_per_stage")
# A list of heads per stage: one head each, which divides every stage's width.
STAGE_HEADS = ("num_heads", "num_attention_heads", "encoder_attention_heads")
# The task tables in the order a family is swept by: a language-model head where it has one.
TABLES = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
          "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
          "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
          "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
          "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES")
SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                  "cls_token_id", "mask_token_id", "unk_token_id")


def small_config(config_class):
    """Return ``config_class``'s default config with the sizes in :data:`SMALL` (where it has them) made small.

    The config is built again from those values, so that what its ``__init__`` derives from them (a head
    dimension, a list of layer types as long as the layers) follows; each config it nests is made small first.
    """
    default = config_class()
    accepted = inspect.signature(config_class.__init__).parameters
    values = {name: size for name, size in SMALL.items()
              if name in accepted and isinstance(getattr(default, name, None), type(size))}  # a list stays a list
    for name in ("num_key_value_heads", "decoder_num_key_value_heads"):
        if name in values and getattr(default, name) == getattr(default, "num_attention_heads", None):
            values[name] = SMALL["num_attention_heads"]  # no grouped-query attention by default (MLA): none here
    for name in ("n_group", "topk_group"):  # DeepSeek V2 leaves them None by default, and routes by them
        if name in accepted and hasattr(default, name):
            values[name] = SMALL[name]
    if "first_k_dense_replace" in accepted and hasattr(default, "first_k_dense_replace"):
        values["first_k_dense_replace"] = 1  # DeepSeek's first dense layers: one, so the second layer has experts
    for name in STAGE_DEPTHS:
        depths = getattr(default, name, None)
        if name in accepted and isinstance(depths, (list, tuple)):
            values[name] = [1] * len(depths)
    for name in STAGE_HEADS:
        heads = getattr(default, name, None)
        if name in accepted and isinstance(heads, (list, tuple)):
            values[name] = [1] * len(heads)
    if "attn_layer_indices" in accepted and hasattr(default, "attn_layer_indices"):
        values["attn_layer_indices"] = [1]  # a hybrid's attention layer among the 2 (Bamba's default has none)
    if "pad_token_id" in accepted and getattr(default, "pad_token_id", 0) is None:
        values["pad_token_id"] = 0  # as a fine-tuner sets one: a classifier pools at the last non-pad token
    for name in getattr(config_class, "sub_configs", {}) or {}:
        nested = getattr(default, name, None)
        if nested is not None and name in accepted:
            values[name] = small_config(type(nested)).to_dict()
    for name in SPECIAL_TOKENS:  # ids the default vocabulary had, kept inside the small one
        token = getattr(default, name, None)
        if isinstance(token, int) and "vocab_size" in values and token >= values["vocab_size"]:
            values[name] = values["vocab_size"] - 1 - SPECIAL_TOKENS.index(name)
    config = config_class(**values)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0  # as T5's fine-tuners set it
    return config


def task_table_families() -> dict[str, str]:
    """Return ``{model type: its first head class}`` over the task tables the planner reads, in their order."""
    families: dict[str, str] = {}
    assert set(TABLES) == set(model_families.HEADS), "the sweep goes through every table the planner reads"
    for table in TABLES:
        for model_type, class_name in getattr(modeling_auto, table).items():
            # A few types list two classes for one task (DeiT's with and without teacher): the first.
            families.setdefault(model_type, class_name[0] if isinstance(class_name, tuple) else class_name)
    return families


AUDIO_SAMPLES = 4000  # a quarter of a second at 16 kHz: enough for a wav2vec 2.0 feature encoder's 7 convolutions


def seq_len_for(model) -> int:
    """The planner's ``seq_len`` for the model's input: an image's side (a ViT takes exactly its config's), audio samples."""
    try:
        main_input = model_families.main_input(model)
    except ValueError:  # an input the course's batch does not make: the planner refuses it by name
        return SEQ_LEN
    if main_input == "pixel_values":
        size = getattr(model.config, "image_size", None)
        return size if isinstance(size, int) else SMALL["image_size"]
    if main_input == "input_values":
        return AUDIO_SAMPLES
    return SEQ_LEN


def real_step_error(model, seq_len: int) -> str | None:
    """Run the step the planner refused for real: its error if it fails too (the small config's, not the planner's)."""
    try:
        optimizer = memory.make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad])
        batch = memory.training_batch(model, BATCH_SIZE, seq_len, generator=torch.Generator().manual_seed(1))
        memory.measure_training_step_peak(model, optimizer, batch)
    except Exception as error:  # noqa: BLE001 - what is reported
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def builder(model_type: str, class_name: str):
    def build():
        import transformers

        config_class = configuration_auto.CONFIG_MAPPING[model_type]
        return getattr(transformers, class_name)(small_config(config_class))
    return build


def outcome(row: dict) -> str:
    if row.get("real step fails"):
        return "real step fails too"
    if "error_pct" in row:
        return "planned within 2%" if abs(row["error_pct"]) <= 2 else "planned, more than 2% off"
    for kind in ("refused", "crashed", "build failed"):
        if kind in row:
            return "not built" if kind == "build failed" else kind
    raise AssertionError(row)


def main(model_types: list[str] | None = None) -> dict:
    """Print one line per family and the counts by outcome; return the rows and the counts."""
    transformers_logging.set_verbosity_error()
    # A step the planner refuses logs fake tensors' traceback at ERROR before the refusal says the same, in one line.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # tiny configs' notes (loss_type unset, use_cache) say nothing of memory
    torch.set_num_threads(1)
    families = task_table_families()
    chosen = {t: c for t, c in families.items() if not model_types or t in model_types}
    print(f"{len(families)} model types in transformers' task tables; sweeping {len(chosen)} "
          f"(AdamW, fp32, {BATCH_SIZE} x {SEQ_LEN})")
    rows, started = [], time.perf_counter()
    for model_type, class_name in chosen.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a family's deprecation notes are not the sweep's subject
            name = f"{model_type} ({class_name})"
            try:
                model = builder(model_type, class_name)()
            except Exception as error:  # noqa: BLE001 - a config the shrinker does not know how to make small
                row = {"setup": name, "tokens": "", "precision": "no",
                       "build failed": f"{type(error).__name__}: {error}".splitlines()[0]}
            else:
                seq_len = seq_len_for(model)
                row = one_row(name, lambda: model, "adamw", {}, BATCH_SIZE, seq_len, "no", 1)
                if "refused" in row or "crashed" in row:
                    row["real step fails"] = real_step_error(model, seq_len)
                del model
        row["outcome"] = outcome(row)
        rows.append(row)
        print(describe(row)[:220], flush=True)
    counts = Counter(row["outcome"] for row in rows)
    counts["byte-exact"] = sum(row.get("measured_peak") == row.get("estimated_peak") for row in rows
                               if "error_pct" in row)
    print(f"\nfamily sweep: {len(rows)} families in {time.perf_counter() - started:.0f} s: "
          + ", ".join(f"{counts[k]} {k}" for k in ("byte-exact", "planned within 2%", "planned, more than 2% off", "refused",
                                                    "crashed", "real step fails too", "not built")))
    for kind in ("planned, more than 2% off", "refused", "crashed", "real step fails too"):
        for row in rows:
            if row["outcome"] == kind:
                detail = f"{row['error_pct']:+.2f}%" if "error_pct" in row else row.get(kind, "")
                detail = row["real step fails"] if kind == "real step fails too" else detail
                print(f"  {kind}: {row['setup']}: {detail[:200]}")
    return {"rows": rows, "counts": dict(counts)}


if __name__ == "__main__":
    main(sys.argv[1:])
