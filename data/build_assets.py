"""Build the course's offline data assets, byte for byte the same on every run.

    python -m data.build_assets           # rebuild everything under data/
    python -m data.build_assets --check   # rebuild into a temporary folder, compare with data/

The course runs without internet, so it ships small stand-ins for two hub assets
(see data/README.md):

- ``paraphrase/{train,validation,test}.csv`` for GLUE MRPC: sentence pairs
  labelled 1 (paraphrase) or 0, generated from templates (paraphrase_generator.py);
- ``tiny-distilbert/`` for ``distilbert-base-cased``: a WordPiece tokenizer
  trained on the course corpus and a small DistilBERT pre-trained with masked
  language modelling, saved as a sequence classifier.

``SHA256SUMS`` lists the sha256 of every generated file (``cd data && sha256sum -c SHA256SUMS``);
``pretraining.json`` records the MLM loss before and after pre-training, which
``--check`` reproduces (``make check-data``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import (
    DataCollatorForLanguageModeling,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForSequenceClassification,
    DistilBertTokenizerFast,
    get_linear_schedule_with_warmup,
)
from transformers.utils import logging as transformers_logging

from data import paraphrase_generator

DATA_DIR = Path(__file__).resolve().parent
SEED = 2024

# The dataset: about as many rows as GLUE MRPC's validation and test splits,
# and a train split small enough for an epoch of the tiny model in seconds.
SPLIT_SIZES = {"train": 3000, "validation": 400, "test": 400}
POSITIVE_RATE = 0.58  # MRPC has 68% paraphrases; anything from half to that works
LABEL_NOISE_RATE = 0.05
COLUMNS = ["sentence1", "sentence2", "label", "idx"]

# The tokenizer and model. The corpus has about a thousand distinct words, so the
# WordPiece vocabulary stops growing a little above that, below VOCAB_SIZE.
VOCAB_SIZE = 2000
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_LENGTH = 128
MODEL_SHAPE = {"dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 256}
ID2LABEL = {0: "not_paraphrase", 1: "paraphrase"}

# Pre-training: masked-language modelling on the train pairs plus unlabelled
# sentences, about half a minute on one CPU thread.
EXTRA_SENTENCES = 15_000
PRETRAIN_STEPS = 500
PRETRAIN_BATCH_SIZE = 64
PRETRAIN_LR = 2e-3
MASK_PROBABILITY = 0.15

# What a rebuild is compared with. Every file must be byte-identical except the
# weights and the recorded MLM losses, whose last digits depend on the CPU's
# floating-point kernels. Both tolerances are measured (data/README.md, "Rebuilding"):
# CPUs moved the weights by up to 0.0022 and the losses by less than 1e-6; one
# pre-training step fewer moves the weights by 0.2 and the final loss by 0.0055.
WEIGHTS_FILE = "tiny-distilbert/model.safetensors"
PRETRAINING_RECORD = "pretraining.json"
WEIGHT_TOLERANCE = 0.01
LOSS_TOLERANCE = 0.001


def build_pairs() -> dict[str, list[tuple[str, str, int, str]]]:
    """Return the rows of each split as ``(sentence1, sentence2, label, kind)``.

    Pairs are drawn once and then cut into splits, so no pair (in either order)
    appears in two splits. ``kind`` (how the pair was made) is not written to the CSVs.
    """
    rng = random.Random(SEED)
    pairs = paraphrase_generator.generate_pairs(rng, sum(SPLIT_SIZES.values()), POSITIVE_RATE, LABEL_NOISE_RATE)
    splits, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        splits[split] = pairs[start : start + size]
        start += size
    return splits


def write_split(rows: list[tuple[str, str, int, str]], path: Path) -> None:
    """Write ``rows`` as a CSV with MRPC's columns; ``idx`` counts rows from 0 as in GLUE."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # newline="" and an explicit "\n" terminator: the same bytes on every OS.
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        for idx, (sentence1, sentence2, label, _kind) in enumerate(rows):
            writer.writerow([sentence1, sentence2, label, idx])


