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

__all__ = ["WithReadLatency", "EpochTimes", "time_epochs", "describe_extra_wait"]


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


def describe_extra_wait(extra_wait: Sequence[float], step_difference: Sequence[float]) -> str:
    """Return the verdict on one loader's extra wait per epoch against the difference of the two loaders' training steps.

    ``extra_wait``: per round, one loader's wait for data minus the other's,
    in seconds (a list); ``step_difference``: per round, the same loader's time in
    training steps minus the other's (the same batches: ideally 0). The
    epochs differ by their sum; when the steps' difference swings by more
    than the extra wait, the epochs cannot show the wait.
    """
    check_finite_numbers(extra_wait, "extra_wait")
    check_finite_numbers(step_difference, "step_difference")
    swing = max(step_difference) - min(step_difference)
    added = statistics.median(extra_wait)
    text = (f"tokenising on the fly adds {added * 1e3:.1f} ms of waiting per epoch (median; from "
            f"{min(extra_wait) * 1e3:.1f} to {max(extra_wait) * 1e3:.1f}), while the training steps of the "
            f"same batches differ from round to round by up to {swing * 1e3:.1f} ms")
    if swing > added:
        return (f"{text}: the steps' swing is larger than the added wait, so the epochs' times, which hold both, "
                f"overlap: the wait is real, and the epoch time is too noisy a ruler to show it")
    return (f"{text}: the added wait is larger than the steps' swing, so it shows in the epochs' times as well")
