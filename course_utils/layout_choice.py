"""Which planned layout to launch, and why: the recommendation of lesson 10, every reason computed from the plan.

:func:`recommend` takes :func:`course_utils.plan.plan_layouts`' rows and the
card's memory, and returns the fitting layout of the highest predicted tokens/s
with its reasons; :func:`what_would_change` says, for every other layout, what
keeps it out (the bytes it lacks, or the part of the step that makes it slower).
"""

from __future__ import annotations

from course_utils.units import format_bytes
from course_utils.validation import check_positive_int

__all__ = ["recommend", "what_would_change"]

_PARTS = {"compute": "compute", "recompute": "recomputation", "exposed": "exposed communication",
          "optimizer": "optimizer step"}


def _check_rows(rows) -> None:
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) and "time" in row for row in rows):
        raise TypeError(f"rows must be plan_layouts()'s non-empty list of rows, got {rows!r:.80}")


def _tokens_per_step(row: dict) -> float:
    return row["time"].tokens_per_second * row["time"].step


def _fits(row: dict, capacity: int) -> bool:
    """Whether ``row``'s planned peak fits in ``capacity`` bytes (a row whose memory is not planned does not)."""
    return row["peak"] is not None and row["peak"] <= capacity


def recommend(rows: list[dict], capacity: int) -> dict | None:
    """Return ``{"row", "reasons"}``: the fitting row of ``rows`` with the most tokens/s, and why; None when none fits.

    ``capacity``: one card's memory (bytes). The reasons are sentences built from the rows' numbers.
    """
    _check_rows(rows)
    check_positive_int(capacity, "capacity")
    fitting = sorted((row for row in rows if _fits(row, capacity)), key=lambda row: -row["time"].tokens_per_second)
    if not fitting:
        return None
    best = fitting[0]
    reasons = [f"its peak, {format_bytes(best['peak'])} per process, fits in the card's {format_bytes(capacity)} "
               f"({1 - best['peak'] / capacity:.0%} left over)",
               f"it is predicted the fastest that fits: {best['time'].tokens_per_second:,.0f} tokens/s, "
               f"MFU {best['time'].mfu:.1%}"]
    if len(fitting) > 1:
        second = fitting[1]
        reasons.append(f"the next that fits, {second['layout']}, is predicted at "
                       f"{second['time'].tokens_per_second:,.0f} tokens/s "
                       f"({second['time'].tokens_per_second / best['time'].tokens_per_second - 1:+.1%})")
    refused = [row for row in rows if row["peak"] is not None and row["peak"] > capacity]
    if refused:
        reasons.append("too large for the card: " + ", ".join(f"{row['layout']} ({format_bytes(row['peak'])})"
                                                               for row in refused))
    return {"row": best, "reasons": reasons}


def what_would_change(rows: list[dict], capacity: int) -> list[str]:
    """Return one sentence per layout not recommended: what it lacks (bytes per card) or where it loses time (seconds).

    A faster layout that does not fit would win on a card with the memory it
    lacks; a slower one that fits loses on the part of the step that differs most.
    """
    chosen = recommend(rows, capacity)
    best = chosen["row"] if chosen else None
    sentences = []
    for row in rows:
        if row is best:
            continue
        if row["peak"] is None:  # the planner refused its memory: nothing to compare, its reason instead
            sentences.append(f"{row['layout']}: its memory is not planned ({row.get('not_planned')}), so it is not "
                             f"recommended")
            continue
        if row["peak"] > capacity:
            faster = best is None or row["time"].tokens_per_second > best["time"].tokens_per_second
            sentences.append(f"{row['layout']}: needs {format_bytes(row['peak'] - capacity)} more per card"
                             + (f"; with it, it would be chosen ({row['time'].tokens_per_second:,.0f} tokens/s)"
                                if faster else ""))
            continue
        # Layouts' steps hold different numbers of tokens (a tensor-parallel group trains one batch between its
        # processes): each part is compared over as many tokens as the chosen layout's step trains.
        scale = _tokens_per_step(best) / _tokens_per_step(row)
        slower = {name: getattr(row["time"], part) * scale - getattr(best["time"], part)
                  for part, name in _PARTS.items()}
        part, seconds = max(slower.items(), key=lambda item: item[1])
        same = "per step" if scale == 1 else f"over the tokens of one {best['layout']} step"
        sentences.append(f"{row['layout']}: fits, but its {part} takes {seconds:.3g} s longer {same}; "
                         f"it would win where that part shrinks")
    return sentences
