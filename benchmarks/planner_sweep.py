"""Sweep the planner over set-ups the course never uses: many architectures and heads, small enough to measure.

Each row builds a tiny transformers model from its config (real tensors), asks
``memory.estimate_training_memory`` for its peak, then measures the same step
for real with ``memory.measure_training_step_peak`` (the pattern of
``bench_memory.planner_rows``). It prints one line per row: the set-up, the
measured and estimated peaks (MiB), the error, the phases, or the refusal or
exception text. Rows more than 2% off and crashes are listed at the end.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        .venv/bin/python -m benchmarks.planner_sweep [SUBSTRING ...]

With substrings, only the rows whose name contains one of them run (``"qlora speed"``: only the timings). It
ends with the tally (byte-exact, within 2 %, refused with the reason) and the time to plan a 7B- and a
70B-shaped QLoRA step (targets 5 s and 10 s). ``make bench`` runs it whole (``benchmarks/run_all.py``).
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
import warnings

import torch
import transformers as tf
from transformers.utils import logging as transformers_logging

from course_utils import memory
from course_utils.memory.qlora import four_bit_weights
from course_utils.units import MIB

BF16 = torch.bfloat16
VOCAB = 512
POSITIONS = 600


def decoder(config_class, head=tf.AutoModelForCausalLM, dtype=torch.float32, layers=3, **extra):
    def build():
        options = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS, pad_token_id=0)
        options.update(extra)
        return head.from_config(config_class(**options), dtype=dtype)
    return build


def encoder(config_class, head=tf.AutoModelForSequenceClassification, dtype=torch.float32, layers=3, **extra):
    def build():
        options = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, max_position_embeddings=POSITIONS, pad_token_id=0)
        options.update(extra)
        return head.from_config(config_class(**options), dtype=dtype)
    return build


def gpt_neox(head=tf.AutoModelForCausalLM, dtype=torch.float32):
    return decoder(tf.GPTNeoXConfig, head, dtype, layers=4)


def opt(head=tf.AutoModelForCausalLM, dtype=torch.float32):
    def build():
        config = tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=4, num_attention_heads=4,
                              max_position_embeddings=POSITIONS, word_embed_proj_dim=64, pad_token_id=1)
        return head.from_config(config, dtype=dtype)
    return build


def bloom(head=tf.AutoModelForCausalLM, dtype=torch.float32):
    def build():
        config = tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=3, n_head=4, pad_token_id=3)
        return head.from_config(config, dtype=dtype)
    return build


def falcon(head=tf.AutoModelForCausalLM, dtype=torch.float32):
    def build():
        config = tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                 max_position_embeddings=POSITIONS)
        return head.from_config(config, dtype=dtype)
    return build


def albert(head=tf.AutoModelForSequenceClassification, layers=4):
    def build():
        config = tf.AlbertConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=POSITIONS)
        return head.from_config(config)
    return build


def mobilebert(head=tf.AutoModelForSequenceClassification):
    def build():
        config = tf.MobileBertConfig(vocab_size=VOCAB, hidden_size=64, embedding_size=32, intermediate_size=64,
                                     intra_bottleneck_size=32, true_hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_feedforward_networks=2, max_position_embeddings=POSITIONS)
        return head.from_config(config)
    return build


def t5(head=tf.AutoModelForSeq2SeqLM, config_start=True):
    def build():
        start = {"decoder_start_token_id": 0} if config_start else {}
        config = tf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **start)
        return head.from_config(config)
    return build


def bart(head=tf.AutoModelForSeq2SeqLM):
    def build():
        config = tf.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128, max_position_embeddings=POSITIONS)
        return head.from_config(config)
    return build


def checkpointed(build):
    def built():
        model = build()
        model.activation_checkpointing_enable()
        return model
    return built


def frozen_embeddings(build):
    def built():
        model = build()
        model.get_input_embeddings().requires_grad_(False)
        return model
    return built


def frozen_half(build):
    def built():
        model = build()
        blocks = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)
        for block in blocks[: len(blocks) // 2]:
            block.requires_grad_(False)
        return model
    return built


def lora(build, targets=("q_proj", "v_proj")):
    def built():
        from peft import LoraConfig, get_peft_model

        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(build(), LoraConfig(r=4, target_modules=list(targets)))
    return built


def qlora(config_class, layers=2, checkpointing=True, targets="all-linear", **extra):
    """A recipe's QLoRA model (4-bit NF4 base, double quantisation, bf16 compute, LoRA), weights real and quantised."""
    def build():
        from peft import LoraConfig

        options = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS)
        options.update(extra)
        lora_config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM")
        return memory.qlora_model(config_class(**options), on_meta_device=False, lora=lora_config,
                           checkpointing=checkpointing)
    return build


