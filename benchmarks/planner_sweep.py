"""Sweep the planner over set-ups the course never uses: many architectures and heads, small enough to measure.

Each row builds a tiny transformers model from its config (real tensors), asks
``memory.estimate_training_memory`` for its peak, then measures the same step
for real with ``memory.measure_training_step_peak`` (the pattern of
``bench_memory.planner_rows``). It prints one line per row: the set-up, the
measured and estimated peaks (MiB), the error, the phases, or the refusal or
exception text. Rows more than 2% off and crashes are listed at the end.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        .venv/bin/python benchmarks/planner_sweep.py [SUBSTRING ...]

With substrings, only the rows whose name contains one of them run.
"""

from __future__ import annotations

import sys
import time
import traceback
import warnings

import torch
import transformers as tf
from transformers.utils import logging as transformers_logging

from course_utils import memory
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


SEQ, TOK, QA, MLM, LM, BASE = (tf.AutoModelForSequenceClassification, tf.AutoModelForTokenClassification,
                               tf.AutoModelForQuestionAnswering, tf.AutoModelForMaskedLM, tf.AutoModelForCausalLM,
                               tf.AutoModel)
MOM = {"momentum": 0.9}

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
    ("t5 seq2seq LM, config without decoder_start_token_id", t5(config_start=False), "adamw", {}, 2, 64, "no", 1),
    ("t5 seq2seq LM", t5(), "adamw", {}, 2, 64, "no", 1),
    ("t5 base model", t5(BASE), "adamw", {}, 2, 64, "no", 1),
    ("bart seq2seq LM", bart(), "adamw", {}, 2, 64, "no", 1),
    ("bart seq-cls", bart(SEQ), "adamw", {}, 2, 64, "no", 1),
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


def main(filters: list[str]) -> int:
    # Tiny configs leave loss_type unset and use_cache on: transformers' notes about that say nothing about memory.
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(1)
    rows = [r for r in ROWS if not filters or any(f in r[0] for f in filters)]
    print(f"{'set-up':<46} {'tokens':>11} {'mp':>4} {'measured':>9} {'estimate':>9} {'error':>8}  "
          "phase measured / estimated (MiB)")
    results = []
    for spec in rows:
        results.append(one_row(*spec))
        print(describe(results[-1]), flush=True)
    off = [r for r in results if "error_pct" in r and abs(r["error_pct"]) > 2]
    crashed = [r for r in results if "crashed" in r or "build failed" in r]
    compared = [r for r in results if "error_pct" in r]
    exact = sum(r["measured_peak"] == r["estimated_peak"] for r in compared)
    worst = max((abs(r["error_pct"]) for r in compared), default=0.0)
    print(f"\n{len(results)} rows: {len(compared)} compared ({exact} byte-exact, worst {worst:.2f}%), "
          f"{sum('refused' in r for r in results)} refused, {len(crashed)} crashed, {len(off)} more than 2% off")
    for r in crashed:
        print(f"\n--- {r['setup']}\n{r.get('trace', r.get('build failed'))}")
    return 1 if off or crashed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