def unlabelled_sentences(splits: dict[str, list]) -> list[str]:
    """Return extra generated sentences for pre-training, none of them in validation or test."""
    held_out = {sentence for split in ("validation", "test") for row in splits[split] for sentence in row[:2]}
    return paraphrase_generator.generate_sentences(random.Random(SEED + 1), EXTRA_SENTENCES, exclude=held_out)


def train_tokenizer(texts: list[str]) -> DistilBertTokenizerFast:
    """Return a cased WordPiece tokenizer trained on ``texts``, wrapped for transformers."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # The same normalisation and pre-tokenisation as BERT's cased tokenizers.
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The trainer numbers the "##x" pieces in hash-map order, which changes from run
    # to run and with it the merges chosen on ties (huggingface/tokenizers#1794).
    # Registering those pieces up front, in sorted order, makes training reproducible.
    # They are "special" only during training: the vocabulary is all we keep.
    words = {word for text in texts for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)}
    pieces = sorted({f"##{char}" for word in words for char in word[1:]})
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS + pieces, min_frequency=2, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    # DistilBertTokenizerFast rebuilds the WordPiece pipeline from the vocabulary
    # and adds the [CLS] a [SEP] b [SEP] template, exactly as distilbert-base-cased does.
    return DistilBertTokenizerFast(vocab=tokenizer.get_vocab(), do_lower_case=False, model_max_length=MAX_LENGTH)


def model_config(vocab_size: int) -> DistilBertConfig:
    """Return the tiny DistilBERT's configuration, with the two paraphrase labels."""
    return DistilBertConfig(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_LENGTH,
        id2label=ID2LABEL,
        label2id={label: i for i, label in ID2LABEL.items()},
        **MODEL_SHAPE,
    )


