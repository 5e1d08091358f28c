"""Specification of lesson 3's memory figures in course_utils.plots.memory: titled, labelled, drawn from the numbers given."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import plots  # noqa: E402
from course_utils.plots import memory as memory_plots  # noqa: E402
from course_utils.quantization import (  # noqa: E402
    dequantize_blockwise,
    factor_second_moment,
    quantize_blockwise,
    reconstruct_second_moment,
)

MIB = 1024**2


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _texts(figure):
    """Every piece of text drawn on the figure: titles, labels, annotations, legend entries."""
    return [text.get_text() for text in figure.findobj(matplotlib.text.Text) if text.get_text()]


def _assert_titled_and_labelled(ax):
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_both_lessons_figures_are_exported():
    assert "plot_state_memory_vs_parameters" in memory_plots.__all__
    for name in memory_plots.__all__:
        assert hasattr(plots, name)


def test_format_bytes_uses_binary_units():
    assert memory_plots.format_bytes(526_258_176) == "501.9 MiB"
    assert memory_plots.format_bytes(3 * 1024**3) == "3.0 GiB"
    assert memory_plots.format_bytes(100) == "100 bytes"
    with pytest.raises(ValueError, match="num_bytes must be a non-negative number"):
        memory_plots.format_bytes(-1)


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


def test_memory_by_model_rejects_an_unknown_model():
    with pytest.raises(ValueError, match="missing from parameter_counts"):
        plots.plot_optimizer_memory_by_model({"a": 10}, {"AdamW": {"b": 80}})


def test_breakdown_stacks_the_four_parts_in_order_and_marks_the_peak():
    breakdown = {"weights": 100 * MIB, "gradients": 100 * MIB, "optimizer_state": 200 * MIB, "activations": 50 * MIB,
                 "peak": 420 * MIB}
    figure = plots.plot_training_memory_breakdown({"step": breakdown})
    ax = figure.axes[0]
    _assert_titled_and_labelled(ax)
    assert ax.get_ylabel() == "memory (MiB)"
    bars = ax.patches
    assert [bar.get_height() for bar in bars] == [100, 100, 200, 50]
    assert [bar.get_y() for bar in bars] == [0, 100, 200, 400]
    assert any("peak 420 MiB" in text for text in _texts(figure))


def test_breakdown_reads_objects_with_attributes_and_says_when_a_part_is_not_estimated():
    class Breakdown:
        weights, gradients, optimizer_state, activations, peak = 5 * 1024**3, 5 * 1024**3, 10 * 1024**3, None, None

    figure = plots.plot_training_memory_breakdown({"Llama-shaped": Breakdown()})
    texts = _texts(figure)
    assert figure.axes[0].get_ylabel() == "memory (GiB)"
    assert "activations: not estimated" in texts
    assert "20.0 GiB + ?" in texts


def test_breakdown_rejects_negative_bytes():
    with pytest.raises(ValueError, match=r"breakdowns\['x'\].weights must be a non-negative number of bytes"):
        plots.plot_training_memory_breakdown({"x": {"weights": -1}})


def test_explorer_redraws_when_a_widget_changes_and_keeps_the_reference_bar():
    pytest.importorskip("ipywidgets")
    calls = []

    def estimate(model, optimizer, precision, batch_size, seq_len):
        calls.append((model, optimizer, precision, batch_size, seq_len))
        per_parameter = {"adamw": 8, "adafactor": 0}[optimizer]
        return {"weights": 4 * MIB, "gradients": 4 * MIB, "optimizer_state": per_parameter * MIB,
                "activations": batch_size * seq_len * 1024}

    explorer = plots.training_memory_explorer(
        ["small", "large"], estimate, ["adamw", "adafactor"], ("fp32",), reference=("adamw", "fp32"),
    )
    assert explorer.redraw_count == 1
    explorer.optimizer.value = "adafactor"
    explorer.batch_size.value = 64
    assert explorer.redraw_count == 3
    assert list(explorer.breakdowns()) == ["adafactor, fp32", "adamw, fp32"]
    assert ("small", "adafactor", "fp32", 64, explorer.seq_len.value) in calls
    assert explorer.figure.axes[0].get_title().startswith("small: one training step, batch 64")


def test_explorer_rejects_an_empty_choice():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match="optimizers must be a non-empty list"):
        plots.training_memory_explorer(["m"], lambda *args: {}, [])
