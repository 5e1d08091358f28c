"""Specification of course_utils.data: the paraphrase dataset, its tokenization and DataLoaders."""

from pathlib import Path

import datasets
import pytest
import torch

from course_utils import REPO_DIR, data

EXPECTED_SIZES = {"train": 3000, "validation": 400, "test": 400}


@pytest.fixture(scope="module")
def dataset():
    return data.load_paraphrase_dataset()


@pytest.fixture(scope="module")
def tokenizer():
    return data.load_tokenizer()


def unordered_pairs(split):
    return {frozenset((row["sentence1"], row["sentence2"])) for row in split}


# --- the dataset -----------------------------------------------------------


def test_dataset_has_the_columns_and_splits_of_glue_mrpc(dataset):
    assert tuple(dataset) == data.SPLITS
    for split in data.SPLITS:
        assert dataset[split].column_names == ["sentence1", "sentence2", "label", "idx"]
        assert dataset[split].num_rows == EXPECTED_SIZES[split]
        assert list(dataset[split]["idx"]) == list(range(EXPECTED_SIZES[split]))


def test_labels_are_named_classes_one_meaning_paraphrase(dataset):
    label = dataset["train"].features["label"]
    assert isinstance(label, datasets.ClassLabel)
    assert label.names == ["not_paraphrase", "paraphrase"]
    assert set(dataset["train"]["label"]) == {0, 1}


@pytest.mark.parametrize("split", data.SPLITS)
def test_every_split_is_between_half_and_two_thirds_paraphrases(dataset, split):
    share = sum(dataset[split]["label"]) / dataset[split].num_rows
    assert 0.5 <= share <= 0.68


def test_no_sentence_pair_is_shared_between_train_and_validation_or_test(dataset):
    train = unordered_pairs(dataset["train"])
    assert not train & unordered_pairs(dataset["validation"])
    assert not train & unordered_pairs(dataset["test"])
    assert not unordered_pairs(dataset["validation"]) & unordered_pairs(dataset["test"])


def test_the_two_sentences_of_a_pair_always_differ(dataset):
    for split in data.SPLITS:
        assert all(row["sentence1"] != row["sentence2"] for row in dataset[split])


def test_loading_prints_nothing_and_caches_outside_the_repository(tmp_path, monkeypatch, capfd):
    # A cache folder of its own, so the CSVs are parsed afresh, the step that draws progress bars.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    dataset = data.load_paraphrase_dataset()
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    for split in data.SPLITS:
        for cache_file in dataset[split].cache_files:
            assert REPO_DIR not in Path(cache_file["filename"]).resolve().parents


def test_a_folder_without_the_csvs_is_refused_with_a_hint(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        data.load_paraphrase_dataset(tmp_path)


# --- tokenization ----------------------------------------------------------


def test_tokenized_pairs_are_model_inputs_in_torch_format(dataset, tokenizer):
    tokenized = data.tokenize_dataset(dataset, tokenizer)
    for split in data.SPLITS:
        assert set(tokenized[split].column_names) == {"input_ids", "attention_mask", "labels"}
    example = tokenized["validation"][0]
    assert all(isinstance(example[name], torch.Tensor) for name in ("input_ids", "attention_mask", "labels"))
    ids = example["input_ids"].tolist()
    assert ids[0] == tokenizer.cls_token_id and ids.count(tokenizer.sep_token_id) == 2
    assert example["labels"].item() == dataset["validation"][0]["label"]


def test_no_pair_is_cut_at_the_default_max_length(dataset, tokenizer):
    for split in data.SPLITS:
        encoded = tokenizer(list(dataset[split]["sentence1"]), list(dataset[split]["sentence2"]))
        assert max(len(ids) for ids in encoded["input_ids"]) <= data.DEFAULT_MAX_LENGTH


def test_a_shorter_max_length_truncates_every_pair_to_it(dataset, tokenizer):
    tokenized = data.tokenize_dataset(dataset["validation"], tokenizer, max_length=16)
    assert max(len(ids) for ids in tokenized["input_ids"]) == 16


def test_tokenize_dataset_names_a_missing_column(dataset, tokenizer):
    with pytest.raises(ValueError, match="sentence2"):
        data.tokenize_dataset(dataset["validation"].remove_columns("sentence2"), tokenizer)


# --- DataLoaders -----------------------------------------------------------


def test_batches_hold_input_ids_attention_mask_and_labels_tensors():
    batch = next(iter(data.make_dataloader("validation", batch_size=8)))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].shape[0] == 8 and batch["labels"].shape == (8,)