def moe(config_class, dtype=torch.float32, layers=2, **extra):
    return decoder(config_class, dtype=dtype, layers=layers, **extra)


def marian(head=tf.MarianMTModel, layers=2):
    def build():
        return head(tf.MarianConfig(vocab_size=VOCAB, d_model=64, encoder_layers=layers, decoder_layers=layers,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                    decoder_ffn_dim=128, max_position_embeddings=POSITIONS, pad_token_id=0,
                                    decoder_start_token_id=0))
    return build


def whisper(head=tf.WhisperForConditionalGeneration, layers=2, **extra):
    def build():
        return head(tf.WhisperConfig(vocab_size=VOCAB, d_model=64, encoder_layers=layers, decoder_layers=layers,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=64,
                                     max_target_positions=128, decoder_start_token_id=1, pad_token_id=0, **extra))
    return build


def xlnet(head=tf.XLNetForSequenceClassification, layers=2):
    def build():
        return head(tf.XLNetConfig(vocab_size=VOCAB, d_model=64, n_layer=layers, n_head=4, d_inner=128))
    return build


def vision(config_class=tf.ViTConfig, head=tf.AutoModelForImageClassification, layers=2, **extra):
    def build():
        options = dict(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128,
                       image_size=64, patch_size=8, num_labels=10)
        options.update(extra)
        config = config_class(**options)
        # DeiT's Auto class finds no architecture in a config made from scratch: build its class directly.
        return head.from_config(config) if hasattr(head, "from_config") and head.__name__.startswith("Auto") \
            else head(config)
    return build


def audio(config_class=tf.Wav2Vec2Config, head=tf.AutoModelForAudioClassification, layers=2, **extra):
    def build():
        options = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                       intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                       num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_labels=6)
        options.update(extra)
        return head.from_config(config_class(**options))
    return build


def no_random(build):
    """The same model with LayerDrop and SpecAugment off (the planner follows one fixed step)."""
    def built():
        model = build()
        model.config.layerdrop = 0.0
        model.config.mask_time_prob = 0.0
        return model
    return built


SEQ, TOK, QA, MLM, LM, BASE = (tf.AutoModelForSequenceClassification, tf.AutoModelForTokenClassification,
                               tf.AutoModelForQuestionAnswering, tf.AutoModelForMaskedLM, tf.AutoModelForCausalLM,
                               tf.AutoModel)
MOM = {"momentum": 0.9}
MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=96)
QWEN3_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16)

