"""Specification of the memory figures (lessons 2-4): titled, labelled, drawn from the numbers given, nothing cropped.

Modules: ``plots.state_memory`` (lesson 2), ``plots.memory_efficient`` (lesson 3),
``plots.training_memory`` and ``plots.memory_explorer`` (lesson 4).
"""

import inspect

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import plots  # noqa: E402
from figure_checks import assert_nothing_is_cropped  # noqa: E402
from course_utils.plots import memory_efficient, memory_explorer, state_memory, training_memory  # noqa: E402
from course_utils.quantization import (  # noqa: E402
    dequantize_blockwise,
    factor_second_moment,
    quantize_blockwise,
    reconstruct_second_moment,
)
from course_utils.units import GB, GIB, MIB  # noqa: E402

MODULES = (state_memory, memory_efficient, training_memory, memory_explorer)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _texts(figure):
    """Every piece of text drawn on the figure: titles, labels, annotations, legend entries."""
    return [text.get_text() for text in figure.findobj(matplotlib.text.Text) if text.get_text()]


def _assert_titled_and_labelled(ax):
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_every_public_function_of_each_memory_figure_module_is_exported_and_reachable_from_plots():
    for module in MODULES:
        defined = {name for name, value in vars(module).items()
                   if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
                   and value.__module__ == module.__name__}
        assert defined <= set(module.__all__), (module.__name__, defined - set(module.__all__))
        for name in module.__all__:
            assert getattr(plots, name) is getattr(module, name)


def test_the_state_by_model_figure_labels_its_bytes_in_binary_units():
    # Binary units on every memory figure: lesson 2's state plot and lesson 4's figures are held
    # to 1024**2 and 1024**3 bytes by their own tests; this one reads lesson 3's axis.
    counts = {"small": 1_000, "large": 10_000_000}
    figure = plots.plot_optimizer_memory_by_model(counts, {"AdamW": {"small": 1 * MIB, "large": 1 * GIB}})
    figure.canvas.draw()
    ax = figure.axes[0]
    low, high = ax.get_ylim()
    labels = {tick.get_text() for value, tick in zip(ax.get_yticks(), ax.get_yticklabels()) if low <= value <= high}
    assert {"1 MiB", "32 MiB", "1 GiB"} <= labels, labels  # ticks at 32**4, 32**5 and 32**6 bytes


def test_quantization_error_figure_reports_the_share_of_values_rounded_to_zero():
    tensor = torch.tensor([1000.0] + [1.0] * 255 + [2.0] * 256)
    figure = plots.plot_quantization_error(tensor, {"linear": dequantize_blockwise(quantize_blockwise(tensor))})
    _assert_titled_and_labelled(figure.axes[0])
    # 255 of 512 values are crushed to 0 by the one large value in the first block.
    assert any("49.8% of values rounded to 0" in text for text in _texts(figure))


def test_quantization_error_rejects_a_restored_tensor_of_another_size():
    with pytest.raises(ValueError, match=r"restored\['bad'\] must be a tensor with as many elements"):
        plots.plot_quantization_error(torch.ones(10), {"bad": torch.ones(9)})
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        plots.plot_quantization_error(torch.ones(10), {"same": torch.ones(10)}, block_size=0)


def test_factored_second_moment_figure_names_how_many_numbers_each_side_needs():
    torch.manual_seed(0)
    full = torch.rand(30, 50) + 0.1
    figure = plots.plot_factored_second_moment(full, reconstruct_second_moment(*factor_second_moment(full)))
    texts = _texts(figure)
    assert any("30 × 50 = 1,500 numbers" in text for text in texts)
    assert any("30 + 50 = 80 numbers" in text for text in texts)
    assert any("relative error" in text for text in texts)


def test_factored_second_moment_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        plots.plot_factored_second_moment(torch.rand(3, 4), torch.rand(4, 3))
    with pytest.raises(ValueError, match="2-D"):
        plots.plot_factored_second_moment(torch.rand(3), torch.rand(3))


def test_tradeoff_figure_draws_one_point_per_optimizer_where_it_is_told():
    points = {"AdamW": (8.0, 0.0), "8-bit AdamW": (2.03, 0.05), "Adafactor": (0.02, 0.6)}
    figure = plots.plot_optimizer_tradeoff(points, num_steps=20)
    ax = figure.axes[0]
    _assert_titled_and_labelled(ax)
    assert "after 20 steps" in ax.get_ylabel()
    offsets = [tuple(collection.get_offsets()[0]) for collection in ax.collections]
    assert offsets == [pytest.approx(point) for point in points.values()]


