"""The CPU allocator's own record of memory, read from torch's profiler (lessons 4 and 7).

A tracker such as MemTracker sees the tensors that torch operations make in
its own thread. The allocator sees every byte it hands out, on every thread,
whoever asks: torch's profiler with ``profile_memory=True`` records one event
per allocation and per free, each with the allocator's running total.
:func:`recording_allocator` turns those events into the one number the course
compares with a tracker's: the largest rise of the total over what it was when
recording began, in bytes. :func:`measure_allocator_rise` records the
course's training step that way, with no tracker installed: the machine's
own answer, which lesson 4 sets beside the tracker's and the planner's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from course_utils.memory.setup import check_mixed_precision
from course_utils.memory.step import default_loss, training_step
from course_utils.validation import check_instance, check_positive_int

__all__ = ["AllocatorRecord", "recording_allocator", "measure_allocator_rise"]


@dataclass
class AllocatorRecord:
    """What the CPU allocator did inside a :func:`recording_allocator` block (filled in when the block ends).

    - ``rise``: the largest total the allocator held, minus its total when the
      block began, in bytes (0 if nothing was allocated).
    - ``totals``: the allocator's running total after each allocation or free,
      in time order, minus the total when the block began (bytes).
    - ``threads``: how many threads allocated.
    - ``live_at_peak``: the allocations made inside the block and still held
      when the total was highest, as (bytes, name of the operation that made
      it, or "" when none did), largest first.
    """

    rise: int = 0
    totals: tuple[int, ...] = ()
    threads: int = 0
    live_at_peak: tuple[tuple[int, str], ...] = ()


@contextlib.contextmanager
def recording_allocator() -> Iterator[AllocatorRecord]:
    """Record the CPU allocator's allocations and frees inside this block; yield an :class:`AllocatorRecord`.

    The record is filled in when the block ends. Allocations made before the
    block and freed inside it lower the total below its start (negative
    ``totals``); ``rise`` is never below 0.
    """
    from torch._C._profiler import _EventType

    # Kineto prints a "profiler_start" and a "profiler_stop" line on stderr around every trace;
    # level 6 is above the levels it logs them at (as lesson 8 does).
    os.environ["KINETO_LOG_LEVEL"] = "6"
    record = AllocatorRecord()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        yield record
    events, threads, stack = [], set(), list(profile.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation:  # a free is an allocation of negative size
            fields = event.typed[1]
            maker = event.parent.name if event.parent is not None else ""
            events.append((event.start_time_ns, fields.total_allocated, fields.alloc_size, fields.ptr, maker))
            threads.add(event.start_tid)
    events.sort(key=lambda event: event[0])
    # The allocator counts what it gave out before the block too: its total before the first event.
    start = events[0][1] - events[0][2] if events else 0
    record.totals = tuple(total - start for _, total, *_ in events)
    record.rise = max((0, *record.totals))
    record.threads = len(threads)
    record.live_at_peak = _live_at(events, record.totals.index(record.rise) + 1 if record.rise else 0)


def _live_at(events: list, count: int) -> tuple[tuple[int, str], ...]:
    """Return (bytes, maker) of what the first ``count`` events allocated and did not free, largest first."""
    live: dict[int, tuple[int, str]] = {}
    for _, _, size, pointer, maker in events[:count]:
        if size > 0:
            live[pointer] = (size, maker)
        else:
            live.pop(pointer, None)
    return tuple(sorted(live.values(), reverse=True))


def measure_allocator_rise(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, torch.Tensor],
    loss_fn: Callable[[object], torch.Tensor] | None = None, *, mixed_precision: str = "no",
    gradient_accumulation_steps: int = 1,
) -> AllocatorRecord:
    """Run the step of :func:`course_utils.memory.measure_training_step_peak` with no tracker; return the allocator's record of it.

    The same warm-up step, then the same measured step (same arguments, same
    meaning), recorded by :func:`recording_allocator`: ``rise`` is the most
    memory the step held at once beyond what it started with (the weights,
    the optimizer state, the batch), in bytes. The tracker's peak minus its
    weights and optimizer state is the same quantity, as the tracker sees it.
    """
    check_instance(model, "model", torch.nn.Module, "a torch.nn.Module")
    check_instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
    if not isinstance(batch, Mapping) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
        raise TypeError(f"batch must be a mapping of argument names to tensors, got {type(batch).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function of the model's outputs, got {type(loss_fn).__name__}")
    check_mixed_precision(mixed_precision)
    check_positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
    step = (model, optimizer, batch, loss_fn or default_loss, mixed_precision, gradient_accumulation_steps)
    model.train()
    training_step(*step)  # the warm-up step: the optimizer's state is made
    with recording_allocator() as record:
        training_step(*step)
    return record