# Issue 25's families, with the levers combined: QLoRA, mixture of experts, encoder-decoders by their own class
# names, XLNet, images (pixel values) and speech (input features, raw samples).
FAMILY_ROWS = [
    ("qlora llama paged_adamw8bit ckpt", qlora(tf.LlamaConfig), "paged_adamw8bit", {}, 2, 64, "no", 1),
    ("qlora llama 8 layers paged_adamw32bit accum 2", qlora(tf.LlamaConfig, layers=8), "paged_adamw32bit", {},
     2, 64, "no", 2),
    ("qlora llama no ckpt adamw8bit bf16 autocast", qlora(tf.LlamaConfig, checkpointing=False), "adamw8bit", {},
     2, 64, "bf16", 1),
    ("qlora qwen2 (biases) q,v only adamw", qlora(tf.Qwen2Config, targets=["q_proj", "v_proj"]), "adamw", {},
     3, 100, "no", 1),
    ("qlora mistral 6 layers sliding window", qlora(tf.MistralConfig, layers=6, sliding_window=32), "paged_adamw8bit",
     {}, 1, 257, "no", 1),
    ("qlora gemma2 softcap accum 3", qlora(tf.Gemma2Config, head_dim=16, sliding_window=32), "paged_adamw8bit", {},
     2, 64, "no", 3),
    ("mixtral fp32 bf16 autocast", moe(tf.MixtralConfig, **MIXTRAL), "adamw", {}, 2, 64, "bf16", 1),
    ("mixtral pure bf16 ckpt adamw8bit", checkpointed(moe(tf.MixtralConfig, BF16, **MIXTRAL)), "adamw8bit", {},
     2, 64, "no", 1),
    ("mixtral 8 layers fp32 sgd accum 2", moe(tf.MixtralConfig, layers=8, **MIXTRAL), "sgd", MOM, 2, 64, "no", 2),
    ("qwen3-moe pure bf16", moe(tf.Qwen3MoeConfig, BF16, **QWEN3_MOE), "adamw", {}, 2, 128, "no", 1),
    ("qwen3-moe fp32 bf16 autocast accum 2", moe(tf.Qwen3MoeConfig, **QWEN3_MOE), "adamw", {"foreach": True}, 2, 64,
     "bf16", 2),
    ("qwen3-moe LoRA attention", lora(moe(tf.Qwen3MoeConfig, BF16, **QWEN3_MOE)), "adamw", {}, 2, 64, "no", 1),
    ("marian MT", marian(), "adamw", {}, 2, 64, "no", 1),
    ("marian MT ckpt accum 2 bf16 autocast", checkpointed(marian(layers=3)), "adamw", {}, 2, 64, "bf16", 2),
    ("marian MT 8 layers adafactor", marian(layers=8), "adafactor", {}, 2, 64, "no", 1),
    ("mbart seq2seq LM", lambda: tf.MBartForConditionalGeneration(tf.MBartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=POSITIONS,
        pad_token_id=1)), "adamw", {}, 2, 64, "no", 1),
    ("pegasus seq2seq LM", lambda: tf.PegasusForConditionalGeneration(tf.PegasusConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=POSITIONS,
        pad_token_id=0, decoder_start_token_id=0)), "adamw", {}, 2, 64, "no", 1),
    ("xlnet seq-cls", xlnet(), "adamw", {}, 2, 64, "no", 1),
    ("xlnet LM head 700 tokens", xlnet(tf.XLNetLMHeadModel), "adamw", {}, 1, 700, "no", 1),
    ("xlnet token-cls accum 2 bf16 autocast", xlnet(tf.XLNetForTokenClassification), "adamw", {}, 2, 64, "bf16",
     2),
    ("whisper speech-to-text", whisper(), "adamw", {}, 2, 32, "no", 1),
    ("whisper ckpt bf16 autocast", checkpointed(whisper()), "adamw", {}, 2, 32, "bf16", 1),
    ("whisper 8 layers accum 2 adamw8bit", whisper(layers=8), "adamw8bit", {}, 2, 32, "no", 2),
    ("whisper LoRA (q, v)", lora(whisper(), ("q_proj", "v_proj")), "adamw", {}, 2, 32, "no", 1),
    ("whisper audio classification", whisper(tf.WhisperForAudioClassification, num_labels=4), "adamw", {}, 2, 32,
     "no", 1),
    ("vit image-cls", vision(), "adamw", {}, 4, 64, "no", 1),
    ("vit image-cls ckpt bf16 autocast", checkpointed(vision()), "adamw", {}, 4, 64, "bf16", 1),
    ("vit 8 layers pure bf16 accum 2", lambda: vision(layers=8)().to(BF16), "adamw", {}, 4, 64, "no", 2),
    ("vit LoRA (q, v)", lora(vision(), ("q_proj", "v_proj")), "adamw", {}, 4, 64, "no", 1),
    ("vit base model", vision(head=tf.AutoModel), "sgd", MOM, 4, 64, "no", 1),
    ("vit wrong image size", vision(), "adamw", {}, 4, 32, "no", 1),
    ("deit image-cls", vision(tf.DeiTConfig, tf.DeiTForImageClassification), "adamw", {}, 4, 64, "no", 1),
    ("convnext image-cls (convolutions)", lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10)), "adamw", {}, 4, 64, "no", 1),
    ("wav2vec2 audio-cls", no_random(audio()), "adamw", {}, 2, 1600, "no", 1),
    ("wav2vec2 audio-cls bf16 autocast accum 2", no_random(audio()), "adamw", {}, 2, 1600, "bf16", 2),
    ("wav2vec2 audio-cls defaults (layerdrop, specaugment)", audio(), "adamw", {}, 2, 1600, "no", 1),
    ("hubert audio-cls", no_random(audio(tf.HubertConfig)), "adamw", {}, 2, 1600, "no", 1),
    ("wav2vec2 CTC (no labels made)", no_random(audio(head=tf.AutoModelForCTC)), "adamw", {}, 2, 1600, "no", 1),
]

