"""The profiler as a training script uses it: operator calls counted, and a schedule of steps (lesson 8).

:func:`operator_calls` counts how many times each operator ran in a piece of
code (the CPU profiler's ``key_averages``): where ``foreach`` or a fused
kernel claims fewer launches, the count says whether it made them.
:func:`profile_on_schedule` runs a training loop under
``torch.profiler.schedule(wait, warmup, active, repeat)``, as GPU scripts do
(https://pytorch.org/docs/stable/profiler.html): the first ``wait`` steps are
not recorded, the next ``warmup`` are recorded and thrown away (the
profiler's own start-up lands there), the ``active`` ones are kept and handed
to ``on_trace_ready``, once per cycle.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_utils.validation import check_non_negative_int, check_positive_int

__all__ = ["operator_calls", "ScheduledProfile", "profile_on_schedule", "describe_foreach_calls"]

_CPU = [torch.profiler.ProfilerActivity.CPU]


def operator_calls(function: Callable[[], object]) -> dict[str, int]:
    """Run ``function()`` under the CPU profiler; return ``{operator name: number of calls}``, nested calls included."""
    if not callable(function):
        raise TypeError(f"function must be callable with no arguments, got {type(function).__name__}")
    with torch.profiler.profile(activities=_CPU) as profile:
        function()
    return dict(Counter(event.name for event in profile.events()))


@dataclass(frozen=True)
class ScheduledProfile:
    """What :func:`profile_on_schedule` recorded.

    ``traces`` holds one pair per trace handed to ``on_trace_ready``: (the
    number of steps it recorded, the number of the last step, counted from 1);
    ``shapes_table`` is the first trace's operators grouped by input shape.
    """

    steps_run: int
    traces: tuple[tuple[int, int], ...]
    shapes_table: str


def profile_on_schedule(step: Callable[[], object], wait: int = 1, warmup: int = 1, active: int = 2,
                        repeat: int = 1, row_limit: int = 6) -> ScheduledProfile:
    """Run ``step()`` (wait + warmup + active) x repeat times under a profiler schedule; return what it kept.

    See :class:`ScheduledProfile` for what it returns; the shapes table has
    ``row_limit`` rows (``record_shapes=True``), as a real script reads it
    before exporting a Chrome trace.
    """
    if not callable(step):
        raise TypeError(f"step must be callable with no arguments, got {type(step).__name__}")
    check_non_negative_int(wait, "wait")
    check_non_negative_int(warmup, "warmup")
    check_positive_int(active, "active")
    check_positive_int(repeat, "repeat")
    check_positive_int(row_limit, "row_limit")
    traces, tables = [], []

    def trace_ready(profile):
        # Each step is one "ProfilerStep*" range (torch numbers them internally); step_num counts the steps run.
        recorded = sum(event.name.startswith("ProfilerStep") for event in profile.events())
        traces.append((recorded, profile.step_num))
        if not tables:
            tables.append(profile.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=28, max_shapes_column_width=44))

    steps = (wait + warmup + active) * repeat
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    with warnings.catch_warnings():
        # With repeat > 1 torch warns that each cycle clears the last one's events: each trace is read above, when handed over.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        with torch.profiler.profile(activities=_CPU, schedule=schedule, on_trace_ready=trace_ready,
                                    record_shapes=True) as profile:
            for _ in range(steps):
                step()
                profile.step()
    return ScheduledProfile(steps, tuple(traces), tables[0] if tables else "")


def describe_foreach_calls(loop_calls: dict[str, int], foreach_calls: dict[str, int], operator: str,
                           foreach_operator: str) -> str:
    """Return a sentence on how often ``operator`` ran per step in a for-loop optimizer and in a foreach one.

    ``loop_calls`` and ``foreach_calls`` are :func:`operator_calls` of one
    step each; ``foreach_operator`` is the list operator (``aten::_foreach_mul_``)
    that stands for ``operator`` (``aten::mul_``) in the foreach step.
    """
    for name, value in (("loop_calls", loop_calls), ("foreach_calls", foreach_calls)):
        if not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict of operator name -> calls (operator_calls), got {type(value).__name__}")
    looped, inner, listed = loop_calls.get(operator, 0), foreach_calls.get(operator, 0), foreach_calls.get(foreach_operator, 0)
    head = (f"the for-loop step calls {operator} {looped:,} times; the foreach step calls {foreach_operator} "
            f"{listed:,} times")
    if listed and inner >= looped > 0:
        return (f"{head}, and inside it {operator} still runs {inner:,} times: on this device the list operator "
                f"loops over the tensors in C++, one operator per tensor, so the arithmetic is the same and only "
                f"Python's calls are saved")
    return (f"{head}, and {operator} itself {inner:,} times: the list operator does the per-tensor work in "
            f"fewer operator calls (a multi-tensor kernel)")
