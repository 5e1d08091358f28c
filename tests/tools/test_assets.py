"""Specification of the committed offline assets in data/ and of the script that builds them."""

import hashlib
import importlib
import json
import logging
import random
import shutil
import subprocess
import warnings

import pytest
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertForSequenceClassification

from course_utils import DATA_DIR, REPO_DIR
from course_utils.models import TINY_CHECKPOINT_DIR, no_loading_bar

SUMS_FILE = DATA_DIR / "SHA256SUMS"


def listed_checksums():
    """Return {relative path: sha256} as listed in data/SHA256SUMS."""
    entries = {}
    for line in SUMS_FILE.read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        entries[name] = digest
    return entries


@pytest.fixture(scope="module")
def build_assets():
    """The build script, data.build_assets (it lives in data/, next to its generator)."""
    return importlib.import_module("data.build_assets")


@pytest.fixture
def quiet_transformers_bars():
    # from_pretrained draws a "Loading weights" bar: progress, not a warning; switched off to read the rest.
    with no_loading_bar():
        yield


def test_every_committed_asset_matches_its_listed_sha256():
    for name, digest in listed_checksums().items():
        assert hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest() == digest, name


def test_sha256sums_lists_every_generated_file():
    on_disk = {
        path.relative_to(DATA_DIR).as_posix()
        for folder in (DATA_DIR / "paraphrase", TINY_CHECKPOINT_DIR)
        for path in folder.iterdir()
        if path.is_file()
    }
    assert set(listed_checksums()) == on_disk
    assert {"paraphrase/train.csv", "tiny-distilbert/model.safetensors", "tiny-distilbert/tokenizer.json"} <= on_disk


def test_the_assets_weigh_less_than_two_mebibytes():
    total = sum((DATA_DIR / name).stat().st_size for name in listed_checksums())
    assert total < 2 * 2**20


def test_tokenizer_loads_with_auto_tokenizer_and_encodes_pairs_like_distilbert(capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenizer = AutoTokenizer.from_pretrained(str(TINY_CHECKPOINT_DIR))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    assert 1000 <= len(tokenizer) <= 2000
    assert [tokenizer.pad_token, tokenizer.unk_token, tokenizer.cls_token, tokenizer.sep_token, tokenizer.mask_token] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
    ]
    encoded = tokenizer("Shares of Summit Steel rose.", "Summit Steel shares climbed.")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    assert "Summit" in tokens, "the tokenizer is cased, like distilbert-base-cased"
    assert set(encoded) == {"input_ids", "attention_mask"}


def test_checkpoint_loads_as_a_classifier_without_any_warning(quiet_transformers_bars, capfd, caplog):
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        model = AutoModelForSequenceClassification.from_pretrained(str(TINY_CHECKPOINT_DIR))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", "e.g. no 'newly initialized' notice: the head is saved"
    assert not caplog.records
    assert isinstance(model, DistilBertForSequenceClassification)
    assert model.config.id2label == {0: "not_paraphrase", 1: "paraphrase"}


def test_checkpoint_is_a_small_distilbert(quiet_transformers_bars):
    model = AutoModelForSequenceClassification.from_pretrained(str(TINY_CHECKPOINT_DIR))
    config = model.config
    assert (config.dim, config.n_layers, config.n_heads, config.hidden_dim) == (64, 2, 2, 256)
    assert config.max_position_embeddings == 128
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000


def test_pretraining_text_leaves_out_the_sentences_it_is_told_to(build_assets):
    generator = importlib.import_module("data.paraphrase_generator")
    first = generator.generate_sentences(random.Random(0), 300, exclude=set())
    again = generator.generate_sentences(random.Random(0), 300, exclude=set(first[:100]))
    assert len(again) == 300 and not set(first[:100]) & set(again)


