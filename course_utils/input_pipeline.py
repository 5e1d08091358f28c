"""An input pipeline where workers help, and how to read its waits against an epoch's spread (lesson 8).

A loader's worker process helps when making a batch takes time the training
process does not need to spend itself: reading from a disk or a network
file system, decoding, augmenting. :class:`WithReadLatency` adds a fixed wait
per item to any dataset (``time.sleep``: the process waits without using a
core, as it does for a read from remote storage), so the overlap a worker
gives is seen even on a machine whose second core is busy. Each epoch starts
the workers again unless ``persistent_workers=True`` keeps them:
:func:`time_epochs` records each epoch's time, its wait for data and the
wait for its first batch, where that start-up lands.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from course_utils.validation import check_finite_numbers, check_instance, check_positive_int

__all__ = ["WithReadLatency", "EpochTimes", "time_epochs", "describe_extra_wait", "describe_first_batch_waits"]


class WithReadLatency(torch.utils.data.Dataset):
    """``dataset``, each item returned ``seconds`` later: a read from slow storage, without the storage."""

    def __init__(self, dataset: Sequence, seconds: float):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset must have __getitem__ and __len__ (a map-style dataset), got {type(dataset).__name__}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 1:
            raise ValueError(f"seconds must be a number of seconds from 0 to 1 per item, got {seconds!r}")
        self.dataset = dataset
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        time.sleep(self.seconds)
        return self.dataset[index]


@dataclass(frozen=True)
class EpochTimes:
    """Seconds per epoch (``epochs``), waiting for data in each (``waits``), and for each epoch's first batch."""

    epochs: tuple[float, ...]
    waits: tuple[float, ...]
    first_batch_waits: tuple[float, ...]

    @property
    def total(self) -> float:
        """All epochs together, in seconds."""
        return sum(self.epochs)


def time_epochs(loader: torch.utils.data.DataLoader, step: Callable[[object], object], epochs: int = 3) -> EpochTimes:
    """Run ``step(batch)`` on every batch of ``loader`` for ``epochs`` epochs; return the :class:`EpochTimes`."""
    check_instance(loader, "loader", torch.utils.data.DataLoader, "a torch.utils.data.DataLoader")
    if not callable(step):
        raise TypeError(f"step must be a function of one batch, got {type(step).__name__}")
    check_positive_int(epochs, "epochs")
    seconds, waits, firsts = [], [], []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)  # without persistent workers, this starts them again
        waited, first = 0.0, None
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - asked
            first = waited if first is None else first
            if batch is None:
                break
            step(batch)
        seconds.append(time.perf_counter() - start)
        waits.append(waited)
        firsts.append(first)
    return EpochTimes(tuple(seconds), tuple(waits), tuple(firsts))


def describe_extra_wait(extra_wait: Sequence[float], step_difference: Sequence[float], epochs_differ: bool) -> str:
    """Return why two loaders' epochs did or did not differ measurably, from their waits and their steps, round by round.

    ``extra_wait``: per round, one loader's wait for data minus the other's,
    in seconds (a list); ``step_difference``: per round, the same loader's
    time in training steps minus the other's (the same batches: ideally 0);
    ``epochs_differ``: whether the epochs' times differed measurably
    (:func:`course_utils.speed.compare`). An epoch is its waits plus its
    steps, so the epochs differ by the sum of the two.
    """
    check_finite_numbers(extra_wait, "extra_wait")
    check_finite_numbers(step_difference, "step_difference")
    if not isinstance(epochs_differ, bool):
        raise TypeError(f"epochs_differ must be True or False (Comparison.measurable), got {epochs_differ!r}")
    if len(extra_wait) != len(step_difference):
        raise ValueError(f"step_difference must have one value per round of extra_wait ({len(extra_wait)}), "
                         f"got {len(step_difference)}")
    added, stepped = statistics.median(extra_wait), statistics.median(step_difference)
    epochs = [wait + steps for wait, steps in zip(extra_wait, step_difference)]
    swing = max(step_difference) - min(step_difference)
    text = (f"tokenising on the fly adds {added * 1e3:.1f} ms of waiting per epoch (median; from "
            f"{min(extra_wait) * 1e3:.1f} to {max(extra_wait) * 1e3:.1f}); the training steps of the same batches "
            f"took {stepped * 1e3:+.1f} ms more (median; from {min(step_difference) * 1e3:+.1f} to "
            f"{max(step_difference) * 1e3:+.1f}); so its epoch took {statistics.median(epochs) * 1e3:+.1f} ms more "
            f"(median; from {min(epochs) * 1e3:+.1f} to {max(epochs) * 1e3:+.1f})")
    if epochs_differ:
        return f"{text}: here the epochs show the difference too, as the wait plus the steps' difference"
    if stepped < 0 < added:
        return (f"{text}: the same training steps ran faster in the on-the-fly loop, taking back "
                f"{-stepped / added:.0%} of the added wait (median), and what is left falls within each loader's "
                f"spread from round to round: the epochs overlap although the wait is real")
    if swing >= added:
        return (f"{text}: the steps' time swings from round to round by as much as the added wait, so the epochs' "
                f"times, which hold both, overlap: the wait is real, and the epoch time is too noisy a ruler to show it")
    return (f"{text}: each loader's epochs also vary from round to round (the machine's load moves both), and the "
            f"verdict compares the two spreads, not the rounds' pairs")


def describe_first_batch_waits(first_batch_waits: dict[str, Sequence[float]], restarted: str, kept: str) -> str:
    """Return the verdict on the wait for a later epoch's first batch: a worker started again against one kept.

    ``first_batch_waits`` maps a loader's name to that wait in each round, in
    seconds; ``restarted`` names the loader whose worker starts at every epoch,
    ``kept`` the one with ``persistent_workers=True``.
    """
    if not isinstance(first_batch_waits, dict) or restarted not in first_batch_waits or kept not in first_batch_waits:
        raise ValueError(f"first_batch_waits must be a dict holding {restarted!r} and {kept!r}, got {first_batch_waits!r}")
    for name in (restarted, kept):
        check_finite_numbers(list(first_batch_waits[name]), f"first_batch_waits[{name!r}]", non_negative=True)
    slow, fast = first_batch_waits[restarted], first_batch_waits[kept]
    difference = statistics.median(slow) - statistics.median(fast)
    if min(slow) > max(fast):
        return (f"the worker started again waits {difference * 1e3:.1f} ms longer (median) for the epoch's first "
                f"batch than the one kept, in every round: that is its start-up, paid at every epoch")
    return (f"the waits for the epoch's first batch overlap between the worker started again and the one kept "
            f"(medians {difference * 1e3:+.1f} ms apart): this run does not show the start-up there")
