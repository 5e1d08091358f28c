"""Figures about context parallelism (lesson 9). Every figure has a title, labelled axes and units.

- :func:`plot_attention_memory`: bytes kept for the backward pass and allocator peak, against sequence length.

The function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_utils.units import MIB

__all__ = ["plot_attention_memory"]


def plot_attention_memory(seq_lens, series: dict,
                          title: str = "Attention's memory per process against sequence length, measured"):
    """Draw, for each series, the bytes kept for the backward pass and the peak rise against ``seq_lens`` (log-log).

    ``series`` maps a label ("full attention, 1 process") to (kept bytes, peak
    bytes), one list each, one value per sequence length. Two panels, in MiB.
    """
    if not isinstance(seq_lens, (list, tuple)) or not seq_lens:
        raise TypeError("seq_lens must be a non-empty list of sequence lengths")
    if not isinstance(series, dict) or not series or not all(
            isinstance(v, (list, tuple)) and len(v) == 2 and all(len(part) == len(seq_lens) for part in v)
            for v in series.values()):
        raise ValueError("series must map each label to (kept bytes, peak bytes), one value per sequence length each")
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    panels = (("kept for the backward pass", "bytes kept (MiB, log scale)"),
              ("allocator peak (forward + backward)", "allocator peak rise (MiB, log scale)"))
    for index, (ax, (what, unit)) in enumerate(zip(axes, panels)):
        for label, values in series.items():
            ax.plot(seq_lens, [value / MIB for value in values[index]], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("whole sequence length (tokens, log scale)")
        ax.set_ylabel(unit)
        ax.set_title(what, fontsize=10)
        ax.legend(fontsize=8)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return figure