@pytest.fixture
def committed_copy(tmp_path):
    """A copy of the committed assets (no scripts), to alter as a different build would."""
    committed = tmp_path / "committed"
    shutil.copytree(DATA_DIR, committed, ignore=shutil.ignore_patterns("*.py", "__pycache__", "README.md"))
    return committed


def test_the_committed_assets_compare_equal_to_themselves(build_assets):
    problems, measurements = build_assets.compare(DATA_DIR, DATA_DIR)
    assert problems == []
    assert "weights differ by up to 0 (tolerance 0.01)" in measurements


def test_check_names_a_changed_csv_even_by_one_row(build_assets, committed_copy):
    with (committed_copy / "paraphrase" / "test.csv").open("a", encoding="utf-8") as f:
        f.write("An extra sentence.,Another one.,1,400\n")
    problems = build_assets.differences(DATA_DIR, committed_copy)
    assert problems == [f"paraphrase/test.csv: differs from the rebuilt file (sha256 {listed_checksums()['paraphrase/test.csv'][:12]}...)"]


def test_check_names_a_tokenizer_that_changed_by_one_byte(build_assets, committed_copy):
    path = committed_copy / "tiny-distilbert" / "tokenizer.json"
    path.write_bytes(path.read_bytes() + b" ")
    assert build_assets.differences(DATA_DIR, committed_copy)[0].startswith("tiny-distilbert/tokenizer.json: differs")


def _shift_weight(folder, name, delta):
    from safetensors.torch import load_file, save_file

    path = folder / "tiny-distilbert" / "model.safetensors"
    weights = load_file(path)
    weights[name] = weights[name] + delta
    save_file(weights, path, metadata={"format": "pt"})


def test_weights_within_the_measured_rounding_of_other_cpus_pass(build_assets, committed_copy):
    # 0.0022: the largest difference measured between two CPUs' builds (data/README.md).
    _shift_weight(committed_copy, "distilbert.transformer.layer.1.attention.k_lin.bias", 0.0022)
    assert build_assets.differences(DATA_DIR, committed_copy) == []


def test_weights_moved_like_one_pretraining_step_fewer_fail(build_assets, committed_copy):
    # One step fewer moved a weight by 0.2 (data/README.md); a twentieth of that still fails.
    _shift_weight(committed_copy, "distilbert.transformer.layer.0.attention.k_lin.weight", 0.01)
    (problem,) = build_assets.differences(DATA_DIR, committed_copy)
    assert problem.startswith("tiny-distilbert/model.safetensors: weights differ from the rebuilt ones by up to 0.01")


def test_a_different_pretraining_loss_fails(build_assets, committed_copy):
    record = committed_copy / build_assets.PRETRAINING_RECORD
    losses = json.loads(record.read_text())
    losses["mlm_loss_after"] -= 0.0055  # what one pre-training step fewer gave
    record.write_text(json.dumps(losses))
    (problem,) = build_assets.differences(DATA_DIR, committed_copy)
    assert problem.startswith("pretraining.json: the rebuild's mlm_loss_after is")


def test_the_recorded_losses_are_the_ones_the_readme_states():
    losses = json.loads((DATA_DIR / "pretraining.json").read_text())
    readme = (DATA_DIR / "README.md").read_text()
    assert f"falls from {losses['mlm_loss_before']:.2f} to {losses['mlm_loss_after']:.2f}" in readme


def make_commands(target: str) -> list[str]:
    """Return the commands `make TARGET` runs once .venv is set up, as `make -n` prints them (none is run)."""
    result = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed", target],
                            cwd=REPO_DIR, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return result.stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_rebuild_is_a_make_target_that_ci_runs():
    # About 150 s: not part of `make test` (Makefile), but CI's .ci/run runs it.
    rebuilds = [command for command in make_commands("check-data") if "build_assets" in command]
    assert rebuilds and all(command.endswith("--check") for command in rebuilds)
    assert not [command for command in make_commands("test") if "build_assets" in command]
    assert "make check-data" in (REPO_DIR / ".ci" / "run").read_text()