def test_each_batch_is_padded_to_its_own_longest_pair():
    widths = set()
    for batch in data.make_dataloader("validation", batch_size=16):
        lengths = batch["attention_mask"].sum(dim=1)
        assert batch["input_ids"].shape[1] == lengths.max().item()
        padding = batch["attention_mask"] == 0
        assert (batch["input_ids"][padding] == 0).all()  # [PAD] has id 0
        widths.add(batch["input_ids"].shape[1])
    assert len(widths) > 1, "with per-batch padding, batches differ in width"


def test_the_same_seed_gives_the_same_training_batches():
    first = [batch["input_ids"] for batch in data.make_dataloader("train", batch_size=32, seed=7, limit=256)]
    again = [batch["input_ids"] for batch in data.make_dataloader("train", batch_size=32, seed=7, limit=256)]
    other = [batch["input_ids"] for batch in data.make_dataloader("train", batch_size=32, seed=8, limit=256)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, other))


def test_batches_equal_those_collated_from_the_tokenized_dataset(dataset, tokenizer):
    # The loaders read plain rows (faster); the batches must be those of the torch-formatted dataset.
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    tokenized = data.tokenize_dataset(dataset, tokenizer)
    for split, seed in [("train", 3), ("validation", 0)]:
        expected = DataLoader(tokenized[split], batch_size=32, shuffle=split == "train",
                              collate_fn=DataCollatorWithPadding(tokenizer), generator=torch.Generator().manual_seed(seed))
        batches = list(data.make_dataloader(split, batch_size=32, seed=seed))
        assert len(batches) == len(expected)
        for batch, want in zip(batches, expected):
            assert list(batch) == list(want)
            assert all(batch[k].dtype == want[k].dtype and torch.equal(batch[k], want[k]) for k in want)


def test_only_the_train_split_is_shuffled_by_default(dataset):
    validation_labels = torch.cat([b["labels"] for b in data.make_dataloader("validation", batch_size=100)])
    assert validation_labels.tolist() == list(dataset["validation"]["label"])
    train_labels = torch.cat([b["labels"] for b in data.make_dataloader("train", batch_size=100)])
    assert train_labels.tolist() != list(dataset["train"]["label"])


def test_limit_keeps_the_first_examples_of_the_split(dataset):
    loader = data.make_dataloader("validation", batch_size=4, limit=10)
    assert len(loader.dataset) == 10
    labels = torch.cat([batch["labels"] for batch in loader]).tolist()
    assert labels == list(dataset["validation"]["label"][:10])


def test_make_dataloaders_limits_the_training_split_only():
    train, validation = data.make_dataloaders(batch_size=16, limit=64)
    assert len(train.dataset) == 64 and len(train) == 4
    assert len(validation.dataset) == EXPECTED_SIZES["validation"]


def test_building_loaders_prints_nothing(capfd):
    data.make_dataloaders(batch_size=8, max_length=48)  # a max_length of its own: tokenized afresh
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize("batch_size", [0, -4, 2.5, True, "32"])
def test_a_bad_batch_size_is_refused_by_name(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        data.make_dataloader("train", batch_size=batch_size)


def test_an_unknown_split_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="'train', 'validation', 'test'.*'dev'"):
        data.make_dataloader("dev")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_length": 0}, "max_length must be a positive int"),
        ({"max_length": 512}, "max_length must be at most 128"),
        ({"limit": 0}, "limit must be a positive int"),
        ({"limit": 1.5}, "limit must be a positive int"),
        ({"seed": -1}, "seed must be an int from 0 to 18446744073709551615"),
        ({"seed": 2**70}, "seed must be an int from 0 to 18446744073709551615"),
        ({"seed": 1.0}, "seed must be an int"),
        ({"shuffle": "yes"}, "shuffle must be True, False or None"),
    ],
)
def test_other_bad_arguments_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        data.make_dataloader("train", **arguments)


def test_the_largest_seed_is_accepted():
    assert len(data.make_dataloader("train", batch_size=32, seed=data.LARGEST_SEED, limit=64)) == 2


@pytest.mark.parametrize("path", ["/nonexistent", "./no-such-folder", Path("/nonexistent")])
def test_a_missing_tokenizer_folder_is_named_as_missing(path):
    with pytest.raises(FileNotFoundError, match=r"path: no directory '.*(nonexistent|no-such-folder)'"):
        data.load_tokenizer(path)


def test_the_tokenizer_path_must_be_a_path_or_a_name():
    with pytest.raises(TypeError, match="path must be a folder"):
        data.load_tokenizer(42)


def test_make_dataloaders_checks_its_arguments_too():
    with pytest.raises(ValueError, match="batch_size"):
        data.make_dataloaders(batch_size=0)
