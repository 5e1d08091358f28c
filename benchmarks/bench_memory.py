"""Benchmark: memory estimates against measurements (lessons 2-4).

Part 1, optimizer state: for each optimizer, the largest difference in bytes
between ``estimate_optimizer_state`` and the state of the real optimizer after
one step, over every architecture, dtype and option set of tests/test_memory.py
(expected: 0 B).

Part 2, one training step: for each configuration of tests/test_training_memory.py,
the peak measured by torch's MemTracker, the estimate, its error, and, for the
AdamW configurations, the error of the 16-bytes-per-parameter rule of thumb (a
rule for Adam: set against an SGD step it would count state SGD does not keep).

Part 2 is the analytical model (``explain_training_memory``) on its test grid.

Part 3, the planner (``estimate_training_memory``) on a grid the tests never
use: several architectures and heads (sequence classifiers, GPT-2 and a
Llama-shaped causal LM with grouped-query attention, a base model), fp32, pure
bf16 storage, bf16 autocast, activation checkpointing, frozen parts,
gradient accumulation, foreach and fused AdamW, SGD, both Adafactors, batch
shapes up to 512 tokens; every estimate against one real measured step (target:
within 2%, or refused with a reason). Then the time of a 7B-shaped and a
70B-shaped estimate (targets 10 s and 20 s), of per-process ZeRO-3 plans (lesson 7's planner:
a 7B-shaped model on 8 processes and a 70B-shaped one on 64, targets 5 s and 10 s on a quiet 2-core
machine; lesson 9's: the 70B-shaped one under tensor parallelism on 8, target 10 s), of a 70B-shaped
pipeline stage's plan (lesson 9: 8 stages, 1F1B; target 10 s a stage) and of a repeated estimate, the
least any exact answer for a never-seen batch shape needs (one fake forward and
backward of a 1-block GPT-2, FakeTensorMode alone), and lesson 4's explorer
driven through a scripted sequence of moves, most of them to set-ups never seen
before (each redraw: target 1 s).

Run: ``.venv/bin/python -m benchmarks.bench_memory`` (all parts), or with ``--planner-speed`` for the
timings and the explorer moves alone, or with ``--per-process-planner`` for the per-process plans alone.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

MiB = 2**20


def optimizer_state_differences() -> dict[str, int]:
    """Return, per optimizer name, the largest |estimate - measured| in bytes over the test grid.

    Runs in a fresh interpreter: once bitsandbytes is imported, accelerate's
    notebook_launcher refuses to start, and other benchmarks may run after this one.
    """
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_memory", "--optimizer-state-json"], cwd=REPO, capture_output=True, text=True,
        check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _optimizer_state_differences_here() -> dict[str, int]:
    import torch
    from tests.memory.test_memory import ARCHITECTURES, OPTIMIZER_SETTINGS, _one_real_step

    from course_utils import memory

    worst: dict[str, int] = {}
    for setting in OPTIMIZER_SETTINGS:
        if hasattr(setting, "marks"):  # a pytest.param: skipped in the tests for a stated reason
            continue
        name, options = setting
        for architecture in ARCHITECTURES.values():
            for dtype in (torch.float32, torch.bfloat16):
                torch.manual_seed(0)
                model = architecture().to(dtype)
                estimate = memory.estimate_optimizer_state(model, name, **options)
                measured = memory.measure_optimizer_state(_one_real_step(model, name, options))
                worst[name] = max(worst.get(name, 0), abs(estimate - measured))
    return worst


def training_step_rows() -> list[dict]:
    """Return one row per training-memory grid point: measured and estimated peaks, errors, phases."""
    from tests.memory.test_training_memory import GRID, estimate_and_measure

    from course_utils import memory

    rows = []
    for configuration in GRID:
        model, estimate, measured = estimate_and_measure(configuration)
        # The rule is for Adam; on an SGD step there is nothing fair to compare.
        rule = memory.rule_of_thumb_training_memory(model) if configuration.optimizer == "adamw" else None
        rows.append(
            {
                "configuration": configuration.name,
                "measured_peak": measured.peak,
                "estimated_peak": estimate.peak,
                "error_pct": 100 * (estimate.peak - measured.peak) / measured.peak,
                "rule_of_thumb": rule,
                "rule_of_thumb_error_pct": None if rule is None else 100 * (rule - measured.peak) / measured.peak,
                "measured_phase": measured.phase_of_peak,
                "estimated_phase": estimate.phase_of_peak,
            }
        )
    return rows


# --------------------------------------------------------------------------- part 3: the planner


def _planner_grid():
    """Return the held-out set-ups: (name, build, optimizer, options, batch, seq_len, mixed_precision, accumulation)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, BertModel
    from transformers import BertConfig, DistilBertConfig, GPT2Config, LlamaConfig

    def distilbert(dtype=torch.float32, vocab_size=3000, **extra):
        config = DistilBertConfig(vocab_size=vocab_size, dim=96, hidden_dim=256, n_layers=5, n_heads=4, **extra)
        return AutoModelForSequenceClassification.from_config(config, dtype=dtype)

    def bert(dtype=torch.float32):
        config = BertConfig(vocab_size=2500, hidden_size=96, intermediate_size=320, num_hidden_layers=4,
                            num_attention_heads=3)
        return AutoModelForSequenceClassification.from_config(config, dtype=dtype)

    def bert_base_model():
        return BertModel(BertConfig(vocab_size=2000, hidden_size=64, intermediate_size=256, num_hidden_layers=5,
                                    num_attention_heads=4))

    def gpt2_classifier(dtype=torch.float32):
        config = GPT2Config(vocab_size=2000, n_embd=96, n_layer=4, n_head=4, pad_token_id=0, bos_token_id=0,
                            eos_token_id=0)
        return AutoModelForSequenceClassification.from_config(config, dtype=dtype)

    def gpt2_lm(dtype=torch.float32):
        config = GPT2Config(vocab_size=4000, n_embd=80, n_layer=5, n_head=4, bos_token_id=0, eos_token_id=0)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)

    def llama(dtype=torch.float32):
        config = LlamaConfig(vocab_size=3000, hidden_size=128, intermediate_size=344, num_hidden_layers=5,
                             num_attention_heads=8, num_key_value_heads=2)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)

    def checkpointed(build):
        def built():
            model = build()
            model.activation_checkpointing_enable()
            return model
        return built

    def frozen_base(build):
        def built():
            model = build()
            model.base_model.requires_grad_(False)
            return model
        return built

    def frozen_half(build):
        def built():
            model = build()
            for layer in model.model.layers[: len(model.model.layers) // 2]:
                layer.requires_grad_(False)
            return model
        return built

    def lora(build):
        def built():
            import warnings

            from peft import LoraConfig, get_peft_model

            with warnings.catch_warnings():
                # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`: theirs to update.
                warnings.simplefilter("ignore", FutureWarning)
                config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
                return get_peft_model(build(), config)
        return built

    def wrapped_blocks(build):
        def built():
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )

            model = build()
            block = type(model.distilbert.transformer.layer[0])
            apply_activation_checkpointing(model, checkpoint_wrapper, check_fn=lambda module: isinstance(module, block))
            return model
        return built

    bf16 = torch.bfloat16
    return [
        ("llama-gqa LoRA r=8 (q, v)", lora(llama), "adamw", {}, 2, 256, "no", 1),
        ("distilbert torch checkpoint_wrapper", wrapped_blocks(distilbert), "adamw", {}, 4, 128, "no", 1),
        ("gpt2 LM head nadam", gpt2_lm, "nadam", {}, 2, 128, "no", 1),
        ("gpt2-cls bf16 autocast", gpt2_classifier, "adamw", {}, 4, 128, "bf16", 1),
        ("distilbert checkpointing", checkpointed(distilbert), "adamw", {}, 4, 128, "no", 1),
        ("distilbert frozen encoder", frozen_base(distilbert), "adamw", {}, 4, 128, "no", 1),
        ("distilbert accumulation 2x(2x512)", distilbert, "adamw", {}, 2, 512, "no", 2),
        ("llama-gqa causal LM", llama, "adamw", {}, 2, 256, "no", 1),
        ("gpt2 LM head", gpt2_lm, "adamw", {}, 2, 128, "no", 1),
        ("bert-cls pure bf16", lambda: bert(bf16), "adamw", {}, 4, 64, "no", 1),
        ("distilbert adamw foreach", distilbert, "adamw", {"foreach": True}, 8, 64, "no", 1),
        ("distilbert adamw fused", distilbert, "adamw", {"fused": True}, 8, 64, "no", 1),
        ("llama-gqa pure bf16", lambda: llama(bf16), "adamw", {}, 1, 512, "no", 1),
        ("llama-gqa bf16 autocast checkpointing", checkpointed(llama), "adamw", {}, 2, 128, "bf16", 1),
        ("llama-gqa first half frozen", frozen_half(llama), "sgd", {"momentum": 0.9}, 4, 64, "no", 1),
        ("gpt2 LM head accumulation 3", gpt2_lm, "adafactor", {}, 2, 64, "no", 3),
        ("bert base model sgd", bert_base_model, "sgd", {}, 8, 128, "no", 1),
        ("bert-cls torch adafactor autocast", bert, "torch_adafactor", {}, 2, 256, "bf16", 1),
        ("distilbert no attention dropout", lambda: distilbert(attention_dropout=0.0), "adam", {}, 4, 256, "no", 1),
        ("gpt2-cls checkpointing foreach", checkpointed(gpt2_classifier), "adamw", {"foreach": True}, 2, 512, "no", 1),
        ("distilbert adamw8bit", distilbert, "adamw8bit", {}, 4, 64, "no", 1),
        ("distilbert big vocab adamw8bit (step peaks)", lambda: distilbert(vocab_size=28996), "adamw8bit", {},
         1, 16, "no", 1),
        ("llama-gqa pure bf16 adam8bit", lambda: llama(bf16), "adam8bit", {}, 1, 32, "no", 1),
    ]