def test_tradeoff_rejects_a_point_that_is_not_two_numbers():
    with pytest.raises(ValueError, match=r"points\['AdamW'\] must be \(bytes per parameter, distance\)"):
        plots.plot_optimizer_tradeoff({"AdamW": 8.0})


def test_memory_by_model_draws_one_line_per_optimizer_in_order_of_size():
    counts = {"big": 1_000_000, "small": 1_000, "medium": 50_000}
    state = {"AdamW": {name: 8 * count for name, count in counts.items()}, "8-bit": {"big": 2_000_000}}
    figure = plots.plot_optimizer_memory_by_model(counts, state)
    ax = figure.axes[0]
    _assert_titled_and_labelled(ax)
    adamw_line, eight_bit_line = ax.get_lines()[:2]
    assert list(adamw_line.get_xdata()) == [1_000, 50_000, 1_000_000]
    assert list(eight_bit_line.get_ydata()) == [2_000_000]
    assert any("1  small: 1k" in text for text in _texts(figure))
    assert_nothing_is_cropped(figure)


def test_memory_by_model_rejects_an_unknown_model():
    with pytest.raises(ValueError, match="missing from parameter_counts"):
        plots.plot_optimizer_memory_by_model({"a": 10}, {"AdamW": {"b": 80}})


def test_memory_by_model_keeps_its_key_of_model_names_in_the_saved_image():
    counts = {f"model {i}": 10 ** (3 + i) for i in range(8)}
    state = {"AdamW": {name: 8 * count for name, count in counts.items()}}
    figure = plots.plot_optimizer_memory_by_model(counts, state)
    assert any("8  model 7: 10B" in text for text in _texts(figure))
    assert_nothing_is_cropped(figure)


def test_the_crop_check_fails_for_a_key_left_out_of_the_layout():
    figure, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2], [1, 2])
    key = ax.text(1.05, 1.0, "a key beside the axes\nthat the layout ignores", transform=ax.transAxes, va="top")
    key.set_in_layout(False)  # lesson 3's figure did this, and the notebook's image lost its key
    figure.tight_layout()
    with pytest.raises(AssertionError):
        assert_nothing_is_cropped(figure)


def _step(weights, optimizer_state, gradients, activations, peak, phase):
    return {"weights": weights, "optimizer_state": optimizer_state, "gradients": gradients,
            "activations": activations, "peak": peak, "phase_of_peak": phase}


def test_breakdown_bars_are_as_tall_as_the_peak_not_the_sum_of_the_parts():
    step = _step(100 * MIB, 200 * MIB, 100 * MIB, 300 * MIB, 520 * MIB, "forward")
    figure = plots.plot_training_memory_breakdown({"step": step})
    ax = figure.axes[0]
    _assert_titled_and_labelled(ax)
    assert ax.get_ylabel() == "memory at the peak (MiB)"
    assert [bar.get_height() for bar in ax.patches] == [100, 200, 220]
    assert [bar.get_y() for bar in ax.patches] == [0, 100, 300]
    assert "peak 520.0 MiB\n(forward)" in _texts(figure)
    assert "forward: activations (+ temporaries)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert_nothing_is_cropped(figure)


def test_breakdown_reads_training_memory_objects_and_switches_to_gib():
    class Step:
        weights, optimizer_state, gradients, activations = 5 * GIB, 10 * GIB, 5 * GIB, 1 * GIB
        peak, phase_of_peak = 21 * GIB, "optimizer step"

    figure = plots.plot_training_memory_breakdown({"big": Step()})
    assert figure.axes[0].get_ylabel() == "memory at the peak (GiB)"
    assert "peak 21.0 GiB\n(optimizer step)" in _texts(figure)


def test_breakdown_names_bad_memory():
    with pytest.raises(ValueError, match="'x': weights must be a non-negative number of bytes"):
        plots.plot_training_memory_breakdown({"x": _step(-1, 0, 0, 0, 0, "forward")})
    with pytest.raises(ValueError, match="held throughout"):
        plots.plot_training_memory_breakdown({"x": _step(10, 10, 0, 0, 5, "forward")})