ROWS = [
    # (name, build, optimizer, options, batch, seq_len, mixed_precision, accumulation)
    ("qwen2 LM", decoder(tf.Qwen2Config, ), "adamw", {}, 3, 100, "no", 1),
    ("qwen2 LM 6 layers (probes)", decoder(tf.Qwen2Config, layers=6, ), "adamw", {}, 2, 64, "no", 1),
    ("qwen2 seq-cls bf16 autocast", decoder(tf.Qwen2Config, SEQ), "adamw", {}, 8, 64, "bf16", 1),
    ("qwen3 LM pure bf16", decoder(tf.Qwen3Config, dtype=BF16, head_dim=16), "adamw", {}, 1, 512, "no", 1),
    ("qwen3 LM 6 layers ckpt", checkpointed(decoder(tf.Qwen3Config, layers=6, head_dim=16)), "adamw", {}, 2, 257, "no", 1),
    ("qwen3 token-cls", decoder(tf.Qwen3Config, TOK, head_dim=16), "sgd", MOM, 3, 100, "no", 1),
    ("mistral sliding window", decoder(tf.MistralConfig, sliding_window=32, ), "adamw", {},
     2, 257, "no", 1),
    ("mistral 6 layers LoRA", lora(decoder(tf.MistralConfig, layers=6, sliding_window=32)), "adamw", {}, 2, 128, "no", 1),
    ("gemma LM", decoder(tf.GemmaConfig, head_dim=16, num_key_value_heads=1), "adamw", {}, 3, 100, "no", 1),
    ("gemma2 LM softcap", decoder(tf.Gemma2Config, layers=4, head_dim=16, sliding_window=32), "adamw", {},
     2, 257, "no", 1),
    ("gemma2 LM bf16 autocast accum 2", decoder(tf.Gemma2Config, layers=4, head_dim=16, sliding_window=32), "adamw",
     {}, 2, 64, "bf16", 2),
    ("gemma3 LM 6 layers", decoder(tf.Gemma3TextConfig, layers=6, head_dim=16, sliding_window=32), "adamw", {},
     1, 512, "no", 1),
    ("gemma3 seq-cls", decoder(tf.Gemma3TextConfig, SEQ, layers=4, head_dim=16, sliding_window=32), "adamw", {},
     3, 100, "no", 1),
    ("phi3 LM", decoder(tf.Phi3Config, ), "adamw", {"foreach": True}, 8, 64, "no", 1),
    ("phi3 LM pure bf16 adafactor", decoder(tf.Phi3Config, dtype=BF16), "adafactor", {}, 2, 257, "no", 1),
    ("gpt-neox LM", gpt_neox(), "adamw", {"fused": True}, 3, 100, "no", 1),
    ("gpt-neox LM 6 layers frozen half", frozen_half(decoder(tf.GPTNeoXConfig, layers=6)), "rmsprop", {}, 2, 64,
     "no", 1),
    ("gpt-neox seq-cls ckpt", checkpointed(gpt_neox(SEQ)), "adamw", {}, 2, 257, "no", 1),
    ("opt LM", opt(), "adamw", {}, 3, 100, "no", 1),
    ("opt seq-cls accum 3", opt(SEQ), "adamw8bit", {}, 2, 64, "no", 3),
    ("opt QA", opt(QA), "adamw", {}, 2, 64, "no", 1),
    ("bloom LM", bloom(), "adamw", {}, 3, 100, "no", 1),
    ("bloom token-cls bf16 autocast", bloom(TOK), "torch_adafactor", {}, 2, 128, "bf16", 1),
    ("falcon LM", falcon(), "adamw", {}, 2, 128, "no", 1),
    ("roberta seq-cls", encoder(tf.RobertaConfig, pad_token_id=1), "adamw", {}, 3, 100, "no", 1),
    ("roberta MLM frozen embeddings", frozen_embeddings(encoder(tf.RobertaConfig, MLM, pad_token_id=1)), "adamw", {},
     8, 64, "no", 1),
    ("roberta QA", encoder(tf.RobertaConfig, QA, pad_token_id=1), "adamw", {}, 2, 128, "no", 1),
    ("roberta 6 layers token-cls ckpt", checkpointed(encoder(tf.RobertaConfig, TOK, layers=6, pad_token_id=1)),
     "adamw", {}, 2, 257, "no", 1),
    ("roberta base model pure bf16", encoder(tf.RobertaConfig, BASE, dtype=BF16, pad_token_id=1), "adamw", {},
     1, 512 - 2, "no", 1),
    ("albert seq-cls (shared layer)", albert(), "adamw", {}, 3, 100, "no", 1),
    ("albert 8 layers MLM", albert(MLM, layers=8), "adamw", {}, 2, 64, "no", 1),
    ("albert 8 layers QA accum 2", albert(QA, layers=8), "sgd", MOM, 2, 64, "no", 2),
    ("electra seq-cls", encoder(tf.ElectraConfig, embedding_size=32), "adamw", {}, 3, 100, "no", 1),
    ("electra 6 layers token-cls bf16 autocast", encoder(tf.ElectraConfig, TOK, layers=6, embedding_size=32), "adamw",
     {}, 2, 128, "bf16", 1),
    ("deberta-v2 seq-cls", encoder(tf.DebertaV2Config, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                   position_buckets=32, max_relative_positions=-1), "adamw", {}, 3, 100, "no", 1),
    ("deberta-v2 MLM 6 layers", encoder(tf.DebertaV2Config, MLM, layers=6, relative_attention=True,
                                        pos_att_type=["p2c", "c2p"], position_buckets=32), "adamw", {}, 2, 64, "no", 1),
    ("mobilebert seq-cls", mobilebert(), "adamw", {}, 2, 128, "no", 1),
    ("llama LoRA accum 4", lora(decoder(tf.LlamaConfig, layers=4)), "adamw", {}, 2, 64, "no", 4),
    ("llama pure bf16 torch_adafactor ckpt", checkpointed(decoder(tf.LlamaConfig, dtype=BF16, layers=4)),
     "torch_adafactor", {}, 2, 257, "no", 1),
    ("llama adam foreach bf16 autocast", decoder(tf.LlamaConfig, layers=4), "adam", {"foreach": True}, 3, 100,
     "bf16", 1),
    ("gpt2 double heads (no known head)", lambda: tf.GPT2DoubleHeadsModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=64,
     n_layer=2, n_head=4)), "adamw", {}, 2, 64, "no", 1),
    ("llama use_cache=False (no cache, no checkpointing)", decoder(tf.LlamaConfig, use_cache=False), "adamw", {},
     2, 257, "no", 1),
    # Deep enough for the planner's 1-3 block probes, with the optimizers and shapes the rows above leave out.
    ("qwen2 8 layers adamw8bit", decoder(tf.Qwen2Config, layers=8), "adamw8bit", {}, 3, 100, "no", 1),
    ("mistral 8 layers sliding window bf16 autocast", decoder(tf.MistralConfig, layers=8, sliding_window=32), "adamw",
     {}, 2, 257, "bf16", 1),
    ("phi3 8 layers pure bf16 fused", decoder(tf.Phi3Config, dtype=BF16, layers=8), "adamw", {"fused": True},
     1, 512, "no", 1),
    ("gemma2 8 layers ckpt accum 2", checkpointed(decoder(tf.Gemma2Config, layers=8, head_dim=16, sliding_window=32)),
     "sgd", MOM, 3, 100, "no", 2),
    ("gpt-neox 8 layers frozen embeddings", frozen_embeddings(decoder(tf.GPTNeoXConfig, layers=8)), "adamw", {},
     8, 64, "no", 1),
    ("bloom 8 layers seq-cls accum 3", lambda: tf.BloomForSequenceClassification(tf.BloomConfig(
        vocab_size=VOCAB, hidden_size=64, n_layer=8, n_head=4, pad_token_id=3)), "rmsprop", {}, 2, 64, "no", 3),
    ("falcon 8 layers alibi new arch", lambda: tf.FalconForCausalLM(tf.FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_kv_heads=2, alibi=True,
        new_decoder_architecture=True)), "adamw", {"foreach": True}, 2, 128, "no", 1),
    ("opt 8 layers LoRA bf16 autocast", lora(lambda: tf.OPTForCausalLM(tf.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=8, num_attention_heads=4,
        max_position_embeddings=POSITIONS, word_embed_proj_dim=64)), ("q_proj", "v_proj")), "adamw", {}, 2, 64,
     "bf16", 1),
    ("roberta 8 layers QA pure bf16", encoder(tf.RobertaConfig, QA, dtype=BF16, layers=8, pad_token_id=1), "adamw",
     {}, 3, 100, "no", 1),
    ("electra 8 layers MLM adafactor", encoder(tf.ElectraConfig, MLM, layers=8, embedding_size=32), "adafactor", {},
     2, 257, "no", 1),
    ("bert 8 layers LoRA (query, value) seq-cls", lora(encoder(tf.BertConfig, layers=8), ("query", "value")), "adamw",
     {}, 2, 128, "no", 1),
    ("llama 8 layers 1x1 token", decoder(tf.LlamaConfig, layers=8), "adamw", {}, 1, 1, "no", 1),
    ("llama 8 layers 3x7 torch_adafactor accum 4", decoder(tf.LlamaConfig, layers=8), "torch_adafactor", {}, 3, 7,
     "no", 4),
    ("llama pure bf16 + bf16 autocast", decoder(tf.LlamaConfig, dtype=BF16), "adamw", {}, 2, 64, "bf16", 1),
    ("distilbert 8 layers QA ckpt", lambda: checkpointed(lambda: tf.DistilBertForQuestionAnswering(tf.DistilBertConfig(
        vocab_size=VOCAB, dim=64, hidden_dim=128, n_layers=8, n_heads=4)))(), "adamw", {}, 3, 100, "no", 1),
    ("roberta pure bf16 adamw8bit", encoder(tf.RobertaConfig, dtype=BF16, pad_token_id=1), "adamw8bit", {}, 2, 64,
     "no", 1),
    ("llama LoRA ckpt", checkpointed(lora(decoder(tf.LlamaConfig, layers=4))), "adamw", {}, 2, 128, "no", 1),
    ("gemma frozen (tied) embeddings", frozen_embeddings(decoder(tf.GemmaConfig, head_dim=16)), "adamw", {}, 2, 64,
     "no", 1),
    ("qwen2 8 layers base model", decoder(tf.Qwen2Config, BASE, layers=8), "adamw", {}, 2, 64, "no", 1),
    ("albert base model", albert(BASE), "adamw", {}, 2, 64, "no", 1),
    ("mobilebert token-cls", mobilebert(TOK), "sgd", {"momentum": 0.9, "foreach": True}, 3, 100, "no", 1),
    ("deberta-v2 token-cls", encoder(tf.DebertaV2Config, TOK, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                     position_buckets=32), "adam", {"amsgrad": True}, 2, 64, "no", 1),
    ("deberta-v2 QA bf16 autocast", encoder(tf.DebertaV2Config, QA, relative_attention=True,
                                            pos_att_type=["p2c", "c2p"], position_buckets=32), "adamw", {}, 2, 64,
     "bf16", 1),
    ("electra QA nadam", encoder(tf.ElectraConfig, QA, embedding_size=32), "nadam", {}, 2, 64, "no", 1),
    ("llama 8 layers sgd fused", decoder(tf.LlamaConfig, layers=8), "sgd", {"fused": True, "momentum": 0.9}, 2, 64,
     "no", 1),
    ("gpt-neox radam foreach", gpt_neox(), "radam", {"foreach": True}, 2, 64, "no", 1),
    ("qwen3 adagrad accum 3 bf16 autocast", decoder(tf.Qwen3Config, head_dim=16), "adagrad", {}, 2, 64, "bf16", 3),
    ("llama eager attention ckpt", checkpointed(decoder(tf.LlamaConfig, attn_implementation="eager")), "adamw", {},
     2, 64, "no", 1),
    ("bart 8 encoder / 2 decoder layers", lambda: tf.BartForConditionalGeneration(tf.BartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=8, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=POSITIONS)),
     "adamw", {}, 2, 64, "no", 1),
    ("t5 8 encoder / 2 decoder layers", lambda: tf.T5ForConditionalGeneration(tf.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=8, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0)), "adamw", {}, 2, 64, "no", 1),
    ("qwen2 8 layers mixed sliding window", decoder(tf.Qwen2Config, layers=8, use_sliding_window=True,
                                                    sliding_window=32, max_window_layers=4), "adamw", {}, 2, 128,
     "no", 1),
    ("gpt-j LM", lambda: tf.GPTJForCausalLM(tf.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4,
                                                           rotary_dim=8, n_positions=POSITIONS)), "adamw", {},
     2, 64, "no", 1),
    ("big-bird seq-cls (block sparse)", lambda: tf.BigBirdForSequenceClassification(tf.BigBirdConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        block_size=16, num_random_blocks=2, max_position_embeddings=POSITIONS)), "adamw", {}, 2, 256, "no", 1),
    ("xlm-roberta token-cls", encoder(tf.XLMRobertaConfig, TOK, pad_token_id=1), "adamw", {}, 2, 64, "no", 1),
    ("funnel seq-cls", lambda: tf.FunnelForSequenceClassification(tf.FunnelConfig(
        vocab_size=VOCAB, d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1, 1])), "adamw", {},
     2, 64, "no", 1),
    ("t5 seq2seq LM, config without decoder_start_token_id", t5(config_start=False), "adamw", {}, 2, 64, "no", 1),
    ("t5 seq2seq LM", t5(), "adamw", {}, 2, 64, "no", 1),
    ("t5 base model", t5(BASE), "adamw", {}, 2, 64, "no", 1),
    ("bart seq2seq LM", bart(), "adamw", {}, 2, 64, "no", 1),
    ("bart seq-cls", bart(SEQ), "adamw", {}, 2, 64, "no", 1),
    *FAMILY_ROWS,
]