def planner_rows() -> list[dict]:
    """Return one row per held-out set-up: the planner's estimate (or its refusal) against one real measured step."""
    import torch
    from transformers.utils import logging as transformers_logging

    from course_utils import memory

    # The grid's small configs leave loss_type unset and use_cache on: transformers' notes about
    # that ("default loss", "use_cache=False under checkpointing") say nothing about memory.
    transformers_logging.set_verbosity_error()
    rows = []
    for name, build, optimizer, options, batch_size, seq_len, mixed_precision, steps in _planner_grid():
        torch.manual_seed(0)
        model = build()
        row = {"setup": name, "tokens": f"{steps}x({batch_size}x{seq_len})"}
        start = time.perf_counter()
        try:
            estimate = memory.estimate_training_memory(
                model, optimizer, batch_size, seq_len, mixed_precision=mixed_precision,
                gradient_accumulation_steps=steps, **options,
            )
        except ValueError as refusal:
            rows.append({**row, "refused": str(refusal)})
            continue
        row["estimate_s"] = time.perf_counter() - start
        real_optimizer = memory.make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], **options)
        batch = memory.training_batch(model, batch_size, seq_len, generator=torch.Generator().manual_seed(1))
        measured = memory.measure_training_step_peak(
            model, real_optimizer, batch, mixed_precision=mixed_precision, gradient_accumulation_steps=steps
        )
        rows.append({
            **row,
            "measured_peak": measured.peak,
            "estimated_peak": estimate.peak,
            "error_pct": 100 * (estimate.peak - measured.peak) / measured.peak,
            "measured_phase": measured.phase_of_peak,
            "estimated_phase": estimate.phase_of_peak,
        })
    return rows


