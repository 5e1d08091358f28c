"""Plan one process's training step for Llama-shaped models from 1B to 405B on 1 to 512 processes; write the plans.

Lesson 7's figure (memory per GPU against parameter count) needs more plans than
its 90 s allow live: each per-process plan follows copies of the model with 1, 2
and 3 blocks on a fake process group (several seconds each). This script makes
them all with the lesson's call, ``memory.estimate_training_memory``, and writes
``lessons/cached/07_sharding_plans.json``; the lesson reads that file and re-plans
one point live to show the cache matches. Deterministic (fake tensors: no data,
no randomness). Several minutes on a quiet laptop CPU:

    .venv/bin/python -m tools.lesson7_sharding_plans
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from course_utils import gpus, memory, sharding_plans
from course_utils.threads import use_course_threads

OUTPUT = Path(__file__).resolve().parents[1] / "lessons" / "cached" / "07_sharding_plans.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(sharding_plans.MODEL_SHAPES))
    parser.add_argument("--searches-only", action="store_true",
                        help="keep the figure's plans from the file (written for the same step, shapes and torch) "
                             "and redo only the searches for the fewest GPUs")
    arguments = parser.parse_args()
    use_course_threads()
    points = [(name, n, s) for name in arguments.models for n, s in sharding_plans.SETUPS]
    plans = []
    if arguments.searches_only:
        kept = sharding_plans.load_cached_plans(OUTPUT)
        if kept["torch"] != torch.__version__:
            parser.error(f"the file's plans were made on torch {kept['torch']}, this is {torch.__version__}: "
                         "plan everything again (without --searches-only)")
        plans, points = kept["plans"], []
    with tqdm(total=len(points), desc="planning") as progress:
        for name, world_size, strategy in points:
            model = sharding_plans.build_model(name)
            start = time.process_time()
            plan = memory.estimate_training_memory(model, **sharding_plans.STEP, world_size=world_size,
                                                   sharding=strategy)
            plans.append({"model": name, "parameters": sharding_plans.count(model), "world_size": world_size,
                          "sharding": strategy, "cpu_seconds": round(time.process_time() - start, 1),
                          **sharding_plans.plan_fields(plan)})
            progress.update()
    # The fewest GPUs that hold 70B under ZeRO-3, searched (a bisection over N), not read off the figure's grid.
    card = max(gpus.figure_cards().items(), key=lambda item: item[1])
    fewest = {}
    for label, variant in tqdm(sharding_plans.SEARCHES.items(), desc="searching the fewest GPUs"):
        fewest[label] = sharding_plans.fewest_processes(sharding_plans.SEVENTY_B, card[1], **variant)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "written_by": "tools/lesson7_sharding_plans.py", "step": sharding_plans.STEP,
        "shapes": sharding_plans.MODEL_SHAPES, "torch": torch.__version__, "machine": platform.machine(),
        "plans": plans, "fewest": {"model": sharding_plans.SEVENTY_B, "card": card[0], "searches": fewest},
    }, indent=1) + "\n")
    print(f"wrote {len(plans)} plans to {OUTPUT}")


if __name__ == "__main__":
    main()
