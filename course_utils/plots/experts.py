"""Figures about expert parallelism (lesson 9). Every figure has a title, labelled axes and units.

- :func:`plot_tokens_per_expert`: the tokens each expert computed, coloured by the process that holds it, per router.

The function returns the matplotlib ``Figure``, so a notebook shows it and a test can inspect it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["plot_tokens_per_expert"]

_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1")


def plot_tokens_per_expert(received: dict, title: str = "Tokens each expert computed, by the process holding it"):
    """Draw one group of bars per router (``received``'s keys, e.g. "skew 2.0"); return the Figure.

    ``received[router]`` is a list, one entry per process, of the token counts of
    the experts that process holds, in expert order.
    """
    if not isinstance(received, dict) or not received or not all(
            isinstance(v, (list, tuple)) and v and all(isinstance(p, (list, tuple)) for p in v) for v in received.values()):
        raise ValueError("received must map each router's label to a list, per process, of its experts' token counts")
    figure, ax = plt.subplots(figsize=(9, 4.6))
    x, ticks, labels, named = 0.0, [], [], set()
    for router, processes in received.items():
        first = x
        expert = 0
        for rank, counts in enumerate(processes):
            for count in counts:
                label = f"expert on process {rank}" if rank not in named else None
                named.add(rank)
                ax.bar(x, count, color=_COLOURS[rank % len(_COLOURS)], width=0.8, label=label)
                ticks.append(x)
                labels.append(str(expert))
                expert += 1
                x += 1
        ax.text((first + x - 1) / 2, -0.09, router, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=9)
        x += 1
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_xlabel("expert, grouped by router", labelpad=30)
    ax.set_ylabel("tokens computed (count)")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure
