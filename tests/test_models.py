"""Full-size architectures are counted from their configs, without downloads (lessons 1-3)."""

import pytest
import torch

from course_utils import models


def test_distilbert_base_cased_classifier_has_65_783_042_parameters():
    model = models.build_distilbert_base_cased()
    assert models.count_parameters(model) == 65_783_042


def test_meta_device_build_allocates_no_weights():
    model = models.build_distilbert_base_cased()
    assert all(parameter.device.type == "meta" for parameter in model.parameters())


@pytest.mark.parametrize(
    "name, expected",
    [("BERT-base", 109_482_240), ("GPT-2", 124_439_808), ("Llama 7B-shaped", 6_607_343_616)],
)
def test_well_known_architectures_have_their_published_sizes(name, expected):
    assert models.count_parameters(models.well_known_architectures()[name]) == expected


def test_trainable_only_skips_frozen_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    assert models.count_parameters(model) == 3 * 4 + 4 + 4 * 2 + 2
    assert models.count_parameters(model, trainable_only=True) == 4 * 2 + 2


def test_tied_weights_are_counted_once():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    assert models.count_parameters(torch.nn.ModuleList([embedding, head])) == 40


def test_count_parameters_names_the_argument_on_bad_input():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        models.count_parameters([1, 2, 3])


def test_the_course_checkpoint_loads_with_from_pretrained():
    model = models.load_pretrained_classifier()
    assert model.config.model_type == "distilbert"
    assert model.config.num_labels == 2


def test_missing_checkpoint_path_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        models.load_pretrained_classifier(tmp_path / "nowhere")
