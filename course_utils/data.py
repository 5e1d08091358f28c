"""The course's paraphrase dataset, its tokenizer and DataLoaders.

Introduced in lesson 1. The dataset stands in for GLUE MRPC and the tokenizer for
distilbert-base-cased's (both need internet); they live in ``data/`` and are
built by ``data/build_assets.py``. They are loaded with the real Hugging Face
APIs, so with internet one line changes each::

    dataset = load_dataset("glue", "mrpc")                      # load_paraphrase_dataset()
    tokenizer = AutoTokenizer.from_pretrained("distilbert-base-cased")  # load_tokenizer()
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, DataCollatorWithPadding, PreTrainedTokenizerBase

from course_utils import DATA_DIR
from course_utils.models import TINY_CHECKPOINT_DIR
from course_utils.validation import (
    check_choice, check_existing_directory, check_instance, check_int_in_range, check_positive_int,
)

PARAPHRASE_DIR = DATA_DIR / "paraphrase"
SPLITS = ("train", "validation", "test")
LABEL_NAMES = ("not_paraphrase", "paraphrase")
# Every pair of the course dataset fits in 64 tokens, [CLS] and [SEP]s included,
# so nothing is truncated; shorter batches are padded to their longest pair only.
DEFAULT_MAX_LENGTH = 64

# The same columns and types as GLUE MRPC, with this dataset's label names.
FEATURES = datasets.Features(
    {
        "sentence1": datasets.Value("string"),
        "sentence2": datasets.Value("string"),
        "label": datasets.ClassLabel(names=list(LABEL_NAMES)),
        "idx": datasets.Value("int32"),
    }
)


# torch.Generator.manual_seed takes a 64-bit seed; the course's seeds are never negative.
LARGEST_SEED = 2**64 - 1


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence the progress bars and info lines of ``datasets`` inside the block, then restore them."""
    verbosity = datasets.logging.get_verbosity()
    bars_were_enabled = datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars_were_enabled:
            datasets.enable_progress_bars()


def load_paraphrase_dataset(data_dir: str | Path = PARAPHRASE_DIR) -> datasets.DatasetDict:
    """Return the paraphrase dataset: a DatasetDict with the splits train, validation and test.

    Each row has ``sentence1``, ``sentence2``, ``label`` (1: paraphrase, 0: not)
    and ``idx``, as in GLUE MRPC. ``datasets`` caches the parsed CSVs in its own
    cache folder (``~/.cache/huggingface/datasets`` by default), never in the repository.
    """
    check_instance(data_dir, "data_dir", (str, Path), "a folder (str or pathlib.Path)")
    data_dir = Path(data_dir)
    data_files = {split: data_dir / f"{split}.csv" for split in SPLITS}
    missing = [str(path) for path in data_files.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"data_dir {str(data_dir)!r} lacks {', '.join(missing)}; build the course assets with `make data`"
        )
    with _quiet_datasets():
        return datasets.load_dataset(
            "csv", data_files={split: str(path) for split, path in data_files.items()}, features=FEATURES
        )


def load_tokenizer(path: str | Path = TINY_CHECKPOINT_DIR) -> PreTrainedTokenizerBase:
    """Return the tokenizer saved at ``path`` (the course's tiny-distilbert by default).

    With internet, ``path="distilbert-base-cased"`` loads the hub tokenizer instead.
    A ``Path``, or a string that names a folder (absolute, or starting with
    ``.`` or ``~``), must be an existing folder: otherwise transformers would
    take it for a hub name and answer with an unrelated error.
    """
    if isinstance(path, Path) or (isinstance(path, str) and (Path(path).is_absolute() or path.startswith((".", "~")))):
        path = check_existing_directory(path, "path")
    elif not isinstance(path, str):
        raise TypeError(f"path must be a folder (str or pathlib.Path) or a hub name, got {type(path).__name__}")
    return AutoTokenizer.from_pretrained(str(path))


