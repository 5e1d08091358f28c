"""The three ways lesson 5 fine-tunes the course model, one definition for the lesson and its cached seed runs.

- full fine-tuning: every parameter trains;
- frozen encoder: only the classification head trains;
- LoRA: the pre-trained weights stay frozen, low-rank adapters (and the head) train.

``VARIANTS`` gives each its learning rate (and LoRA its rank, scaling and target
layers); :func:`make_variant` applies one to a freshly loaded classifier.
``tools/lesson5_seed_runs.py`` trains each over several seeds with these.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from course_utils.validation import check_choice, check_instance

# Written by tools/lesson5_seed_runs.py: every variant trained over several seeds (minutes), read by lesson 5.
SEED_RUNS_FILE = Path(__file__).resolve().parents[1] / "lessons" / "cached" / "05_seed_runs.json"

# LoRA on a model this small (width 64) learns reliably only with its word embeddings adapted too, and the
# whole head trained: with adapters on the linear layers alone (r=8 at lr 3e-3, r=16 at 1e-3, 3e-3 or 1e-2,
# r=32 at 3e-3) seed 1 stayed at the majority class, its loss at ln 2 for two epochs (issue 23).
VARIANTS: dict[str, dict[str, object]] = {
    "full fine-tuning": {"lr": 1e-3},
    "frozen encoder": {"lr": 1e-3},
    "LoRA (r=16)": {"lr": 3e-3, "r": 16, "lora_alpha": 32,
                    "target_modules": ["q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2", "word_embeddings"],
                    "modules_to_save": ["pre_classifier", "classifier"]},
}


def make_variant(name: str, model: torch.nn.Module) -> torch.nn.Module:
    """Return ``model`` (a DistilBERT classifier) set up as variant ``name`` of ``VARIANTS``.

    The frozen encoder is the same model with ``requires_grad`` off outside the head;
    LoRA returns PEFT's wrapper around it.
    """
    check_choice(name, "name", VARIANTS)
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    settings = VARIANTS[name]
    if name == "frozen encoder":
        for parameter in model.distilbert.parameters():
            parameter.requires_grad_(False)
        return model
    if "r" in settings:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(task_type="SEQ_CLS", r=settings["r"], lora_alpha=settings["lora_alpha"],
                            target_modules=list(settings["target_modules"]),
                            modules_to_save=list(settings["modules_to_save"]))
        return get_peft_model(model, config)
    return model


def load_seed_runs() -> dict[str, object]:
    """Return the cached seed runs: ``{"runs": [{"variant", "seed", "accuracy", "f1", "final_loss"}, ...], ...}``.

    Refuses a file written for other variant settings than ``VARIANTS`` (rerun the script).
    """
    if not SEED_RUNS_FILE.exists():
        raise FileNotFoundError(f"{SEED_RUNS_FILE} is missing: run tools/lesson5_seed_runs.py to write it")
    runs = json.loads(SEED_RUNS_FILE.read_text())
    if runs.get("variants") != VARIANTS:
        raise ValueError(f"{SEED_RUNS_FILE} was written for other variant settings: rerun tools/lesson5_seed_runs.py")
    return runs