def one_row(name, build, optimizer, options, batch_size, seq_len, mixed_precision, steps) -> dict:
    """Return the row's estimate against its measurement, or the refusal or the crash."""
    torch.manual_seed(0)
    row = {"setup": name, "tokens": f"{steps}x({batch_size}x{seq_len})", "precision": mixed_precision}
    try:
        model = build()
    except Exception as error:  # noqa: BLE001 - a config this transformers release does not take is reported
        return {**row, "build failed": f"{type(error).__name__}: {error}".splitlines()[0]}
    start = time.perf_counter()
    try:
        estimate = memory.estimate_training_memory(
            model, optimizer, batch_size, seq_len, mixed_precision=mixed_precision,
            gradient_accumulation_steps=steps, **options,
        )
    except ValueError as refusal:
        return {**row, "refused": f"{type(refusal).__name__}: {refusal}"}
    except Exception as error:  # noqa: BLE001 - what the sweep looks for
        return {**row, "crashed": f"estimate: {type(error).__name__}: {error}".splitlines()[0],
                "trace": traceback.format_exc()}
    row["estimate_s"] = time.perf_counter() - start
    try:
        real_optimizer = memory.make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad],
                                               **options)
        batch = memory.training_batch(model, batch_size, seq_len, generator=torch.Generator().manual_seed(1))
        measured = memory.measure_training_step_peak(
            model, real_optimizer, batch, mixed_precision=mixed_precision, gradient_accumulation_steps=steps
        )
    except Exception as error:  # noqa: BLE001 - what the sweep looks for
        return {**row, "crashed": f"measurement: {type(error).__name__}: {error}".splitlines()[0],
                "trace": traceback.format_exc()}
    return {
        **row, "measured_peak": measured.peak, "estimated_peak": estimate.peak,
        "error_pct": 100 * (estimate.peak - measured.peak) / measured.peak,
        "measured_phase": measured.phase_of_peak, "estimated_phase": estimate.phase_of_peak,
    }


