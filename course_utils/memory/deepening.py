"""A deep model's step timeline from two copies one block apart (used by ``step_timeline`` and ``probes``).

Two copies one block apart line up operation by operation, except for the
operations of the one block the deeper copy has more (in each pass and in a
per-parameter optimizer step). Every operation's bytes change linearly with
depth and with how many blocks ran before it, so the full depth's timeline is
the deeper copy's with that block's operations repeated as many times as the
model has blocks more, each repetition and everything after it shifted by the
bytes one more block adds (:func:`deepen`). :func:`segments` cuts the
tracker's record (``_step_tracker.recording_timeline``) by phase, and
:func:`same` compares two timelines, to check an extrapolation against a
deeper copy.
"""

from __future__ import annotations

import numpy as np

from course_utils.memory._step_tracker import PARTS

__all__ = ["deepen", "same", "segments"]


def same(segments: list | None, others: list) -> bool:
    """Return True when two recorded timelines have the same phases, operations and bytes."""
    return segments is not None and len(segments) == len(others) and all(
        label == other_label and names == other_names and np.array_equal(held, other_held)
        for (label, names, held), (other_label, other_names, other_held) in zip(segments, others)
    )


def segments(record: list) -> list[tuple[str, list[str], np.ndarray]]:
    """Return ``record`` cut where the phase changes: (phase numbered by micro-batch, operations, bytes by PARTS)."""
    segments, passes, current = [], 0, None
    for phase, operation, held in record:
        if phase != current:
            current = phase
            passes += phase == "forward"
            numbered = phase in ("forward", "backward")
            segments.append((f"{phase} {passes}" if numbered else phase, [], []))
        if operation == "free" and segments[-1][1] and segments[-1][1][-1] == "free":
            # Tensors freed together (autocast's cache of bf16 weights when it ends) go in an order
            # no copy of the model repeats: one point for the run, after it.
            segments[-1][2][-1] = held
            continue
        segments[-1][1].append(operation)
        segments[-1][2].append(held)
    return [(label, operations, np.array(held, dtype=np.int64).reshape(-1, len(PARTS)))
            for label, operations, held in segments]


def deepen(shallow: list, deeper: list, more: int) -> list | None:
    """Return ``deeper`` (a copy one block deeper than ``shallow``) extended by ``more`` blocks, or None if they do not line up.

    In each segment the deeper copy's operations are the shallow copy's with
    runs of operations inserted (:func:`_inserts`: one block's operations,
    and for instance one more block's weights freed when autocast ends).
    Shared points move by ``more`` times their change from the shallow copy
    to the deeper one (the model one block deeper). Each inserted run is
    repeated ``more + 1`` times, its r-th copy moved from the inserted run by
    ``r`` times its change from the same run just before it (one more block
    has run before it) and by ``more`` times that run's own change from the
    shallow copy.
    """
    if [label for label, *_ in shallow] != [label for label, *_ in deeper]:
        return None
    out = []
    for (label, names_1, held_1), (_, names_2, held_2) in zip(shallow, deeper):
        inserts = _inserts(names_1, names_2)
        if inserts is None:
            return None
        names, pieces, i, j = [], [], 0, 0
        for at, start, end in inserts:  # names_2[start:end] goes before names_1[at]
            pieces.append(held_2[j:start] + more * (held_2[j:start] - held_1[i:at]))
            names += names_2[j:start]
            d = end - start
            run, before = held_2[start:end], held_2[start - d:start]
            for r in range(more + 1):
                pieces.append(run + r * (run - before) + more * (before - held_1[at - d:at]))
                names += names_2[start:end]
            i, j = at, end
        pieces.append(held_2[j:] + more * (held_2[j:] - held_1[i:]))
        names += names_2[j:]
        out.append((label, names, np.concatenate(pieces)))
    return out


def _inserts(names_1: list[str], names_2: list[str]) -> list[tuple[int, int, int]] | None:
    """Return where ``names_2`` is ``names_1`` with runs inserted, as (index in names_1, start, end in names_2), or None.
    Each run is placed as late as the operations allow, then one run earlier:
    the shallow copy's last block (or last freed tensors) can differ from the
    others, so the two copies' last ones are lined up and the insert repeats a
    run that has one just like it before it, with nothing inserted between.
    """
    from difflib import SequenceMatcher

    opcodes = SequenceMatcher(a=names_1, b=names_2, autojunk=False).get_opcodes()
    if any(tag not in ("equal", "insert") for tag, *_ in opcodes):
        return None
    found = []
    for tag, i1, _, j1, j2 in opcodes:
        if tag != "insert":
            continue
        # Slide each run as early as it goes; runs that then touch are one run (the matcher may
        # have split one block's operations around an operation that matched elsewhere).
        while j1 > (found[-1][2] if found else 0) and names_2[j1 - 1] == names_2[j2 - 1]:
            i1, j1, j2 = i1 - 1, j1 - 1, j2 - 1
        if found and found[-1][2] == j1:
            found[-1][2] = j2
        else:
            found.append([i1, j1, j2])
    placed, previous_end = [], 0
    for index, (at, start, end) in enumerate(found):
        limit = found[index + 1][1] if index + 1 < len(found) else len(names_2)
        while end < limit and names_2[start] == names_2[end]:
            at, start, end = at + 1, start + 1, end + 1
        d = end - start
        at, start, end = at - d, start - d, end - d
        if start - d < previous_end or names_2[start - d:start] != names_2[start:end]:
            return None
        placed.append((at, start, end))
        previous_end = end
    rebuilt = [name for index, name in enumerate(names_2) if not any(s <= index < e for _, s, e in placed)]
    return placed if rebuilt == names_1 else None