def pretrain(
    tokenizer: DistilBertTokenizerFast, splits: dict[str, list], extra: list[str]
) -> tuple[DistilBertForMaskedLM, dict[str, float]]:
    """Return a DistilBERT pre-trained with masked-language modelling, and its MLM loss before and after.

    The losses (``{"mlm_loss_before": ..., "mlm_loss_after": ...}``, mean cross-entropy
    in nats per masked token) are also printed.

    The corpus is the train pairs (encoded as pairs, as fine-tuning sees them) and
    the unlabelled sentences. The loss is measured on validation pairs, which the
    model never trains on.
    """
    torch.manual_seed(SEED)
    model = DistilBertForMaskedLM(model_config(len(tokenizer)))
    corpus = [tokenizer(s1, s2)["input_ids"] for s1, s2, _, _ in splits["train"]]
    corpus += [tokenizer(sentence)["input_ids"] for sentence in extra]
    held_out = [tokenizer(s1, s2)["input_ids"] for s1, s2, _, _ in splits["validation"]]

    def held_out_loss() -> float:
        # A fresh collator with a fixed seed masks the same tokens at every call.
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY, seed=SEED)
        batch = collator([{"input_ids": ids} for ids in held_out])
        model.eval()
        with torch.no_grad():
            loss = model(**batch).loss.item()
        model.train()
        return loss

    loss_before = held_out_loss()
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY, seed=SEED)
    loader = torch.utils.data.DataLoader(
        [{"input_ids": ids} for ids in corpus],
        batch_size=PRETRAIN_BATCH_SIZE,
        shuffle=True,
        collate_fn=collator,
        generator=torch.Generator().manual_seed(SEED),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, PRETRAIN_STEPS // 10, PRETRAIN_STEPS)
    batches = (batch for _ in range(math.ceil(PRETRAIN_STEPS / len(loader))) for batch in loader)
    model.train()
    # disable=None: a live bar in a terminal, nothing in logs and test captures.
    with tqdm(total=PRETRAIN_STEPS, desc="      pre-training", unit="step", leave=False, disable=None) as bar:
        for _, batch in zip(range(PRETRAIN_STEPS), batches):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            bar.set_postfix(loss=f"{loss.item():.2f}", refresh=False)
            bar.update()
    losses = {"mlm_loss_before": loss_before, "mlm_loss_after": held_out_loss()}
    print(f"      MLM loss on validation pairs: {losses['mlm_loss_before']:.2f} before, {losses['mlm_loss_after']:.2f} after")
    return model, losses


def save_classifier(mlm: DistilBertForMaskedLM, tokenizer: DistilBertTokenizerFast, out_dir: Path) -> int:
    """Save the pre-trained body with a classification head and the tokenizer; return the parameter count.

    The head is initialised here, with a fixed seed, and saved with the body, so
    ``from_pretrained`` finds every weight and has nothing to initialise (or warn about).
    """
    torch.manual_seed(SEED)
    classifier = DistilBertForSequenceClassification(mlm.config)
    classifier.distilbert.load_state_dict(mlm.distilbert.state_dict())
    classifier.config.architectures = ["DistilBertForSequenceClassification"]
    # save_pretrained draws a bar for writing its single shard: noise in a build log.
    transformers_logging.disable_progress_bar()
    classifier.save_pretrained(out_dir, safe_serialization=True)
    transformers_logging.enable_progress_bar()
    tokenizer.save_pretrained(out_dir)
    return sum(p.numel() for p in classifier.parameters())


def build(out_dir: Path) -> list[Path]:
    """Build every asset under ``out_dir``; return the written files, relative to it, sorted."""
    start = time.perf_counter()
    splits = build_pairs()
    for split, rows in splits.items():
        write_split(rows, out_dir / "paraphrase" / f"{split}.csv")
        share = sum(row[2] for row in rows) / len(rows)
        print(f"[1/3] paraphrase/{split}.csv: {len(rows)} pairs, {share:.1%} paraphrases")

    extra = unlabelled_sentences(splits)
    train_sentences = [sentence for row in splits["train"] for sentence in row[:2]]
    tokenizer = train_tokenizer(train_sentences + extra)
    print(f"[2/3] tokenizer: WordPiece, {len(tokenizer)} tokens, from the train split and {len(extra)} extra sentences")

    # One thread and deterministic kernels: the weights come out bit for bit the same.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"[3/3] tiny DistilBERT: {PRETRAIN_STEPS} steps of masked-language modelling")
    mlm, losses = pretrain(tokenizer, splits, extra)
    # Not in SHA256SUMS: the losses' last digits depend on the CPU, like the weights.
    (out_dir / PRETRAINING_RECORD).write_text(json.dumps(losses, indent=2) + "\n", encoding="utf-8")
    checkpoint_dir = out_dir / "tiny-distilbert"
    n_parameters = save_classifier(mlm, tokenizer, checkpoint_dir)
    print(f"      saved tiny-distilbert/: {n_parameters:,} parameters")

    files = sorted(
        path.relative_to(out_dir)
        for folder in (out_dir / "paraphrase", checkpoint_dir)
        for path in folder.iterdir()
        if path.is_file()
    )
    write_checksums(out_dir, files)
    print(f"done in {time.perf_counter() - start:.0f} s; checksums in SHA256SUMS")
    return files


def sha256(path: Path) -> str:
    """Return the hex sha256 digest of the file at ``path``."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksums(out_dir: Path, files: list[Path]) -> None:
    """Write ``out_dir/SHA256SUMS`` in ``sha256sum``'s format, paths relative to ``out_dir``."""
    lines = [f"{sha256(out_dir / path)}  {path.as_posix()}\n" for path in files]
    (out_dir / "SHA256SUMS").write_text("".join(lines), encoding="utf-8")


def max_weight_difference(path_a: Path, path_b: Path) -> float:
    """Return the largest absolute difference between same-named tensors of two safetensors files.

    ``math.inf`` when the files hold different tensor names, shapes or dtypes.
    """
    a, b = load_file(path_a), load_file(path_b)
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape or a[k].dtype != b[k].dtype for k in a):
        return math.inf
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def read_losses(folder: Path) -> dict[str, float]:
    """Return the MLM losses a build recorded in ``folder/pretraining.json``."""
    return json.loads((folder / PRETRAINING_RECORD).read_text(encoding="utf-8"))