def describe(row: dict) -> str:
    head = f"{row['setup']:<46} {row['tokens']:>11} {row['precision']:>4}"
    if "error_pct" in row:
        return (f"{head} {row['measured_peak'] / MIB:9.2f} {row['estimated_peak'] / MIB:9.2f} "
                f"{row['error_pct']:+7.2f}%  {row['measured_phase']} / {row['estimated_phase']}"
                f"  ({row['estimate_s']:.1f} s)")
    for outcome in ("refused", "crashed", "build failed"):
        if outcome in row:
            return f"{head}  {outcome.upper()}: {row[outcome]}"
    raise AssertionError(row)


def tally(results: list[dict]) -> dict:
    """Return how many rows are byte-exact, within 2 %, further off, refused (with their reasons) and crashed."""
    compared = [r for r in results if "error_pct" in r]
    return {
        "rows": len(results),
        "compared": len(compared),
        "exact": sum(r["measured_peak"] == r["estimated_peak"] for r in compared),
        "within 2%": sum(abs(r["error_pct"]) <= 2 for r in compared),
        "off": [r for r in compared if not abs(r["error_pct"]) <= 2],
        "refused": [r for r in results if "refused" in r],
        "crashed": [r for r in results if "crashed" in r or "build failed" in r],
        "worst_pct": max((abs(r["error_pct"]) for r in compared), default=0.0),
    }