def test_peak_against_parameters_draws_one_line_per_label_and_the_gpu_sizes():
    counts = {"tiny": 84_000, "7B": 6_738_415_616, "70B": 68_976_648_192}
    peaks = {"AdamW, fp32": {name: 16 * count for name, count in counts.items()}, "8-bit AdamW, pure bf16": {"7B": 10 * GIB}}
    figure = plots.plot_peak_memory_vs_parameters(counts, peaks)
    ax = figure.axes[0]
    _assert_titled_and_labelled(ax)
    adamw, eight_bit = ax.get_lines()[:2]
    assert list(adamw.get_xdata()) == [84_000, 6_738_415_616, 68_976_648_192]
    assert adamw.get_ydata()[1] == pytest.approx(16 * 6_738_415_616 / GIB)
    assert list(eight_bit.get_ydata()) == [10]
    gpu_lines = [line for line in ax.get_lines() if len(set(line.get_ydata())) == 1 and len(line.get_xdata()) == 2
                 and list(line.get_xdata()) == [0, 1]]
    # The cards as nvidia-smi reports them, in MiB: binary units, like the axis.
    assert sorted(line.get_ydata()[0] for line in gpu_lines) == pytest.approx([15_360 / 1024, 24_564 / 1024, 40, 80])
    assert {"T4 (16 GB): 15.0 GiB", "A100 80GB: 80.0 GiB", "70B (69B)"} <= set(_texts(figure))
    assert_nothing_is_cropped(figure)


def test_peak_against_parameters_shows_the_same_peaks_per_parameter_beside_them():
    counts = {"tiny": 84_000, "7B": 6_738_415_616, "70B": 68_976_648_192}
    peaks = {"AdamW, fp32": {"tiny": 5 * MIB, "7B": 16 * counts["7B"], "70B": 16 * counts["70B"]}}
    figure = plots.plot_peak_memory_vs_parameters(counts, peaks, title="the title")
    assert figure.get_suptitle() == "the title"
    per_parameter = figure.axes[1]
    _assert_titled_and_labelled(per_parameter)
    assert "bytes per parameter" in per_parameter.get_ylabel()
    adamw = per_parameter.get_lines()[0]
    assert list(adamw.get_ydata()) == pytest.approx([5 * MIB / 84_000, 16, 16])
    assert per_parameter.get_ylim()[0] == 0
    assert not any("GiB" in t.get_text() for t in per_parameter.texts)
    alone = plots.plot_peak_memory_vs_parameters(counts, peaks, title="the title", per_parameter=False)
    assert len(alone.axes) == 1 and alone.axes[0].get_title() == "the title"
    assert_nothing_is_cropped(figure)
    assert_nothing_is_cropped(alone)


def test_peak_against_parameters_colours_lines_by_optimizer_and_dashes_them_by_precision():
    counts = {"tiny": 84_000, "7B": 6_738_415_616}
    groups = {"AdamW, fp32": ("AdamW", "fp32"), "AdamW, pure bf16": ("AdamW", "pure bf16"),
              "SGD, fp32": ("SGD", "fp32"), "SGD, pure bf16": ("SGD", "pure bf16")}
    peaks = {label: {"tiny": (i + 1) * MIB, "7B": (i + 1) * 10 * GIB} for i, label in enumerate(groups)}
    figure = plots.plot_peak_memory_vs_parameters(counts, peaks, groups=groups)
    ax = figure.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if line.get_label() in groups}
    assert set(lines) == set(groups)
    looks = {label: (line.get_color(), line.get_linestyle(), line.get_marker()) for label, line in lines.items()}
    assert looks["AdamW, fp32"][0] == looks["AdamW, pure bf16"][0] != looks["SGD, fp32"][0] == looks["SGD, pure bf16"][0]
    assert looks["AdamW, fp32"][1:] == looks["SGD, fp32"][1:] != looks["AdamW, pure bf16"][1:] == looks["SGD, pure bf16"][1:]
    legend, = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == list(groups)
    assert "optimizer" in legend.get_title().get_text() and "precision" in legend.get_title().get_text()
    assert_nothing_is_cropped(figure)


def test_peak_against_parameters_names_a_line_without_a_group():
    with pytest.raises(ValueError, match=r"groups must map every line label of peaks to an \(optimizer, precision\) pair"):
        plots.plot_peak_memory_vs_parameters({"a": 10}, {"AdamW": {"a": 80}, "SGD": {"a": 40}},
                                             groups={"AdamW": ("AdamW", "fp32")})


def test_peak_against_parameters_rejects_an_unknown_model():
    with pytest.raises(ValueError, match="missing from parameter_counts"):
        plots.plot_peak_memory_vs_parameters({"a": 10}, {"AdamW": {"b": 80}})


