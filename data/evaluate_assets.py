"""Fine-tune the tiny checkpoint on the paraphrase dataset, and the same model from random weights.

    python -m data.evaluate_assets                 # lesson 1's settings, seeds 0, 1, 2
    python -m data.evaluate_assets --lr 2e-3 --seeds 0

Prints the validation accuracy after each epoch, for the pre-trained checkpoint
and for a randomly initialised model of the same shape trained the same way,
then the accuracy per kind of pair (how the generator made it). The figures in
data/README.md come from this script.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, get_linear_schedule_with_warmup
from transformers.utils import logging as transformers_logging

from course_utils import data
from course_utils.models import TINY_CHECKPOINT_DIR
from data import build_assets  # the kind of each validation pair (the repository's data/, run from its root)


def make_model(pretrained: bool) -> torch.nn.Module:
    """Return the tiny checkpoint, or a model of the same configuration with fresh random weights."""
    if pretrained:
        return AutoModelForSequenceClassification.from_pretrained(TINY_CHECKPOINT_DIR)
    return AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(TINY_CHECKPOINT_DIR))


def predictions(model: torch.nn.Module, dataloader: torch.utils.data.DataLoader) -> list[int]:
    """Return the predicted label of every example of ``dataloader``, in order."""
    model.eval()
    predicted = []
    with torch.no_grad():
        for batch in dataloader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            predicted += logits.argmax(dim=-1).tolist()
    model.train()
    return predicted


def fine_tune(pretrained: bool, seed: int, lr: float, epochs: int, batch_size: int) -> tuple[list[float], list[int], float]:
    """Train with Adam and a linear schedule (10% warm-up), as lesson 1 does.

    Returns the validation accuracy after each epoch (a fraction), the final
    predictions on the validation split, and the mean seconds per epoch.
    """
    torch.manual_seed(seed)
    model = make_model(pretrained)
    train, validation = data.make_dataloaders(batch_size=batch_size, seed=seed)
    labels = [int(label) for label in validation.dataset["labels"]]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    total_steps = epochs * len(train)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * total_steps), total_steps)
    accuracies, seconds = [], 0.0
    model.train()
    for _ in range(epochs):
        start = time.perf_counter()
        for batch in train:
            model(**batch).loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        seconds += time.perf_counter() - start
        predicted = predictions(model, validation)
        accuracies.append(sum(p == y for p, y in zip(predicted, labels)) / len(labels))
    return accuracies, predicted, seconds / epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier timings when other programs share the CPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    transformers_logging.disable_progress_bar()  # from_pretrained's "Loading weights" bar, once per run

    validation_rows = build_assets.build_pairs()["validation"]
    labels = [row[2] for row in validation_rows]
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    print(f"Adam lr {args.lr}, {args.epochs} epochs, batch {args.batch_size}, max_length {data.DEFAULT_MAX_LENGTH}, "
          f"{torch.get_num_threads()} threads; validation majority class {majority:.3f}")

    per_kind = {}
    for name, pretrained in (("pre-trained", True), ("random init", False)):
        runs = []
        for seed in seeds:
            accuracies, predicted, seconds = fine_tune(pretrained, seed, args.lr, args.epochs, args.batch_size)
            runs.append(accuracies)
            print(f"{name:12s} seed {seed}: accuracy per epoch {', '.join(f'{a:.3f}' for a in accuracies)}"
                  f"  ({seconds:.1f} s per epoch)")
        means = [statistics.mean(run[epoch] for run in runs) for epoch in range(args.epochs)]
        print(f"{name:12s} mean  : accuracy per epoch {', '.join(f'{a:.3f}' for a in means)}")
        counts = collections.defaultdict(lambda: [0, 0])
        for row, p in zip(validation_rows, predicted):  # the last seed's run
            counts[row[3]][0] += int(p == row[2])
            counts[row[3]][1] += 1
        per_kind[name] = counts

    print(f"accuracy per kind of validation pair (last seed; labels include the {build_assets.LABEL_NOISE_RATE:.0%} noise):")
    for kind in sorted(per_kind["pre-trained"], key=lambda k: -per_kind["pre-trained"][k][1]):
        cells = "  ".join(f"{name} {c}/{n} = {c / n:.2f}" for name, (c, n) in ((m, per_kind[m][kind]) for m in per_kind))
        print(f"  {kind:10s} {cells}")


if __name__ == "__main__":
    main()