def print_tally(counts: dict) -> None:
    print(f"\n{counts['rows']} rows: {counts['compared']} planned and measured, {counts['exact']} byte-exact, "
          f"{counts['within 2%']} within 2% (worst {counts['worst_pct']:.3f}%), {len(counts['off'])} more than 2% "
          f"off; {len(counts['refused'])} refused, {len(counts['crashed'])} crashed")
    for r in counts["refused"]:
        print(f"  refused: {r['setup']}: {r['refused']}")
    for r in counts["off"]:
        print(f"  off: {r['setup']}: {r['error_pct']:+.3f}%")


# QLoRA's speed targets (issue 25): a 7B-shaped step planned in at most 5 s, a 70B-shaped one in at most 10 s.
QLORA_TARGETS_S = {"Llama-2-7B-shaped": 5.0, "Llama-2-70B-shaped (GQA)": 10.0}


def qlora_timings(batch_size: int = 1, seq_len: int = 512) -> list[dict]:
    """Return, for a 7B- and a 70B-shaped QLoRA model built on the meta device, the seconds to build it and to plan its step.

    Each row also has the plan's parameters part (``weights``) and the bytes of its quantisation states in it
    (``quant_state``).

    The recipe's model (NF4 with double quantisation, bf16 compute, LoRA rank 16 on every linear layer of the
    blocks, checkpointing on), paged 8-bit AdamW, ``batch_size`` x ``seq_len`` tokens; each plan is the first of
    its model (nothing cached). Wall and CPU seconds: on a shared machine the wall time says as much about the
    neighbours as about the planner.
    """
    from course_utils import models

    rows = []
    for name, target in QLORA_TARGETS_S.items():
        _, config = models.fine_tuning_configs()[name]
        start = time.perf_counter()
        model = memory.qlora_model(config)
        built = time.perf_counter() - start
        start, cpu_start = time.perf_counter(), time.process_time()
        plan = memory.estimate_training_memory(model, "paged_adamw8bit", batch_size, seq_len)
        rows.append({"model": name, "build_s": built, "plan_s": time.perf_counter() - start,
                     "plan_cpu_s": time.process_time() - cpu_start, "target_s": target, "peak": plan.peak,
                     "phase": plan.phase_of_peak, "tokens": f"{batch_size}x{seq_len}", "weights": plan.weights,
                     "quant_state": memory.quant_state_bytes(model), "quantised": quantised_weights(model)})
    return rows


