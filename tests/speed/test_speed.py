"""Lesson 8's helpers: timings and their verdicts, FLOPs per token, padding and packing, compile counts, figures."""

import math

import matplotlib
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from course_utils import compiling, padding, speed
from course_utils.plots import speed as speed_plots

matplotlib.use("Agg")


# ---------------------------------------------------------------- timings


def test_timing_reports_median_spread_and_rates():
    timing = speed.Timing((0.4, 0.1, 0.2, 0.3, 0.5))
    assert timing.median == 0.3 and timing.minimum == 0.1 and timing.maximum == 0.5
    assert timing.quartiles == (0.2, 0.4)
    assert timing.rate(3.0) == pytest.approx((10.0, 6.0, 30.0))
    assert "300.0 ms (min 100.0, max 500.0, 5 runs)" == timing.describe()


def test_time_call_runs_the_warm_up_untimed():
    calls = []
    timing = speed.time_call(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(timing.seconds) == 4


@pytest.mark.parametrize("bad", [(), (-1.0,), ("1",)])
def test_timing_refuses_what_is_not_a_list_of_seconds(bad):
    with pytest.raises(ValueError, match="seconds"):
        speed.Timing(bad)


def test_time_call_names_its_bad_arguments():
    with pytest.raises(TypeError, match="function"):
        speed.time_call(3)
    with pytest.raises(ValueError, match="repeats"):
        speed.time_call(lambda: None, repeats=0)


def test_compare_says_faster_only_when_the_middle_halves_do_not_overlap():
    fast, slow = speed.Timing((1.0, 1.1, 1.2, 1.1)), speed.Timing((2.0, 2.1, 2.2, 2.1))
    verdict = speed.compare("slow", slow, "fast", fast)
    assert verdict.faster == "fast" and verdict.measurable and verdict.ratio == pytest.approx(2.1 / 1.1)
    assert "fast is 1.91x faster than slow" in verdict.sentence()
    overlapping = speed.compare("a", speed.Timing((1.0, 1.5, 2.0)), "b", speed.Timing((1.2, 1.6, 2.2)))
    assert not overlapping.measurable
    assert overlapping.sentence().startswith("no measurable difference between a and b")


# ---------------------------------------------------------------- FLOPs


def test_matmul_weights_count_linear_layers_and_a_tied_output_once():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    per_layer = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32  # attention in, attention out, MLP in, MLP out
    assert speed.matmul_weights(model) == 2 * per_layer + 100 * 32  # plus the tied output layer


def test_the_flops_formula_matches_the_flop_counter_on_a_gpt2():
    from torch.utils.flop_counter import FlopCounterMode

    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=64, n_embd=64, n_layer=2, n_head=2))
    ids = torch.randint(100, (2, 64))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    counted = counter.get_total_flops() / ids.numel()
    assert speed.model_flops_per_token(model, 64) == pytest.approx(counted, rel=0.01)


def test_flops_per_token_is_six_per_weight_plus_attention():
    assert speed.flops_per_token(1000, 2, 64, 32) == 6000 + 12 * 2 * 64 * 32
    with pytest.raises(ValueError, match="seq_len"):
        speed.flops_per_token(1000, 2, 0, 32)


def test_model_shape_reads_layers_and_width_from_several_configs():
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=8, n_embd=16, n_layer=3, n_head=2))
    assert speed.model_shape(gpt) == (3, 16)
    with pytest.raises(ValueError, match="model"):
        speed.model_shape(torch.nn.Linear(2, 2))


def test_mfu_divides_model_flops_per_second_by_the_peak():
    assert speed.mfu(1000, 2e6, 4e9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak_flops"):
        speed.mfu(1000, 2e6, 0)


def test_matmul_peak_is_two_n_cubed_over_the_fastest_run():
    peak, timing = speed.measure_matmul_peak(size=64, repeats=3)
    assert peak == pytest.approx(2 * 64**3 / timing.minimum)


# ---------------------------------------------------------------- padding and packing

SEQUENCES = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15], [16, 17, 18, 19]]


def test_the_four_ways_to_batch_keep_every_real_token():
    for batches in (
        padding.pad_to_max_length(SEQUENCES, 2, 8),
        padding.pad_dynamically(SEQUENCES, 2),
        padding.group_by_length(SEQUENCES, 2, seed=1),
        padding.pack(SEQUENCES, 8, rows_per_batch=2),
    ):
        assert padding.padding_stats(batches).real == 15
        kept = sorted(int(t) for b in batches for t in b["input_ids"][b["attention_mask"] == 1])
        assert kept == sorted(t for s in SEQUENCES for t in s)


def test_padding_stats_count_the_mask_not_the_pad_id():
    stats = padding.padding_stats(padding.pad_dynamically([[0, 0, 0], [1]], 2, pad_id=0))
    assert (stats.real, stats.processed) == (4, 6) and stats.waste == pytest.approx(2 / 6)