def _listed(folder: Path) -> dict[str, str]:
    """Return {relative path: sha256} from ``folder/SHA256SUMS``."""
    lines = (folder / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines)}


def compare(built_dir: Path, committed_dir: Path) -> tuple[list[str], list[str]]:
    """Compare a fresh build with the committed assets; return (problems, measurements).

    Every file is compared byte for byte, except the weights, which must agree within
    WEIGHT_TOLERANCE, and the recorded MLM losses, within LOSS_TOLERANCE: floating-point
    kernels round differently from one kind of CPU to the next (data/README.md).
    ``measurements`` says how far the weights and losses are from the committed ones.
    """
    built, committed = _listed(built_dir), _listed(committed_dir)
    problems, measurements = [], []
    for name in sorted(built.keys() - committed.keys()):
        problems.append(f"{name}: built but not listed in {committed_dir / 'SHA256SUMS'}")
    for name in sorted(committed.keys() - built.keys()):
        problems.append(f"{name}: listed in SHA256SUMS but no longer built")
    for name in sorted(built.keys() & committed.keys()):
        path = committed_dir / name
        if not path.is_file():
            problems.append(f"{name}: missing from {committed_dir}")
        elif name == WEIGHTS_FILE:
            difference = max_weight_difference(built_dir / name, path)
            measurements.append(f"weights differ by up to {difference:.2g} (tolerance {WEIGHT_TOLERANCE:g})")
            if not difference <= WEIGHT_TOLERANCE:
                problems.append(
                    f"{name}: weights differ from the rebuilt ones by up to {difference:.2g}, "
                    f"more than the {WEIGHT_TOLERANCE:g} that CPU rounding explains"
                )
        elif sha256(path) != built[name] or committed[name] != built[name]:
            problems.append(f"{name}: differs from the rebuilt file (sha256 {built[name][:12]}...)")
    if not (committed_dir / PRETRAINING_RECORD).is_file():
        problems.append(f"{PRETRAINING_RECORD}: missing from {committed_dir}")
    else:
        rebuilt_losses, committed_losses = read_losses(built_dir), read_losses(committed_dir)
        for key in sorted(rebuilt_losses):
            if key not in committed_losses:
                problems.append(f"{PRETRAINING_RECORD}: no {key}")
                continue
            gap = abs(rebuilt_losses[key] - committed_losses[key])
            measurements.append(
                f"{key} {rebuilt_losses[key]:.4f}, committed {committed_losses[key]:.4f} "
                f"(difference {gap:.2g}, tolerance {LOSS_TOLERANCE:g})"
            )
            if not gap <= LOSS_TOLERANCE:
                problems.append(
                    f"{PRETRAINING_RECORD}: the rebuild's {key} is {rebuilt_losses[key]:.4f}, "
                    f"the committed one {committed_losses[key]:.4f}"
                )
    return problems, measurements


def differences(built_dir: Path, committed_dir: Path) -> list[str]:
    """Return one line per asset that differs between a fresh build and the committed one."""
    return compare(built_dir, committed_dir)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="rebuild into a temporary folder and compare with the committed files"
    )
    args = parser.parse_args(argv)
    if not args.check:
        build(DATA_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        if not (DATA_DIR / "SHA256SUMS").is_file():
            print(f"check failed: {DATA_DIR / 'SHA256SUMS'} is missing; run `python -m data.build_assets`")
            return 1
        problems, measurements = compare(Path(tmp), DATA_DIR)
    print("\n".join(f"      {line}" for line in measurements))
    if problems:
        print("check failed: the committed assets are not what build_assets.py builds:")
        print("\n".join(f"  {problem}" for problem in problems))
        print(
            "Rebuild with `python -m data.build_assets` and commit, or find what made the build differ."
        )
        return 1
    print(
        "check passed: the data and tokenizer are byte-identical to the committed ones, "
        "the weights and MLM losses within the tolerances of data/README.md"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