def planner_timings() -> dict[str, float]:
    """Return seconds for a 7B-shaped and a 70B-shaped bf16 AdamW estimate (1 x 512 tokens), and for a repeat."""
    import torch

    from course_utils import memory, models

    architectures = models.fine_tuning_architectures(torch.bfloat16)
    timings = {}
    for label, name in (("7B", "Llama-2-7B-shaped"), ("70B", "Llama-2-70B-shaped (GQA)")):
        start, cpu_start = time.perf_counter(), time.process_time()
        memory.estimate_training_memory(architectures[name], "adamw", 1, 512)
        timings[label] = time.perf_counter() - start
        # On a shared machine the wall time says as much about the neighbours as about the planner.
        timings[f"{label} cpu"] = time.process_time() - cpu_start
    start = time.perf_counter()
    memory.estimate_training_memory(architectures["Llama-2-7B-shaped"], "adamw", 1, 512)
    timings["repeat"] = time.perf_counter() - start
    return timings


def per_process_planner_timings() -> dict[str, float]:
    """Return seconds for per-process plans (bf16 AdamW, 1 x 512): ZeRO-3 (lesson 7), 7B-shaped on 8 processes and
    70B-shaped on 64; tensor parallelism (lesson 9), 70B-shaped with tp=8; a 70B-shaped pipeline of 8 stages (lesson 9:
    1F1B, 8 micro-batches of 1 x 512), its first, a middle and its last stage."""
    import torch

    from course_utils import layouts, memory, models

    architectures = models.fine_tuning_architectures(torch.bfloat16)
    timings = {}
    for label, name, world_size in (("7B on 8", "Llama-2-7B-shaped", 8), ("70B on 64", "Llama-2-70B-shaped (GQA)", 64)):
        start, cpu_start = time.perf_counter(), time.process_time()
        plan = memory.estimate_training_memory(architectures[name], "adamw", 1, 512, world_size=world_size,
                                               sharding="zero3")
        timings[label] = time.perf_counter() - start
        timings[f"{label} cpu"] = time.process_time() - cpu_start
        timings[f"{label} peak GiB"] = plan.peak / 1024**3
    # Lesson 9's planner: tensor parallelism, the 70B-shaped model's blocks split over 8 processes.
    start, cpu_start = time.perf_counter(), time.process_time()
    plan = memory.estimate_training_memory(architectures["Llama-2-70B-shaped (GQA)"], "adamw", 1, 512,
                                           layout=layouts.Layout("none", 8, tp=8))
    timings["70B tp=8"] = time.perf_counter() - start
    timings["70B tp=8 cpu"] = time.process_time() - cpu_start
    timings["70B tp=8 peak GiB"] = plan.peak / 1024**3
    pipeline = layouts.Layout("none", 8, pp=8, schedule="1f1b", microbatches=8)
    for stage in (0, 3, 7):
        label = f"70B pp=8 stage {stage}"
        start, cpu_start = time.perf_counter(), time.process_time()
        plan = memory.estimate_training_memory(architectures["Llama-2-70B-shaped (GQA)"], "adamw", 8, 512,
                                               layout=pipeline, rank=stage)
        timings[label] = time.perf_counter() - start
        timings[f"{label} cpu"] = time.process_time() - cpu_start
        timings[f"{label} peak GiB"] = plan.peak / 1024**3
    return timings