def test_pad_to_max_length_wastes_more_than_dynamic_padding_and_grouping_least():
    wastes = [padding.padding_stats(b).waste for b in (
        padding.pad_to_max_length(SEQUENCES, 2, 8), padding.pad_dynamically(SEQUENCES, 2), padding.group_by_length(SEQUENCES, 2))]
    assert wastes[0] > wastes[1] > wastes[2]


def test_a_packed_row_restarts_positions_and_takes_no_loss_across_sequences():
    (batch,) = padding.pack([[5, 6, 7], [8, 9]], 6)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0]]


def test_packed_sequences_give_the_loss_of_the_unpacked_ones():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3)
    model = LlamaForCausalLM(config).eval()
    sequences = [[1, 5, 9, 3], [2, 8, 8, 8, 1, 7], [4, 4, 30], [11, 12, 13, 14, 15]]

    def summed(batches, positions=True):
        total = 0.0
        for b in batches:
            inputs = {k: b[k] for k in ("input_ids", "labels")}
            inputs.update({"position_ids": b["position_ids"]} if positions and "position_ids" in b else {"attention_mask": b["attention_mask"]})
            total += model(**inputs, use_cache=False).loss.item() * int((b["labels"][:, 1:] != -100).sum())
        return total

    unpacked = summed(padding.pad_dynamically(sequences, 2))
    packed = padding.pack(sequences, 12, rows_per_batch=2)
    assert summed(packed) == pytest.approx(unpacked, rel=1e-5)
    assert summed(packed, positions=False) != pytest.approx(unpacked, rel=1e-5)


@pytest.mark.parametrize("call, name", [
    (lambda: padding.pad_to_max_length(SEQUENCES, 2, 4), "max_length"),
    (lambda: padding.pack(SEQUENCES, 4), "max_length"),
    (lambda: padding.pad_dynamically([], 2), "sequences"),
    (lambda: padding.pad_dynamically([[1], []], 2), r"sequences\[1\]"),
    (lambda: padding.padding_stats([{"input_ids": 1}]), "attention_mask"),
])
def test_bad_padding_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------- torch.compile


def test_dynamo_recompiles_per_length_unless_shapes_are_dynamic_or_bucketed():
    def function(x):
        return (x * 2).sum()

    lengths = [(torch.ones(2, n),) for n in (3, 5, 7, 9)]
    assert compiling.count_compiled_graphs(function, lengths, dynamic=False) == 4
    assert compiling.count_compiled_graphs(function, lengths) == 2
    assert compiling.count_compiled_graphs(function, [(torch.ones(2, 16),)] * 4, dynamic=False) == 1


def test_cpp_compiler_is_none_without_any_compiler(monkeypatch):
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    assert compiling.cpp_compiler() is None


# ---------------------------------------------------------------- figures


def test_figures_have_titles_and_labelled_axes():
    timings = {"a": speed.Timing((0.1, 0.2)), "b": speed.Timing((0.3, 0.4))}
    figures = [
        speed_plots.plot_timings(timings, "two timings"),
        speed_plots.plot_speed_against_memory({"a": (timings["a"], 100, 2**20)}, "speed and memory"),
        speed_plots.plot_timeline([("forward", "forward", 0.0, 1.0), ("operators", "aten::mm", 0.1, 0.5)], "timeline"),
    ]
    for figure in figures:
        ax = figure.axes[0]
        assert ax.get_title() and ax.get_xlabel() and (ax.get_ylabel() or ax.get_yticklabels())
        matplotlib.pyplot.close(figure)


def test_timeline_spans_come_from_record_function_ranges():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with torch.profiler.record_function("work"):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    spans = speed_plots.timeline_spans(profile, ("work",))
    assert any(lane == "work" for lane, *_ in spans)
    assert any(lane == "operators" and name == "aten::mm" for lane, name, *_ in spans)
    assert all(start >= 0 and duration >= 0 and not math.isnan(duration) for _, _, start, duration in spans)


def test_time_interleaved_times_each_function_in_turns_after_the_warm_up():
    calls = []
    timings = speed.time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert {name: len(timing.seconds) for name, timing in timings.items()} == {"a": 3, "b": 3}
    with pytest.raises(TypeError, match="functions"):
        speed.time_interleaved({"a": 1})


def test_a_compiling_call_reports_inductors_cache_or_that_the_caches_were_off():
    if compiling.cpp_compiler() is None:
        pytest.skip("no C++ compiler: Inductor cannot compile here")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: (x * 3).cos().sum(), dynamic=False)
    cached = compiling.time_compiling_call(lambda: compiled(torch.ones(3)))
    assert cached.seconds > 0 and cached.hits + cached.misses >= 1 and "Inductor's cache:" in cached.describe()
    uncached = compiling.time_compiling_call(lambda: compiled(torch.ones(5)), use_caches=False)
    assert uncached.hits is None and "caches off" in uncached.describe()
    torch._dynamo.reset()


def test_time_compiling_call_names_its_bad_arguments():
    with pytest.raises(TypeError, match="call"):
        compiling.time_compiling_call("f")
    with pytest.raises(TypeError, match="use_caches"):
        compiling.time_compiling_call(lambda: None, use_caches="no")
