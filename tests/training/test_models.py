"""Full-size architectures are counted from their configs, without downloads (lessons 1-4); bad input is named."""

import pytest
import torch

from course_utils import models

# One of the longest modules: make test hands the `slow` ones out before the other unit tests (tests/conftest.py).
pytestmark = pytest.mark.slow


def test_distilbert_base_cased_classifier_has_65_783_042_parameters():
    model = models.build_distilbert_base_cased()
    assert models.count_parameters(model) == 65_783_042


def test_meta_device_build_allocates_no_weights():
    model = models.build_distilbert_base_cased()
    assert all(parameter.device.type == "meta" for parameter in model.parameters())


@pytest.mark.parametrize(
    "name, expected",
    [("BERT-base", 109_482_240), ("GPT-2", 124_439_808), ("Llama-2-7B body (no LM head)", 6_607_343_616)],
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


def test_a_missing_folder_given_as_a_string_is_named_not_taken_for_a_hub_id():
    with pytest.raises(FileNotFoundError, match="path '/nonexistent' does not exist"):
        models.load_pretrained_classifier("/nonexistent")


@pytest.mark.parametrize("num_labels", [True, 0, 2.0])
def test_num_labels_must_be_a_positive_int(num_labels):
    with pytest.raises(ValueError, match="num_labels must be a positive int"):
        models.load_pretrained_classifier(num_labels=num_labels)


def test_trainable_only_must_be_a_bool():
    with pytest.raises(TypeError, match="trainable_only must be True or False, got 'yes'"):
        models.count_parameters(torch.nn.Linear(2, 2), trainable_only="yes")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("course model (tiny DistilBERT)", 179_458),
        ("distilbert-base-cased", 65_783_042),
        ("BERT-base classifier", 109_483_778),
        ("GPT-2 with its LM head", 124_439_808),  # the head is tied to the token embeddings
        ("Llama-2-7B-shaped", 6_738_415_616),
        ("Mistral-7B-shaped (GQA)", 7_241_732_096),
        ("Llama-2-70B-shaped (GQA)", 68_976_648_192),
    ],
)
def test_fine_tuning_architectures_have_their_published_sizes(name, expected):
    for checkpointing in (False, True):
        model = models.fine_tuning_architectures(checkpointing=checkpointing)[name]
        assert models.count_parameters(model) == expected
        assert all(p.device.type == "meta" for p in model.parameters())


def test_fine_tuning_architectures_are_built_in_the_dtype_asked_for():
    built = models.fine_tuning_architectures(torch.bfloat16)
    assert {p.dtype for model in built.values() for p in model.parameters()} == {torch.bfloat16}
    llama = built["Mistral-7B-shaped (GQA)"]
    assert llama.config.num_key_value_heads < llama.config.num_attention_heads


def test_checkpointed_architectures_recompute_every_block_and_keep_no_key_value_cache():
    built = models.fine_tuning_architectures(checkpointing=True)
    assert all(model.is_activation_checkpointing for model in built.values())
    assert not any(getattr(model.config, "use_cache", False) for model in built.values())


def test_architectures_without_checkpointing_keep_their_published_cache_setting():
    built = models.fine_tuning_architectures()
    assert not any(model.is_activation_checkpointing for model in built.values())
    causal_lms = [model for model in built.values() if type(model).__name__.endswith(("LMHeadModel", "ForCausalLM"))]
    assert len(causal_lms) == 4 and all(model.config.use_cache for model in causal_lms)


def test_gpt2_names_the_causal_lm_loss_that_transformers_leaves_unset():
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.loss.loss_utils import LOSS_MAPPING

    with torch.device("meta"):
        bare = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2))
    assert bare.loss_type is None  # why the builder names it: transformers would warn and fall back
    for checkpointing in (False, True):
        built = models.fine_tuning_architectures(checkpointing=checkpointing)
        assert built["GPT-2 with its LM head"].loss_function is LOSS_MAPPING["ForCausalLM"]
        assert all(model.loss_type in LOSS_MAPPING for model in built.values())


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"dtype": "bf16"}, TypeError, "dtype must be a torch.dtype, got str"),
        ({"dtype": torch.int8}, ValueError, "dtype must be a floating-point torch.dtype"),
        ({"checkpointing": "yes"}, TypeError, "checkpointing must be True or False, got 'yes'"),
        ({"checkpointing": 1}, TypeError, "checkpointing must be True or False, got 1"),
    ],
)
def test_fine_tuning_architectures_name_a_bad_argument(arguments, error, message):
    with pytest.raises(error, match=message):
        models.fine_tuning_architectures(**arguments)


def test_the_llama_7b_body_and_causal_lm_differ_by_the_untied_lm_head():
    body = models.count_parameters(models.well_known_architectures()["Llama-2-7B body (no LM head)"])
    causal_lm = models.count_parameters(models.fine_tuning_architectures()["Llama-2-7B-shaped"])
    assert causal_lm - body == 32_000 * 4_096
