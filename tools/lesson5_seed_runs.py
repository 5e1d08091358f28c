"""Train lesson 5's three variants (full fine-tuning, frozen encoder, LoRA) over several seeds; write their scores.

Lesson 5 reads the file this writes (``lessons/cached/05_seed_runs.json``) to show
the spread over seeds, and retrains seed 0 live to show the cache matches. Each
run is exactly the lesson's: the same model, data, optimizer, schedule and
epochs, with ``set_seed(seed)`` and the data shuffled with ``seed``. About half a
minute a run on a quiet laptop CPU (15 runs):

    .venv/bin/python -m tools.lesson5_seed_runs
"""

from __future__ import annotations

import argparse
import json
import platform
import warnings
from pathlib import Path

import torch
import transformers
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from course_utils import accelerate_state, data, loops, models, optimizers, schedules
from course_utils.fine_tuning_variants import VARIANTS, make_variant
from course_utils.threads import use_course_threads

OUTPUT = Path(__file__).resolve().parents[1] / "lessons" / "cached" / "05_seed_runs.json"
SEEDS = (0, 1, 2, 3, 4)
NUM_EPOCHS = 2
BATCH_SIZE = 32


def train_variant(name: str, seed: int) -> dict[str, float]:
    """Train variant ``name`` from ``seed`` as lesson 5 does; return its validation scores and training losses."""
    set_seed(seed)
    model = make_variant(name, models.load_pretrained_classifier())
    train_dataloader, eval_dataloader = data.make_dataloaders(batch_size=BATCH_SIZE, seed=seed)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = optimizers.make_optimizer("adamw", trainable, lr=VARIANTS[name]["lr"])
    lr_scheduler = schedules.linear_schedule_with_warmup(optimizer, NUM_EPOCHS * len(train_dataloader))
    losses = loops.train_accelerate(model, optimizer, lr_scheduler, train_dataloader, NUM_EPOCHS, accelerate_state.fresh_accelerator())
    return {**loops.evaluate(model, eval_dataloader), "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    arguments = parser.parse_args()
    use_course_threads()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    runs = []
    with tqdm(total=len(arguments.seeds) * len(VARIANTS), desc="training") as progress:
        for seed in arguments.seeds:
            for name in VARIANTS:
                scores = train_variant(name, seed)
                runs.append({"variant": name, "seed": seed, "accuracy": scores["accuracy"], "f1": scores["f1"],
                             "final_loss": scores["losses"][-1]})
                progress.update()
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "written_by": "tools/lesson5_seed_runs.py", "variants": VARIANTS, "epochs": NUM_EPOCHS,
        "batch_size": BATCH_SIZE, "torch": torch.__version__, "machine": platform.machine(), "runs": runs,
    }, indent=1) + "\n")
    print(f"wrote {len(runs)} runs to {OUTPUT}")


if __name__ == "__main__":
    main()