def print_per_process_planner_timings(timings: dict[str, float]) -> None:
    print(
        f"  per process, ZeRO-3, bf16 AdamW, 1 x 512 tokens: 7B-shaped on 8 processes {timings['7B on 8']:.1f} s "
        f"(CPU {timings['7B on 8 cpu']:.1f} s; target 5 s; peak {timings['7B on 8 peak GiB']:.2f} GiB), 70B-shaped "
        f"on 64 {timings['70B on 64']:.1f} s (CPU {timings['70B on 64 cpu']:.1f} s; target 10 s; peak "
        f"{timings['70B on 64 peak GiB']:.2f} GiB); tensor-parallel, 70B-shaped on tp=8 {timings['70B tp=8']:.1f} s "
        f"(CPU {timings['70B tp=8 cpu']:.1f} s; target 10 s; peak {timings['70B tp=8 peak GiB']:.2f} GiB); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    stages = ", ".join(
        f"stage {stage} {timings[f'70B pp=8 stage {stage}']:.1f} s (CPU {timings[f'70B pp=8 stage {stage} cpu']:.1f} s; "
        f"peak {timings[f'70B pp=8 stage {stage} peak GiB']:.2f} GiB)" for stage in (0, 3, 7))
    print(f"  per stage, 70B-shaped on 8 pipeline stages, 1F1B, bf16 AdamW, 8 micro-batches of 1 x 512 tokens: "
          f"{stages}; target 10 s a stage; load average {os.getloadavg()[0]:.2f}")


