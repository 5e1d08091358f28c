"""Benchmark: memory estimates against measurements, on the grids of the memory tests (lessons 2 and 3).

Part 1, optimizer state: for each optimizer, the largest difference in bytes
between ``estimate_optimizer_state`` and the state of the real optimizer after
one step, over every architecture, dtype and option set of tests/test_memory.py
(expected: 0 B).

Part 2, one training step: for each configuration of tests/test_training_memory.py,
the peak measured by torch's MemTracker, the estimate, its error, and, for the
AdamW configurations, the error of the 16-bytes-per-parameter rule of thumb (a
rule for Adam: set against an SGD step it would count state SGD does not keep).

Run: ``.venv/bin/python benchmarks/bench_memory.py``.
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
sys.path.insert(0, str(REPO / "tests"))  # the grids live with the tests that specify them

MiB = 2**20


def optimizer_state_differences() -> dict[str, int]:
    """Return, per optimizer name, the largest |estimate - measured| in bytes over the test grid.

    Runs in a fresh interpreter: once bitsandbytes is imported, accelerate's
    notebook_launcher refuses to start, and other benchmarks may run after this one.
    """
    result = subprocess.run(
        [sys.executable, __file__, "--optimizer-state-json"], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _optimizer_state_differences_here() -> dict[str, int]:
    import torch
    from test_memory import ARCHITECTURES, OPTIMIZER_SETTINGS, _one_real_step

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
    from test_training_memory import GRID, estimate_and_measure

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


def main() -> dict:
    """Print both parts; return the figures: per-optimizer differences, per-configuration rows, worst errors (%)."""
    start = time.perf_counter()
    differences = optimizer_state_differences()
    print("optimizer state after one step, estimate vs measured, largest |difference| over the test grid:")
    for name, difference in differences.items():
        print(f"  {name:16s} {difference:>6d} B")

    rows = training_step_rows()
    print("\none training step (fp32, CPU), peak measured by MemTracker vs estimate:")
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
    print(f"  ({time.perf_counter() - start:.0f} s)")
    return {
        "optimizer_state_max_abs_difference_bytes": differences,
        "training_step": rows,
        "worst_estimate_error_pct": worst["error_pct"],
        "worst_rule_of_thumb_error_pct": worst_rule["rule_of_thumb_error_pct"],
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--optimizer-state-json"]:
        print(json.dumps(_optimizer_state_differences_here()))
    else:
        main()
