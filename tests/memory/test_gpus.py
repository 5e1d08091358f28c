"""course_utils.gpus: cards as nvidia-smi reports them (binary units), each with a source a learner can open."""

import inspect
import re

import pytest

from course_utils import gpus
from course_utils.units import GB, GIB, MIB


def test_every_card_reports_less_than_its_decimal_label():
    for name, mib in gpus.GPU_MEMORY_MIB.items():
        assert isinstance(mib, int) and mib > 0
        label_gb = int(re.search(r"(\d+) ?GB", name).group(1))
        # What a card reports is within 10 % below its label read as GiB, and below the label in decimal GB
        # but for the 80 GB cards, whose 80 GiB (A100) are above 80 GB.
        assert 0.9 * label_gb * GIB <= mib * MIB <= label_gb * GIB


def test_each_entry_line_follows_a_comment_with_its_source():
    lines = inspect.getsource(gpus).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU_MEMORY_MIB"))
    last_url = None
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        if "https://" in line:
            last_url = line
        elif line.strip().startswith('"'):
            assert last_url is not None, f"no source above {line.strip()}"


def test_gpu_memory_bytes_and_the_figure_cards():
    assert gpus.gpu_memory_bytes("RTX 4090 (24 GB)") == 24_564 * MIB
    assert gpus.gpu_memory_bytes("A100 80GB") == 80 * GIB
    with pytest.raises(ValueError, match="name must be one of"):
        gpus.gpu_memory_bytes("RTX 4090")
    cards = gpus.figure_cards()
    assert list(cards) == list(gpus.FIGURE_CARDS) and list(cards.values()) == sorted(cards.values())


def test_smallest_card_holding_compares_bytes_with_what_the_card_reports():
    assert gpus.smallest_card_holding(16 * GB) == "T4 (16 GB)"  # 16 GB = 15,259 MiB, within a T4's 15,360 MiB
    assert gpus.smallest_card_holding(15_360 * MIB) == "T4 (16 GB)"
    assert gpus.smallest_card_holding(15_360 * MIB + 1) == "RTX 4090 (24 GB)"
    assert gpus.smallest_card_holding(80 * GB) == "A100 80GB"  # 74.5 GiB
    assert gpus.smallest_card_holding(80 * GIB + 1) is None
    assert "CUDA context" in gpus.HEADROOM_NOTE and "https://" not in gpus.HEADROOM_NOTE
