"""The table of cards: every figure in base units with its source beside it, dense peaks only (issue 35, part 1)."""

from __future__ import annotations

import pytest

from course_utils import hardware


def _figures(card: hardware.Card):
    yield "memory", card.memory
    yield "memory_bandwidth", card.memory_bandwidth
    yield from (("peak " + name, figure) for name, figure in card.peaks.items())
    yield from (("link " + name, figure) for name, figure in card.links.items())
    yield from (("fraction " + name, figure) for name, figure in card.matmul_fraction.items())
    yield from (("sparsity peak " + name, figure) for name, figure in card.sparsity_peaks.items())


def test_the_table_names_the_cards_the_course_names():
    assert {"A100 40GB", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "B200", "L4", "RTX 4090"} <= set(hardware.CARDS)


@pytest.mark.parametrize("name", list(hardware.CARDS))
def test_every_figure_of_a_card_is_positive_and_names_its_source(name):
    for label, figure in _figures(hardware.card(name)):
        assert figure.value > 0, (name, label)
        assert len(figure.source) > 20 and any(word in figure.source for word in ("NVIDIA", "Bekman", "torchtitan")), (
            name, label, figure.source)


@pytest.mark.parametrize("name", list(hardware.CARDS))
def test_peaks_are_in_flop_per_second_and_below_the_sparsity_figures_they_halve(name):
    card = hardware.card(name)
    for precision, figure in card.peaks.items():
        assert precision in hardware.PRECISIONS
        assert 1e13 < figure.value < 1e16, (name, precision)  # FLOP/s, not TFLOP/s
    # A card's 16-bit tensor peak is above its fp32 peak without tensor cores.
    assert card.peaks["bf16"].value > card.peaks["fp32"].value


def test_a_sparsity_figure_is_halved_and_says_so():
    h100 = hardware.card("H100 SXM").peaks["bf16"]
    assert h100.value == pytest.approx(989.5e12) and "sparsity" in h100.source


@pytest.mark.parametrize("name", list(hardware.CARDS))
def test_a_data_sheets_sparsity_figure_is_twice_the_dense_peak(name):
    card = hardware.card(name)
    for precision, figure in card.sparsity_peaks.items():
        assert figure.value == pytest.approx(2 * card.peaks[precision].value), (name, precision)
        assert "sparsity" in figure.source
    assert hardware.card("A100 80GB").sparsity_peaks["bf16"].value == 624e12  # "312 TFLOPS | 624 TFLOPS*"


def test_the_other_modules_read_their_gpu_figures_from_this_table():
    # One table of GPU figures: the lessons' links, peak and data-sheet rows are its Figures, not copies of them.
    from course_utils import comm_time, utilisation

    h100 = hardware.card("H100 SXM")
    assert comm_time.LINKS["NVLink 4, inside an H100 node"] is h100.links["nvlink"]
    assert comm_time.LINKS["PCIe Gen5 x16, GPU to host"] is h100.links["pcie"]
    assert comm_time.LINKS["InfiniBand NDR, between nodes"] is hardware.NETWORKS["InfiniBand NDR 400 Gb/s per GPU"]
    assert comm_time.GPU_PEAKS["H100 SXM, bf16 dense"] is h100.peaks["bf16"]
    gpu_rows = [row for row in utilisation.DATA_SHEET_PEAKS if row.chip in hardware.CARDS]
    assert {row.chip for row in gpu_rows} == {"H100 SXM", "A100 80GB"}
    for row in gpu_rows:
        card = hardware.card(row.chip)
        assert row.dense_tflops * 1e12 == card.peaks[row.precision].value and row.source == card.peaks[row.precision].source
        assert row.sparse_tflops * 1e12 == card.sparsity_peaks[row.precision].value


def test_links_are_per_direction_half_the_data_sheets_total():
    assert hardware.card("H100 SXM").links["nvlink"].value == 450e9  # "NVLink 900 GB/s", both directions
    assert "both directions" in hardware.card("H100 SXM").links["nvlink"].source
    assert "nvlink" not in hardware.card("L4").links and "nvlink" not in hardware.card("RTX 4090").links


def test_measured_fractions_are_fractions_and_absent_where_nobody_published_one():
    for name, card in hardware.CARDS.items():
        for figure in card.matmul_fraction.values():
            assert 0 < figure.value < 1, name
    assert hardware.achievable_fraction("L4", "bf16") is None
    assert hardware.achievable_fraction("A100 80GB", "bf16").value == pytest.approx(271.2 / 312)


def test_a_precision_without_a_sourced_peak_is_refused_by_name():
    with pytest.raises(ValueError, match="precision: no sourced fp8 peak for the A100 80GB"):
        hardware.peak_flops("A100 80GB", "fp8")


def test_memory_is_the_data_sheets_decimal_gigabytes():
    assert hardware.card("H200").memory.value == 141e9
