"""Specification of lesson 7's figure data and figure: the cached per-process plans, where a model fits, the plot.

The cache (``lessons/cached/07_sharding_plans.json``, written by
``tools/lesson7_sharding_plans.py``) must be what the planner gives: one of its
points is planned again here and compared field by field.
"""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import gpus, sharding_plans  # noqa: E402
from course_utils.plots.sharding import plot_memory_per_gpu  # noqa: E402
from course_utils.units import GIB  # noqa: E402
from figure_checks import assert_nothing_is_cropped  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def cached():
    return sharding_plans.load_cached_plans()


def test_the_cache_holds_every_model_and_set_up_once(cached):
    points = [(p["model"], p["world_size"], p["sharding"]) for p in cached["plans"]]
    assert sorted(points) == sorted((m, n, s) for m in sharding_plans.MODEL_SHAPES for n, s in sharding_plans.SETUPS)


def test_the_cache_counts_the_parameters_of_the_models_built_from_its_shapes(cached):
    model = "TinyLlama-1.1B-shaped (GQA)"
    parameters = {p["parameters"] for p in cached["plans"] if p["model"] == model}
    assert parameters == {sharding_plans.count(sharding_plans.build_model(model))}


def test_one_cached_point_is_what_the_planner_gives_now(cached):
    if cached["torch"] != torch.__version__:
        pytest.skip(f"the cache was planned on torch {cached['torch']}, this is {torch.__version__}: rerun the script")
    point = next(p for p in cached["plans"]
                 if p["model"] == "TinyLlama-1.1B-shaped (GQA)" and p["world_size"] == 8 and p["sharding"] == "zero3")
    live = sharding_plans.replan(point["model"], point["world_size"], point["sharding"])
    assert live == {name: point[name] for name in live}


def test_sharding_divides_the_peak_zero3_more_than_zero2_and_zero1_less_than_ddp(cached):
    by = {(p["model"], p["world_size"], p["sharding"]): p["peak"] for p in cached["plans"]}
    for model in sharding_plans.MODEL_SHAPES:
        assert by[model, 8, "zero3"] < by[model, 8, "zero2"] < by[model, 1, "none"]
        assert by[model, 512, "zero3"] < by[model, 64, "zero3"] < by[model, 8, "zero3"]
        # ZeRO-1 divides the optimizer state only (process 0 keeps the largest tensor's on any number)
        assert by[model, 512, "zero1"] <= by[model, 64, "zero1"] < by[model, 8, "zero1"] < by[model, 8, "ddp"]


def test_a_stale_cache_is_refused(tmp_path, cached):
    stale = dict(cached, step={**cached["step"], "seq_len": 1024})
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="another step"):
        sharding_plans.load_cached_plans(path)
    with pytest.raises(FileNotFoundError, match="lesson7_sharding_plans"):
        sharding_plans.load_cached_plans(tmp_path / "missing.json")


def test_the_rule_describes_a_peak_only_while_it_is_at_least_half_of_it():
    plan = {"parameters": 1000, "world_size": 8}
    assert sharding_plans.rule_of_thumb(1000, 8) == 2000
    assert sharding_plans.rule_describes({**plan, "peak": 4000})
    assert not sharding_plans.rule_describes({**plan, "peak": 4001})


def test_where_it_fits_names_the_smallest_card_holding_each_peak_or_none():
    cards = gpus.figure_cards()
    smallest, largest = min(cards.values()), max(cards.values())
    plans = [{"model": "m", "world_size": 8, "sharding": "zero3", "peak": smallest},
             {"model": "m", "world_size": 1, "sharding": "none", "peak": largest + 1},
             {"model": "other", "world_size": 1, "sharding": "none", "peak": 1}]
    rows = sharding_plans.where_it_fits(plans, "m")
    assert [r["card"] for r in rows] == [min(cards, key=cards.get), None]
    with pytest.raises(ValueError, match="model must be one of"):
        sharding_plans.where_it_fits(plans, "nothing")


def test_build_model_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="name"):
        sharding_plans.build_model("GPT-5")


def test_memory_per_gpu_draws_one_curve_per_set_up_with_the_cards_and_the_rule(cached):
    cards = gpus.figure_cards()
    figure = plot_memory_per_gpu(cached["plans"], cards, sharding_plans.rule_describes, step="fp32 AdamW")
    ax = figure.axes[0]
    assert ax.get_title() and "GiB" in ax.get_ylabel() and ax.get_xlabel()
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ZeRO-3 / FSDP, 512 GPUs" in labels and "ZeRO-2, 8 GPUs" in labels and "one process" in labels
    assert "16 bytes x P / 64" in labels
    # The curve of ZeRO-3 on 8 GPUs passes through the cached peaks, in GiB.
    line = next(line for line in ax.get_lines() if line.get_label() == "ZeRO-3 / FSDP, 8 GPUs")
    expected = sorted((p["parameters"], p["peak"] / GIB) for p in cached["plans"]
                      if p["world_size"] == 8 and p["sharding"] == "zero3")
    assert list(zip(line.get_xdata(), line.get_ydata())) == expected
    texts = [t.get_text() for t in ax.texts]
    assert all(any(t.startswith(card) for t in texts) for card in cards)
    assert_nothing_is_cropped(figure)


def test_memory_per_gpu_rejects_no_plans():
    with pytest.raises(TypeError, match="plans"):
        plot_memory_per_gpu([], gpus.figure_cards(), sharding_plans.rule_describes)


def test_the_search_for_the_fewest_gpus_ends_between_neighbours(cached):
    """Each search's answer fits the card and one fewer does not, among the points it planned (a bisection)."""
    fewest = cached["fewest"]
    card = gpus.gpu_memory_bytes(fewest["card"])
    assert set(fewest["searches"]) == set(sharding_plans.SEARCHES)
    for label, found in fewest["searches"].items():
        tried = dict(found["tried"])
        if found["world_size"] is None:
            assert all(peak > card for peak in tried.values()), label
            continue
        assert found["peak"] == tried[found["world_size"]] <= card, label
        assert found["world_size"] == 2 or tried[found["world_size"] - 1] > card, label
        # the peaks it planned fall as N grows: what the bisection relies on
        ordered = [tried[n] for n in sorted(tried)]
        assert ordered == sorted(ordered, reverse=True), label


def test_checkpointing_and_bf16_weights_need_fewer_gpus_and_autocast_needs_more(cached):
    searches = cached["fewest"]["searches"]
    fp32 = searches["fp32"]["world_size"]
    assert searches["fp32, activation checkpointing"]["world_size"] < fp32
    assert searches["bf16 weights"]["world_size"] < fp32
    assert searches["bf16 autocast"]["world_size"] is None or searches["bf16 autocast"]["world_size"] > fp32


def test_fewest_processes_bisects_with_the_planner_on_a_small_model():
    found = sharding_plans.fewest_processes("TinyLlama-1.1B-shaped (GQA)", gpus.gpu_memory_bytes("T4 (16 GB)"), most=8)
    tried = dict(found["tried"])
    assert found["world_size"] is not None and tried[found["world_size"]] <= gpus.gpu_memory_bytes("T4 (16 GB)")


def test_build_model_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        sharding_plans.build_model("Llama-2-7B-shaped", dtype="fp16")