def context_parallel_planner_timings() -> dict[str, float]:
    """Return seconds for per-process context-parallel plans (lesson 9): 7B-shaped split over 8 processes (bf16 AdamW, 1 x 2048), the last process."""
    import torch

    from course_utils import layouts, memory, models

    model = models.fine_tuning_architectures(torch.bfloat16)["Llama-2-7B-shaped"]
    start, cpu_start = time.perf_counter(), time.process_time()
    # The last process: it computes every block of the causal ring (the first computes one).
    plan = memory.estimate_training_memory(model, "adamw", 1, 2048, layout=layouts.Layout("none", 8, cp=8), rank=7)
    return {"7B cp 8": time.perf_counter() - start, "7B cp 8 cpu": time.process_time() - cpu_start,
            "7B cp 8 peak GiB": plan.peak / 1024**3}


def print_context_parallel_planner_timings(timings: dict[str, float]) -> None:
    print(
        f"  per process, context parallel (cp=8, ring attention), bf16 AdamW, 1 x 2048 tokens: 7B-shaped, its last "
        f"process {timings['7B cp 8']:.1f} s (CPU {timings['7B cp 8 cpu']:.1f} s; target 5 s; peak "
        f"{timings['7B cp 8 peak GiB']:.2f} GiB); load average {os.getloadavg()[0]:.2f}"
    )