def tokenize_dataset(
    dataset: datasets.DatasetDict | datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> datasets.DatasetDict | datasets.Dataset:
    """Return ``dataset`` tokenized for the model, in torch format.

    Each pair becomes ``input_ids`` and ``attention_mask`` (``[CLS] sentence1
    [SEP] sentence2 [SEP]``, truncated to ``max_length`` tokens, not padded: a
    collator pads each batch) and ``label`` is renamed ``labels``, the name the
    model's forward expects. The text columns and ``idx`` are dropped.
    """
    if not isinstance(dataset, (datasets.DatasetDict, datasets.Dataset)):
        raise TypeError(f"dataset must be a datasets.DatasetDict or Dataset, got {type(dataset).__name__}")
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    check_positive_int(max_length, "max_length")
    columns = dataset.column_names
    columns = next(iter(columns.values())) if isinstance(columns, dict) else columns
    missing = {"sentence1", "sentence2", "label"} - set(columns)
    if missing:
        raise ValueError(f"dataset must have the columns sentence1, sentence2 and label; {sorted(missing)} missing")

    def encode(batch: dict[str, list]) -> dict[str, list]:
        return tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=max_length)

    with _quiet_datasets():
        # keep_in_memory: a few thousand short rows; no cache files to write or reuse.
        tokenized = dataset.map(
            encode, batched=True, remove_columns=[c for c in columns if c != "label"], keep_in_memory=True
        )
    tokenized = tokenized.rename_column("label", "labels")
    tokenized.set_format("torch")
    return tokenized


@functools.lru_cache(maxsize=1)
def _course_tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer()


@functools.lru_cache(maxsize=4)
def _tokenized_course_dataset(max_length: int) -> datasets.DatasetDict:
    # Cached per max_length: a notebook that builds several loaders tokenizes once.
    # Rows come out as plain lists, which the collator turns into the same tensors:
    # formatting each row as tensors first made a batch of 32 cost 5.5 ms instead of
    # 1.4, about a tenth of a training step of the course model.
    return tokenize_dataset(load_paraphrase_dataset(), _course_tokenizer(), max_length).with_format(None)


def make_dataloader(
    split: str = "train",
    batch_size: int = 32,
    shuffle: bool | None = None,
    seed: int = 0,
    max_length: int = DEFAULT_MAX_LENGTH,
    limit: int | None = None,
) -> DataLoader:
    """Return a DataLoader over one split of the tokenized paraphrase dataset.

    Each batch is a dict of tensors ``input_ids`` and ``attention_mask``, shaped
    (batch, longest pair in the batch), and ``labels``, shaped (batch,). ``shuffle``
    defaults to True for "train" only; the order then depends on ``seed`` alone,
    so the same arguments give the same batches. ``limit`` keeps the first
    ``limit`` examples of the split (all of them if it has fewer).
    """
    check_choice(split, "split", SPLITS)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(max_length, "max_length")
    if limit is not None:
        check_positive_int(limit, "limit")
    check_int_in_range(seed, "seed", 0, LARGEST_SEED)
    if shuffle is not None and not isinstance(shuffle, bool):
        raise ValueError(f"shuffle must be True, False or None, got {shuffle!r}")
    tokenizer = _course_tokenizer()
    if max_length > tokenizer.model_max_length:
        raise ValueError(
            f"max_length must be at most {tokenizer.model_max_length}, the model's number of positions; got {max_length}"
        )

    dataset = _tokenized_course_dataset(max_length)[split]
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=split == "train" if shuffle is None else shuffle,
        collate_fn=DataCollatorWithPadding(tokenizer),
        generator=torch.Generator().manual_seed(seed),
    )


def make_dataloaders(
    batch_size: int = 32,
    seed: int = 0,
    max_length: int = DEFAULT_MAX_LENGTH,
    limit: int | None = None,
) -> tuple[DataLoader, DataLoader]:
    """Return ``(train_dataloader, validation_dataloader)``; see :func:`make_dataloader`.

    The train loader is shuffled with ``seed``; the validation loader is not.
    ``limit`` keeps the first ``limit`` training examples; validation stays whole
    (400 pairs), so accuracies stay comparable between runs.
    """
    train = make_dataloader("train", batch_size=batch_size, seed=seed, max_length=max_length, limit=limit)
    validation = make_dataloader("validation", batch_size=batch_size, seed=seed, max_length=max_length)
    return train, validation