def test_explorer_redraws_on_every_control_shows_the_peak_and_its_phase_and_caches_answers():
    pytest.importorskip("ipywidgets")
    calls = []

    shown_while_planning = []

    def estimate(model, model_side, checkpointing, setup):
        calls.append((model, setup.optimizer, model_side, setup.batch_size, setup.seq_len, checkpointing,
                      setup.gradient_accumulation_steps))
        if calls[1:]:
            shown_while_planning.append(explorer.summary.value)
        if model_side == "refused":
            raise ValueError("cannot follow this")
        state = {"adamw": 8, "adafactor": 0}[setup.optimizer] * MIB
        activations = setup.batch_size * setup.seq_len * 1024 // (4 if checkpointing else 1)
        return _step(4 * MIB, state, 4 * MIB, activations, 8 * MIB + state + activations, "forward")

    explorer = plots.training_memory_explorer(
        ["small", "large"], estimate, {"adamw": ("adamw", {}), "adafactor": ("adafactor", {})},
        {"fp32": ("fp32", "no"), "refused": ("refused", "no")}, reference_optimizer="adamw",
    )
    assert len(calls) == 1  # chosen and reference are the same set-up at first
    explorer.optimizer.value = "adafactor"
    explorer.checkpointing.value = True
    explorer.accumulation.value = 4
    # The reference differs from the chosen set-up in its optimizer only.
    assert calls[-2:] == [("small", "adafactor", "fp32", 1, 128, True, 4), ("small", "adamw", "fp32", 1, 128, True, 4)]
    assert "peak <b>" in explorer.summary.value and "during the forward" in explorer.summary.value
    assert explorer.figure.axes[0].get_title() == "small, fp32: micro-batch 1 × 128 tokens, 4 accumulated, checkpointed"
    assert [label.get_text() for label in explorer.figure.axes[0].get_xticklabels()] == ["adafactor", "adamw"]
    explorer.checkpointing.value = False
    before = len(calls)
    explorer.checkpointing.value = True  # seen before: answered from the cache
    assert len(calls) == before
    explorer.precision.value = "refused"
    assert "not estimated: cannot follow this" in explorer.summary.value
    # While a new set-up is planned, the learner reads what is happening.
    assert shown_while_planning[-1] == "<i>planning small with adamw, refused: a new set-up takes a few seconds…</i>"
    assert len(shown_while_planning) == len(calls) - 1
    assert explorer.last_redraw_seconds < 1.0


def test_explorer_shows_the_planners_progress_while_it_follows_a_new_set_up_and_hides_it_after():
    pytest.importorskip("ipywidgets")
    from transformers import GPT2Config, GPT2LMHeadModel

    from course_utils import memory

    with torch.device("meta"):
        models = {depth: GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=depth, n_head=2,
                                                    bos_token_id=0, eos_token_id=0))
                  for depth in (7, 8)}
    built, seen = {}, []

    def estimate(model, model_side, checkpointing, setup):
        if model_side == "interrupted":
            raise KeyboardInterrupt  # the learner stops the kernel mid-plan
        bar = built["explorer"].progress if built else None  # the first redraw runs inside the constructor
        seen.append(bar and bar.layout.visibility)
        planned = memory.plan(models[model], setup)
        seen.append(bar and (bar.value, bar.max))
        return planned

    built["explorer"] = explorer = plots.training_memory_explorer(
        [7, 8], estimate, {"sgd": ("sgd", {})}, {"fp32": ("fp32", "no"), "interrupted": ("interrupted", "no")},
        batch_sizes=(1, 2), seq_lens=(8,))
    assert explorer.progress.layout.visibility == "hidden"
    explorer.batch_size.value = 2
    explorer.model.value = 8
    # Visible while planning; at the end, every copy followed (the probes: 3 or more).
    assert seen[2::2] == ["visible", "visible"]
    assert all(done == total >= 3 for done, total in seen[3::2]), seen
    assert explorer.progress.layout.visibility == "hidden"
    with pytest.raises(KeyboardInterrupt):
        explorer.precision.value = "interrupted"
    assert explorer.progress.layout.visibility == "hidden"
    explorer.precision.value = "fp32"  # the explorer still works, from its cache
    assert "peak <b>" in explorer.summary.value and explorer.progress.layout.visibility == "hidden"


def test_explorer_rejects_an_empty_choice():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match="optimizers must be a non-empty dict"):
        plots.training_memory_explorer(["m"], lambda *args: {}, {}, {"fp32": ("fp32", "no")})


def test_explorer_rejects_a_reference_optimizer_it_does_not_offer():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match="reference_optimizer must be one of optimizers"):
        plots.training_memory_explorer(["m"], lambda *args: {}, {"adamw": ("adamw", {})}, {"fp32": ("fp32", "no")},
                                       reference_optimizer="sgd")
