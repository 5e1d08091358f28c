"""The family sweep of ``make bench`` (benchmarks/family_sweep.py): small configs built from each type's own, every
task table the planner reads, and each outcome told apart. The sweep itself runs in ``make bench`` (about 17 min)."""

import transformers as tf

from benchmarks import family_sweep
from course_utils.memory import model_families


def test_a_small_config_is_the_type_s_own_with_small_sizes_and_what_its_init_derives_from_them():
    config = family_sweep.small_config(tf.Qwen3Config)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size) == (64, 2, 4, 512)
    assert len(config.layer_types) == 2  # derived by Qwen3Config's __init__ from the small depth


def test_nested_configs_and_per_stage_lists_are_made_small_too():
    gemma3 = family_sweep.small_config(tf.Gemma3Config)
    assert gemma3.text_config.hidden_size == 64 and gemma3.vision_config.num_hidden_layers == 2
    swin = family_sweep.small_config(tf.SwinConfig)
    assert swin.depths == [1] * len(tf.SwinConfig().depths) and swin.num_heads == [1] * len(tf.SwinConfig().num_heads)


def test_an_encoder_decoder_without_a_decoder_start_token_gets_one_as_fine_tuners_set_it():
    assert family_sweep.small_config(tf.T5Config).decoder_start_token_id is not None


def test_the_sweep_goes_through_every_task_table_the_planner_reads():
    assert set(family_sweep.TABLES) == set(model_families.HEADS)
    families = family_sweep.task_table_families()
    assert families["llama"] == "LlamaForCausalLM"  # a language-model head first, where the type has one
    assert all(isinstance(name, str) for name in families.values())


def test_each_outcome_is_told_apart():
    assert family_sweep.outcome({"error_pct": 0.0}) == "planned within 2%"
    assert family_sweep.outcome({"error_pct": -3.0}) == "planned, more than 2% off"
    assert family_sweep.outcome({"refused": "x", "real step fails": None}) == "refused"
    assert family_sweep.outcome({"refused": "x", "real step fails": "RuntimeError"}) == "real step fails too"
    assert family_sweep.outcome({"crashed": "x"}) == "crashed"
    assert family_sweep.outcome({"build failed": "x"}) == "not built"


def test_one_family_end_to_end_is_planned_to_the_byte_of_its_measurement(capsys):
    result = family_sweep.main(["llama"])
    (row,) = result["rows"]
    assert row["outcome"] == "planned within 2%" and row["measured_peak"] == row["estimated_peak"]
    assert "1 byte-exact" in capsys.readouterr().out
