"""Lesson 7's figure data: per-process plans of Llama-shaped models from 1B to 405B, on 1 to 512 processes.

The figure "memory per GPU against parameter count" needs more plans than a
lesson's 90 s allow live, so ``tools/lesson7_sharding_plans.py`` makes them
with :func:`course_utils.memory.estimate_training_memory` and writes
``lessons/cached/07_sharding_plans.json``; :func:`load_cached_plans` reads it and
:func:`replan` makes one of its points again, live, to show the file matches.
:func:`where_it_fits` answers "where does this model fit, and with what".
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from course_utils import gpus, memory
from course_utils.validation import check_choice, check_instance, check_non_negative_int, check_positive_int

__all__ = ["MODEL_SHAPES", "SEARCHES", "SETUPS", "SEVENTY_B", "STEP", "CACHE", "build_model", "fewest_processes",
           "load_cached_plans", "replan", "rule_describes", "rule_of_thumb", "where_it_fits"]

CACHE = Path(__file__).resolve().parents[1] / "lessons" / "cached" / "07_sharding_plans.json"

# Shapes from the models' published configs (their config.json on the Hugging Face Hub).
MODEL_SHAPES: dict[str, dict] = {
    # TinyLlama-1.1B: Llama-2's vocabulary, grouped-query attention (4 key/value heads for 32).
    "TinyLlama-1.1B-shaped (GQA)": {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
                                    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4},
    "Llama-2-7B-shaped": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32},
    "Llama-2-13B-shaped": {"vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
                           "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40},
    "Llama-2-70B-shaped (GQA)": {"vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672,
                                 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8},
    # Llama-3.1-405B: a 128,256-token vocabulary, 8 key/value heads for 128.
    "Llama-3.1-405B-shaped (GQA)": {"vocab_size": 128256, "hidden_size": 16384, "intermediate_size": 53248,
                                    "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8},
}

SEVENTY_B = "Llama-2-70B-shaped (GQA)"
"""The model of lesson 7's question "where does 70B fit?"."""

# (processes, strategy) of each curve: one process alone, DDP (what each process holds does not depend on how
# many there are: one curve, planned on 8), then ZeRO-1, ZeRO-2 and ZeRO-3 on 8, 64 and 512 (process 0 of each:
# under ZeRO-1 it holds the state of the largest tensor, which torch assigns first).
SETUPS: tuple[tuple[int, str], ...] = (
    (1, "none"), (8, "ddp"), (8, "zero1"), (64, "zero1"), (512, "zero1"), (8, "zero2"), (64, "zero2"), (512, "zero2"),
    (8, "zero3"), (64, "zero3"), (512, "zero3"),
)

# The step each process runs: fp32 weights, AdamW, one sequence of 512 tokens per process. fp32 with AdamW is
# the set-up of the "16 bytes per parameter" rule (4 weights, 4 gradients, 8 optimizer state).
STEP: dict = {"optimizer": "adamw", "batch_size": 1, "seq_len": 512}

# The variants of the step whose fewest GPUs lesson 7 searches for (ZeRO-3, on the largest figure card):
# as STEP; with activation checkpointing; with the forward pass under bf16 autocast (fp32 weights, as Accelerate's
# mixed_precision="bf16"); with the model built in bf16 (weights, gradients and AdamW's moments all bf16).
SEARCHES: dict[str, dict] = {
    "fp32": {},
    "fp32, activation checkpointing": {"checkpointing": True},
    "bf16 autocast": {"mixed_precision": "bf16"},
    "bf16 weights": {"dtype": "bf16"},
}

_FIELDS = ("weights", "gradients", "optimizer_state", "activations", "peak", "phase_of_peak")