def quantised_weights(model: torch.nn.Module) -> int:
    """Return how many weights ``model``'s 4-bit layers quantise (their quantisation states keep the original shapes)."""
    return sum(math.prod(weight.quant_state.shape) for _, _, weight in four_bit_weights(model))


def print_qlora_timings(rows: list[dict]) -> None:
    print("\nQLoRA step planned (paged_adamw8bit, NF4 base, LoRA r=16 on every linear layer, checkpointing), "
          "first plan of each model:")
    for row in rows:
        verdict = "meets" if row["plan_s"] <= row["target_s"] else "MISSES"
        print(f"  {row['model']:<26} {row['tokens']}: planned in {row['plan_s']:.1f} s (CPU {row['plan_cpu_s']:.1f} s; "
              f"target {row['target_s']:.0f} s: {verdict}), built on meta in {row['build_s']:.1f} s; peak "
              f"{row['peak'] / 1024**3:.2f} GiB ({row['phase']})")
        # The 4-bit weights' quantisation states are part of the weights the step holds (and the plan counts).
        print(f"  {'':<26} parameters part {row['weights'] / 1024**3:.2f} GiB with the quantisation states "
              f"({row['quant_state'] / 1024**3:.2f} GiB, {8 * row['quant_state'] / row['quantised']:.3f} bit per "
              f"4-bit weight), {(row['weights'] - row['quant_state']) / 1024**3:.2f} GiB without")
    print(f"  load average {os.getloadavg()[0]:.2f}")


def main(filters: list[str] | None = None) -> dict:
    """Print every row, the tally and QLoRA's timings; return them (``make bench`` runs it with no filter)."""
    # Tiny configs leave loss_type unset and use_cache on: transformers' notes about that say nothing about memory.
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(1)
    filters = filters or []
    rows = [r for r in ROWS if not filters or any(f in r[0] for f in filters)]
    print(f"{'set-up':<46} {'tokens':>11} {'mp':>4} {'measured':>9} {'estimate':>9} {'error':>8}  "
          "phase measured / estimated (MiB)")
    results = []
    for spec in rows:
        results.append(one_row(*spec))
        print(describe(results[-1]), flush=True)
    counts = tally(results)
    print_tally(counts)
    for r in counts["crashed"]:
        print(f"\n--- {r['setup']}\n{r.get('trace', r.get('build failed'))}")
    timings = qlora_timings() if not filters or "qlora speed" in filters else []
    if timings:
        print_qlora_timings(timings)
    return {"rows": results, "tally": {k: v if isinstance(v, (int, float)) else len(v) for k, v in counts.items()},
            "qlora_timings": timings}


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    sys.exit(1 if figures["tally"]["off"] or figures["tally"]["crashed"] else 0)