def new_shape_least_work(batch_size: int = 7, seq_len: int = 96) -> dict:
    """Return the least a batch shape never seen before costs the planner on GPT-2 with its LM head (CPU seconds).

    Any exact answer for a new shape needs at least one fake forward and
    backward of the embeddings, one block, the head and the loss at that shape
    (and the planner then needs more blocks, to see what each one adds). Timed
    here with FakeTensorMode alone: no tracker, no copy, no planner bookkeeping;
    at the new shape, then again once torch's fake-kernel cache has seen it.
    ``batch_size`` x ``seq_len`` must be a shape nothing before ran in this process (a first pass
    runs at ``seq_len + 1``).
    """
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from course_utils import models
    from course_utils.memory import fake_tensors
    from course_utils.memory import training_batch
    from course_utils.memory.step import default_loss, forward

    model = models.fine_tuning_architectures(torch.float32)["GPT-2 with its LM head"]

    class CountOperations(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOperations.count += 1
            return func(*args, **(kwargs or {}))

    def one_pass(shape, counting=False):
        mode = FakeTensorMode()
        fake = fake_tensors.fake_copy(model, mode, 1)
        fake.train()
        with mode, fake_tensors.an_unpadded_batch():
            batch = training_batch(fake, *shape)
            cpu_start = time.process_time()
            with CountOperations() if counting else contextlib.nullcontext():
                forward(fake, batch, default_loss, "bf16").backward()
            return time.process_time() - cpu_start

    # First at another shape: what a first pass in a process costs once (imports, kernel
    # registrations) is not what each new shape costs.
    fake_tensors.quietly(one_pass, (batch_size, seq_len + 1))
    new = fake_tensors.quietly(one_pass, (batch_size, seq_len))
    seen = fake_tensors.quietly(one_pass, (batch_size, seq_len))
    fake_tensors.quietly(one_pass, (batch_size, seq_len), True)
    return {"shape": f"{batch_size} x {seq_len}", "operations": CountOperations.count, "new_cpu": new, "seen_cpu": seen}


def print_new_shape_least_work(least: dict) -> None:
    print(f"  the least a never-seen shape needs (GPT-2 with its LM head, bf16 autocast, {least['shape']} tokens): "
          f"one fake forward and backward with 1 block, {least['operations']} operations, "
          f"{least['new_cpu']:.2f} s CPU at the new shape, {least['seen_cpu']:.2f} s once seen "
          f"(FakeTensorMode alone, {1000 * least['new_cpu'] / least['operations']:.2f} and "
          f"{1000 * least['seen_cpu'] / least['operations']:.2f} ms per operation)")


def _explorer_models(dtype, checkpointing):
    """Lesson 4's explorer models: the fine-tuning architectures on the meta device, from the lesson's own builder."""
    from course_utils import models

    return models.fine_tuning_architectures(dtype, checkpointing)


# Each move sets one control of lesson 4's explorer; all but the returns lead to set-ups never seen before.
EXPLORER_MOVES = [
    ("batch_size", 8), ("batch_size", 16), ("batch_size", 32), ("batch_size", 1), ("batch_size", 4),
    ("seq_len", 256), ("seq_len", 512), ("seq_len", 1024), ("seq_len", 2048), ("seq_len", 128),
    ("optimizer", "AdamW, foreach"), ("optimizer", "SGD with momentum"), ("optimizer", "Adafactor"),
    ("optimizer", "8-bit AdamW"), ("optimizer", "AdamW"),
    ("precision", "fp32"), ("precision", "pure bf16"), ("precision", "bf16 mixed precision"),
    ("checkpointing", True), ("accumulation", 2), ("accumulation", 4), ("accumulation", 8),
    ("model", "distilbert-base-cased"), ("batch_size", 16), ("model", "BERT-base classifier"),
    ("seq_len", 512), ("model", "Llama-2-7B-shaped"), ("optimizer", "SGD with momentum"),
    ("model", "Mistral-7B-shaped (GQA)"), ("precision", "pure bf16"), ("model", "Llama-2-70B-shaped (GQA)"),
    ("batch_size", 2), ("checkpointing", False), ("seq_len", 2048), ("accumulation", 1),
    ("model", "course model (tiny DistilBERT)"), ("optimizer", "AdamW"), ("model", "GPT-2 with its LM head"),
]


def explorer_redraws() -> list[dict]:
    """Return one row per scripted explorer move: the control, its new value and the redraw's seconds (wall, CPU).

    The explorer is lesson 4's (its models, optimizers, precisions, slider
    values and reference), started at the lesson's first set-up; a redraw
    counts the planner calls and the figure rendered to PNG, as a notebook
    shows it.
    """
    import contextlib
    import io

    import torch
    from transformers.utils import logging as transformers_logging

    from course_utils import memory, plots

    transformers_logging.set_verbosity_error()
    optimizers = {"AdamW": ("adamw", {}), "AdamW, foreach": ("adamw", {"foreach": True}),
                  "SGD with momentum": ("sgd", {"momentum": 0.9}), "Adafactor": ("adafactor", {}),
                  "8-bit AdamW": ("adamw8bit", {})}
    precisions = {"fp32": (torch.float32, "no"), "bf16 mixed precision": (torch.float32, "bf16"),
                  "pure bf16": (torch.bfloat16, "no")}
    built: dict = {}

    def plan_step(model_name, dtype, checkpointing, setup):
        if (dtype, checkpointing) not in built:
            built[dtype, checkpointing] = _explorer_models(dtype, checkpointing)
        return memory.plan(built[dtype, checkpointing][model_name], setup)

    names = list(_explorer_models(torch.float32, False))
    with contextlib.redirect_stdout(io.StringIO()):  # outside a kernel, display() prints the figure's repr
        explorer = plots.training_memory_explorer(
            names, plan_step, optimizers, precisions, batch_sizes=(1, 2, 4, 8, 16, 32),
            seq_lens=(128, 256, 512, 1024, 2048), reference_optimizer="AdamW",
            initial={"model": "GPT-2 with its LM head", "optimizer": "AdamW", "precision": "bf16 mixed precision",
                     "batch_size": 4, "seq_len": 128},
        )
        rows = []
        for control, value in EXPLORER_MOVES:
            start, cpu_start = time.perf_counter(), time.process_time()
            getattr(explorer, control).value = value
            explorer.figure.savefig(io.BytesIO(), format="png")
            rows.append({"control": control, "value": value, "seconds": time.perf_counter() - start,
                         "cpu_seconds": time.process_time() - cpu_start, "summary": explorer.summary.value})
    return rows


def print_explorer_redraws(rows: list[dict]) -> None:
    import statistics

    print("\nlesson 4's explorer, one scripted move at a time (redraw: planner calls and the PNG; target 1 s):")
    for row in rows:
        print(f"  {row['control']:>13} = {str(row['value']):<32} {row['seconds']:6.2f} s (CPU {row['cpu_seconds']:5.2f} s)")
    seconds = [row["seconds"] for row in rows]
    cpu = [row["cpu_seconds"] for row in rows]
    print(f"  {len(rows)} moves: median {statistics.median(seconds):.2f} s, worst {max(seconds):.2f} s "
          f"(CPU median {statistics.median(cpu):.2f} s, worst {max(cpu):.2f} s); load average "
          f"{os.getloadavg()[0]:.2f}")


def main() -> dict:
    """Print both parts; return the figures: per-optimizer differences, per-configuration rows, worst errors (%)."""
    start = time.perf_counter()
    differences = optimizer_state_differences()
    print("optimizer state after one step, estimate vs measured, largest |difference| over the test grid:")
    for name, difference in differences.items():
        print(f"  {name:16s} {difference:>6d} B")

    rows = training_step_rows()
    print("\none training step (fp32, CPU), peak measured by MemTracker vs the analytical model:")
    header = f"{'configuration':48s} {'measured':>9s} {'estimate':>9s} {'error':>7s} {'16 B/param':>10s} {'error':>7s}"
    print(f"  {header}  phase")
    for row in rows:
        phase = row["measured_phase"]
        if row["estimated_phase"] != phase:
            phase += f" (estimate: {row['estimated_phase']})"
        if row["rule_of_thumb"] is None:
            rule_columns = f"{'(SGD)':>10s} {'':>7s}"
        else:
            rule_columns = f"{row['rule_of_thumb'] / MiB:8.1f}Mi {row['rule_of_thumb_error_pct']:+6.1f}%"
        print(
            f"  {row['configuration']:48s} {row['measured_peak'] / MiB:7.1f}Mi {row['estimated_peak'] / MiB:7.1f}Mi"
            f" {row['error_pct']:+6.2f}% {rule_columns}  {phase}"
        )
    worst = max(rows, key=lambda row: abs(row["error_pct"]))
    adam_rows = [row for row in rows if row["rule_of_thumb"] is not None]
    worst_rule = max(adam_rows, key=lambda row: abs(row["rule_of_thumb_error_pct"]))
    print(f"\n  worst estimate error:      {worst['error_pct']:+.3f}% over all {len(rows)} ({worst['configuration']})")
    print(
        f"  worst rule-of-thumb error: {worst_rule['rule_of_thumb_error_pct']:+.1f}% over the {len(adam_rows)} AdamW "
        f"configurations ({worst_rule['configuration']})"
    )

    planned = planner_rows()
    print("\nthe planner on a held-out grid (CPU), estimate vs one real step measured by MemTracker:")
    print(f"  {'set-up':46s} {'tokens':>10s} {'measured':>9s} {'estimate':>9s} {'error':>8s}  phase")
    for row in planned:
        if "refused" in row:
            print(f"  {row['setup']:46s} {row['tokens']:>10s} refused: {row['refused']}")
            continue
        phase = row["measured_phase"]
        if row["estimated_phase"] != phase:
            phase += f" (estimate: {row['estimated_phase']})"
        print(
            f"  {row['setup']:46s} {row['tokens']:>10s} {row['measured_peak'] / MiB:7.2f}Mi"
            f" {row['estimated_peak'] / MiB:7.2f}Mi {row['error_pct']:+7.3f}%  {phase}"
        )
    estimated = [row for row in planned if "refused" not in row]
    worst_planned = max(estimated, key=lambda row: abs(row["error_pct"]))
    print(
        f"\n  worst planner error: {worst_planned['error_pct']:+.3f}% over {len(estimated)} set-ups "
        f"({worst_planned['setup']}); refused: {len(planned) - len(estimated)} (target: within 2% or refused)"
    )
    timings = planner_timings()
    print(
        f"  bf16 AdamW, 1 x 512 tokens: 7B-shaped estimate {timings['7B']:.1f} s (CPU {timings['7B cpu']:.1f} s; "
        f"target 10 s), 70B-shaped {timings['70B']:.1f} s (CPU {timings['70B cpu']:.1f} s; target 20 s); the same "
        f"estimate again (an explorer redraw) {timings['repeat']:.3f} s (target 1 s); load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    per_process = per_process_planner_timings()
    print_per_process_planner_timings(per_process)
    context_parallel = context_parallel_planner_timings()
    print_context_parallel_planner_timings(context_parallel)
    least = new_shape_least_work()
    print_new_shape_least_work(least)
    redraws = explorer_redraws()
    print_explorer_redraws(redraws)
    print(f"  ({time.perf_counter() - start:.0f} s)")
    return {
        "optimizer_state_max_abs_difference_bytes": differences,
        "training_step": rows,
        "worst_estimate_error_pct": worst["error_pct"],
        "worst_rule_of_thumb_error_pct": worst_rule["rule_of_thumb_error_pct"],
        "planner": planned,
        "worst_planner_error_pct": worst_planned["error_pct"],
        "planner_seconds": timings,
        "per_process_planner_seconds": per_process,
        "context_parallel_planner_seconds": context_parallel,
        "new_shape_least_work": least,
        "explorer_redraws": redraws,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--optimizer-state-json"]:
        print(json.dumps(_optimizer_state_differences_here()))
    elif sys.argv[1:] == ["--planner-speed"]:  # part 3's timings alone: the 7B and 70B estimates, the explorer
        seconds = planner_timings()
        print(f"7B-shaped {seconds['7B']:.1f} s (CPU {seconds['7B cpu']:.1f} s), 70B-shaped {seconds['70B']:.1f} s "
              f"(CPU {seconds['70B cpu']:.1f} s); load average {os.getloadavg()[0]:.2f}")
        print_per_process_planner_timings(per_process_planner_timings())
        print_new_shape_least_work(new_shape_least_work())
        print_explorer_redraws(explorer_redraws())
    elif sys.argv[1:] == ["--per-process-planner"]:  # the 7B-on-8 and 70B-on-64 ZeRO-3 plans, the 70B stages, alone
        print_per_process_planner_timings(per_process_planner_timings())
    elif sys.argv[1:] == ["--context-parallel-planner"]:  # the 7B context-parallel plan alone
        print_context_parallel_planner_timings(context_parallel_planner_timings())
    else:
        main()