def build_model(name: str, dtype: str = "fp32", checkpointing: bool = False) -> torch.nn.Module:
    """Return the causal LM ``name`` (a key of ``MODEL_SHAPES``) on the meta device: no weights, no memory.

    ``dtype``: "fp32" or "bf16" (the parameters' storage); ``checkpointing``: with activation checkpointing
    (transformers' ``activation_checkpointing_enable()``, each block's activations recomputed in the backward pass).
    """
    check_choice(name, "name", tuple(MODEL_SHAPES))
    check_choice(dtype, "dtype", ("fp32", "bf16"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            LlamaConfig(**MODEL_SHAPES[name]), dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
    if checkpointing:
        model.activation_checkpointing_enable()
    return model


def fewest_processes(name: str, card_bytes: int, *, most: int = 512, sharding: str = "zero3",
                     mixed_precision: str = "no", dtype: str = "fp32", checkpointing: bool = False) -> dict:
    """Return the fewest processes (2 to ``most``) on which one process's planned peak of ``name`` fits ``card_bytes``.

    A bisection over the number of processes N with :func:`memory.estimate_training_memory` (``STEP`` per
    process, ``sharding``, ``mixed_precision``, a model of :func:`build_model` with ``dtype`` and
    ``checkpointing``): what each process holds falls as N grows, so the smallest N that fits lies between the
    largest N tried that does not and the smallest that does. Returns ``world_size`` (None when even ``most``
    does not fit), its ``peak`` (bytes) and ``tried``: every (N, peak) planned, in order.
    """
    check_positive_int(card_bytes, "card_bytes")
    check_positive_int(most, "most")
    model = build_model(name, dtype, checkpointing)
    tried = []

    def peak(world_size: int) -> int:
        planned = memory.estimate_training_memory(model, **STEP, world_size=world_size, sharding=sharding,
                                                  mixed_precision=mixed_precision).peak
        tried.append((world_size, planned))
        return planned

    if peak(most) > card_bytes:
        return {"world_size": None, "peak": None, "tried": tried}
    fits, too_few = most, 1  # one process holds the whole state: sharding needs 2 or more
    while fits - too_few > 1:
        middle = (fits + too_few) // 2
        if peak(middle) <= card_bytes:
            fits = middle
        else:
            too_few = middle
    return {"world_size": fits, "peak": dict(tried)[fits], "tried": tried}


def count(model: torch.nn.Module) -> int:
    """Return the number of parameters of ``model`` (elements)."""
    return sum(p.numel() for p in model.parameters())


def plan_fields(plan) -> dict:
    """Return the fields of a :class:`~course_utils.memory.training_memory.TrainingMemory` the cache keeps, by name (bytes)."""
    return {name: getattr(plan, name) for name in _FIELDS}


def load_cached_plans(path: Path | str = CACHE) -> dict:
    """Return the cache the script wrote: its step, shapes, versions, and ``plans`` (a list of dicts, bytes).

    Refuses a file written for another step or other shapes than ``STEP`` and ``MODEL_SHAPES`` (rerun the script).
    """
    check_instance(path, "path", (str, Path), "a path (str or pathlib.Path)")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path: {path} is missing: run tools/lesson7_sharding_plans.py to write it")
    cached = json.loads(path.read_text())
    if cached.get("step") != STEP or cached.get("shapes") != MODEL_SHAPES:
        raise ValueError(f"{path} was written for another step or other models than STEP and MODEL_SHAPES: "
                         f"run tools/lesson7_sharding_plans.py again")
    return cached


def replan(name: str, world_size: int, sharding: str) -> dict:
    """Return the plan of one of the cache's points, made now (fields as the cache keeps them, bytes)."""
    plan = memory.estimate_training_memory(build_model(name), **STEP, world_size=world_size, sharding=sharding)
    return plan_fields(plan)


def rule_of_thumb(parameters: int, world_size: int) -> int:
    """Return "16 bytes x P / N": fp32 AdamW's weights, gradients and state divided by ``world_size``, in bytes."""
    check_non_negative_int(parameters, "parameters")
    check_positive_int(world_size, "world_size")
    return 16 * parameters // world_size


def rule_describes(plan: dict) -> bool:
    """Return True when "16 bytes x P / N" is at least half of the plan's peak (``plan`` as the cache keeps it).

    Below that, what the rule leaves out (activations, the unit gathered at the peak, the whole weights under
    ZeRO-2, the vocabulary's logits) is more than the rule itself: it no longer describes the peak.
    """
    _check_plans([plan], "plan", ("parameters", "world_size", "peak"))
    return 2 * rule_of_thumb(plan["parameters"], plan["world_size"]) >= plan["peak"]


def where_it_fits(plans: list[dict], model: str, cards: tuple[str, ...] = gpus.FIGURE_CARDS) -> list[dict]:
    """Return, per (processes, strategy) of ``model`` in ``plans``, its peak and the smallest of ``cards`` holding it.

    Each row: ``world_size``, ``sharding``, ``peak`` (bytes) and ``card`` (a name, or None when none holds it),
    in the order of ``plans``.
    """
    check_instance(plans, "plans", list, "a list of plans (dicts, as load_cached_plans gives them)")
    _check_plans(plans, "plans", ("model", "world_size", "sharding", "peak"))
    rows = [p for p in plans if p["model"] == model]
    if not rows:
        raise ValueError(f"model must be one of the plans' models {sorted({p['model'] for p in plans})}, got {model!r}")
    return [{"world_size": p["world_size"], "sharding": p["sharding"], "peak": p["peak"],
             "card": gpus.smallest_card_holding(p["peak"], cards)} for p in rows]


def _check_plans(plans: list, name: str, needed: tuple[str, ...]) -> None:
    """Each of ``plans`` is a dict with the fields ``needed``, as the cache keeps them."""
    for plan in plans:
        if not isinstance(plan, dict) or any(field not in plan for field in needed):
            raise ValueError(f"{name} must be plans as load_cached_plans gives them (dicts with {', '.join(needed)}), "
                             f"got {plan!r:.80}")
