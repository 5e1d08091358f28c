"""MemTracker as the course's measured step needs it (private; used by ``course_utils.memory.training_memory``).

torch's MemTracker sees every tensor storage a step allocates and sorts it
(parameters, gradients, activations, optimizer state). :class:`StepTracker`
adds what the course's step needs: frozen parameters, the peak of each phase
on its own, and the inside of bitsandbytes' CPU optimizer update. It also
makes the tracker true to the allocator (``tests/memory/test_step_tracker.py``
checks it against torch's profiler):

- it counts the random-number state activation checkpointing saves for each
  checkpointed block (``torch.get_rng_state()``, 5,056 bytes on CPU), which
  torch makes without a tensor operation, so MemTracker never sees it;
- it does not change what it measures: MemTracker's module tracker hooks the
  gradients of every module's inputs, and in its default mode such a hook
  holds each gradient until the module's other inputs have theirs (with LoRA,
  checkpointing and accumulation, tens of KiB more at the peak than an
  untracked step holds). Nothing the course reads needs those backward hooks
  (they time per-module statistics), so the tracker does not install them;
- it does not count a view of a tensor made before the step (the batch) as
  memory the step allocated: MemTracker counts a storage from the first
  operation it sees return it, and a view returns its input's storage
  (:class:`ViewsNotCounted`, which the sharded step's FSDPMemTracker shares);
- it counts the buffers some CPU kernels allocate and free inside themselves
  (convolutions, batch norm's backward, 16-bit matrix products), which no
  dispatch mode sees: each such kernel's rise is probed once per signature
  (:mod:`course_utils.memory.kernel_buffers`) and the peak raised to it;
- it counts autograd's accumulation of a gradient as an untracked step makes
  it. Two gradients reaching one tensor are summed in place (``add_``), unless
  a dispatch mode is running: then torch treats every tensor as a subclass
  (``isTensorSubclassLike``) and sums them out of place, a new tensor beside
  both for a moment (Mamba's scan, a whole state-sized tensor per step). An
  ``add`` in the backward pass of two dense tensors of one shape, one of which
  is freed before the next operation, is that sum: its moment is not a peak.

Written against torch 2.13's MemTracker and ModTracker internals
(``_param_to_grad_hook_handles``, ``_update_peak_stats``, ``_curr_mem_snap``,
``_peak_mem``, ``_peak_mem_snap``, ``_track``, ``_in_opt``, ``_in_ac``,
``_mod_tracker``; ModTracker's ``_fw_pre_hook``, ``_fw_post_hook``,
``_get_append_fn``, ``_get_pop_fn``) and bitsandbytes 0.50's CPU backend:
after upgrading either, rerun ``pytest tests/memory/test_step_tracker.py
tests/memory/test_training_memory.py tests/memory/test_planner.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import weakref
from collections.abc import Iterator

import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, get_untyped_storages
from torch.distributed._tools.mod_tracker import ModTracker

from course_utils.memory import kernel_buffers

_TOTAL = "Total"
PARTS = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other")
_PART_KEYS = tuple(_MemRefType(part) for part in PARTS)
_CPU = torch.device("cpu")
_timeline: contextvars.ContextVar[list | None] = contextvars.ContextVar("timeline", default=None)


@contextlib.contextmanager
def recording_timeline() -> Iterator[list]:
    """Within this block, every :class:`StepTracker` made records the step's memory after each operation; yield the record.

    The record is a list with one entry per operation the trackers saw and per
    tensor freed that changed the memory held, in order: ``(phase, operation,
    bytes)``, where ``phase`` is "forward", "backward", "optimizer step" or
    "zero_grad" (what follows ``optimizer.step()``), ``operation`` the aten
    operation's name ("mm", "add_"...) or "free", and ``bytes`` the tracker's
    CPU total of each of :data:`PARTS` after it, a tuple of ints.
    """
    record: list = []
    token = _timeline.set(record)
    try:
        yield record
    finally:
        _timeline.reset(token)


class _NoHook:
    """Stands in for a hook handle: MemTracker removes every handle it holds on exit."""

    def remove(self) -> None:
        pass


class _ForwardModTracker(ModTracker):
    """ModTracker that follows modules through the forward pass only: it hooks no gradient.

    MemTracker reads from it which module runs (to file a module's first call)
    and whether autograd is running a backward pass (the graph task, not a
    hook). ModTracker's own backward hooks keep the module hierarchy during
    backward, and the one on a module's inputs holds each input's gradient
    until all of them have theirs: a step tracked with them holds more than
    the same step untracked.
    """

    def _fw_pre_hook(self, mod, input):
        self._get_append_fn(weakref.ref(mod), self._get_mod_name(mod), False)()
        if self._user_pre_fw_hook is not None:
            self._user_pre_fw_hook(mod, input)

    def _fw_post_hook(self, mod, input, output):
        if self._user_post_fw_hook is not None:
            self._user_post_fw_hook(mod, input, output)
        self._get_pop_fn(weakref.ref(mod), self._get_mod_name(mod), False)()


class ViewsNotCounted:
    """Mixin for a MemTracker (StepTracker, and the sharded step's FSDPMemTracker): a view of a storage made before the step is not counted.

    MemTracker counts a storage from the first operation it sees return it, and
    a view returns its input's storage: a view of a tensor made before the
    tracker started (the batch's labels) would be counted as memory the step
    allocated, where the allocator allocated nothing. MemTracker sees every
    storage a torch operation allocates, so a storage it does not know was made
    before it started (:meth:`_made_before_step`).
    """

    _running_a_view = False

    def _made_before_step(self, storage) -> bool:
        """Return True when ``storage`` was made before the tracked step."""
        return storage not in self._WINFO

    def _track(self, reftype, t: torch.Tensor) -> None:
        if self._running_a_view and all(self._made_before_step(storage) for storage in get_untyped_storages(t)):
            return
        super()._track(reftype, t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._running_a_view = _returns_a_view(func)
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._running_a_view = False


class StepTracker(ViewsNotCounted, MemTracker):
    """MemTracker that accepts frozen parameters, reports the peak of each phase on its own, sees inside bitsandbytes, and is true to the allocator (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _ForwardModTracker()
        self._timeline = _timeline.get()
        self._operation = ""
        self._stepped = False
        self._last_phase = "forward"
        self._summing: tuple = ()  # the gradients an accumulating add sums (their storages' records)
        self._sum_waiting: tuple | None = None  # that add's moment, which counts unless one is freed at once

    def __enter__(self) -> StepTracker:
        if self._depth == 0:
            self._get_rng_state = torch.get_rng_state
            torch.get_rng_state = self._tracked_rng_state
        return super().__enter__()

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        if self._depth == 0:
            torch.get_rng_state = self._get_rng_state

    def _tracked_rng_state(self) -> torch.Tensor:
        # Activation checkpointing saves the CPU generator's state with each checkpointed
        # block (torch.utils.checkpoint calls torch.get_rng_state()): a tensor made without
        # a torch operation, so no dispatch mode sees it. Filed as an operation's output would be.
        state = self._get_rng_state()
        self._operation = "get_rng_state"
        self._track(self._category(), state)
        self._update_peak_stats(None)
        return state

    def _category(self):
        """Return the category MemTracker files a tensor made now in (its ``__torch_dispatch__``'s rule)."""
        if self._in_opt:
            return _MemRefType.OPT
        if self._mod_tracker.is_bw and not self._in_ac:
            return _MemRefType.TEMP
        return _MemRefType.ACT

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        # MemTracker registers a gradient hook on every parameter it meets, and torch
        # refuses one on a tensor that does not require grad: mark frozen ones as hooked.
        for parameter in module.parameters():
            if not parameter.requires_grad:
                self._param_to_grad_hook_handles.setdefault(parameter, (_NoHook(), _NoHook()))
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _update_peak_stats(self, peak_state) -> None:
        # Only the tracker's own peak, not each module's: the per-module bookkeeping
        # walks every tracked module after every operation, and nothing here reads it.
        snapshot = self._curr_mem_snap.get(_CPU, {})
        if self._summing:
            # An accumulating add: whether its moment counts is known at the next event.
            self._sum_waiting = (self._summing, self._phase(), self._operation, dict(snapshot))
            self._summing = ()
            return
        for device, held in self._curr_mem_snap.items():
            self._raise_peak(dict(held), device)
        if self._timeline is not None:
            self._last_phase = self._phase()
            self._record(self._last_phase, self._operation)

    def _settle_sum(self, freed=None) -> None:
        """End an accumulating add's wait: its moment counts unless ``freed`` (a storage's record) is one of its gradients."""
        if self._sum_waiting is None:
            return
        (summing, phase, operation, snapshot), self._sum_waiting = self._sum_waiting, None
        if freed is not None and any(freed is winfo for winfo in summing):
            return  # summed in place by an untracked step: never both at once
        self._raise_peak(snapshot)
        if self._timeline is not None:
            self._last_phase = phase
            self._record(phase, operation, snapshot)

    def _raise_peak(self, snapshot: dict, device=_CPU) -> None:
        total = snapshot.get(_TOTAL, 0)
        if snapshot and self._peak_mem.get(device, 0) < total:
            self._peak_mem[device] = total
            self._peak_mem_snap[device] = snapshot

    def _delete_callback(self, winfo, w_st) -> None:
        self._settle_sum(freed=winfo)
        super()._delete_callback(winfo, w_st)
        if self._timeline is not None and self._depth > 0:
            # A free between operations ends what the last operation's phase began (the loss
            # dropped after backward); autograd's frees inside backward are backward's.
            phase = "backward" if self._mod_tracker.is_bw else self._phase() if self._stepped else self._last_phase
            self._record(phase, "free")

    def _phase(self) -> str:
        self._stepped = self._stepped or self._in_opt
        if self._in_opt:
            return "optimizer step"
        if self._stepped:  # what runs after optimizer.step() has returned: zero_grad's frees
            return "zero_grad"
        return "backward" if self._mod_tracker.is_bw else "forward"

    def _record(self, phase: str, operation: str, snapshot: dict | None = None) -> None:
        """Add a point to the timeline record (the memory held now, or ``snapshot``) when the memory held has changed."""
        snapshot = self._curr_mem_snap.get(_CPU, {}) if snapshot is None else snapshot
        held = tuple(int(snapshot.get(key, 0)) for key in _PART_KEYS)
        if not self._timeline or self._timeline[-1][2] != held:
            self._timeline.append((phase, operation, held))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kernel = _kernels_to_follow().get(func)
        if kernel is None:
            self._settle_sum()
            self._operation = func._opname
            if self._mod_tracker.is_bw and _sums_two_gradients(func, args, kwargs):
                self._summing = tuple(self._WINFO.get(t.untyped_storage(), (None, None))[0] for t in args)
            before = self._curr_mem_snap.get(_CPU, {}).get(_TOTAL, 0)
            try:
                outputs = super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                self._summing = ()
            if kernel_buffers.probed(func, args):
                self._count_kernel_buffers(before + kernel_buffers.rise_inside(func, args, kwargs))
            return outputs
        # One bitsandbytes operation is a whole optimizer update written in torch: run its
        # CPU implementation with the tracker on, so that its temporaries are seen.
        with self:
            return kernel(*args, **(kwargs or {}))

    def _count_kernel_buffers(self, total: int) -> None:
        """Raise the peak to ``total``, where a kernel's own buffers took the allocator while it ran (a temporary)."""
        snapshot = dict(self._curr_mem_snap.get(_CPU, {}))
        extra = total - snapshot.get(_TOTAL, 0)
        if extra > 0:
            snapshot[_MemRefType.TEMP] = snapshot.get(_MemRefType.TEMP, 0) + extra
            snapshot[_TOTAL] = total
            self._raise_peak(snapshot)

    def get_tracker_snapshot(self, type: str = "current"):
        self._settle_sum()
        return super().get_tracker_snapshot(type)

    def start_phase(self) -> None:
        """Forget the peak so far: from now on the peak is this phase's."""
        current = self.get_tracker_snapshot("current")
        self._peak_mem = {device: snapshot[_TOTAL] for device, snapshot in current.items()}
        self._peak_mem_snap = current

    def snapshot(self, kind: str) -> dict[str, int]:
        """Return the ``kind`` ("current" or "peak") snapshot of the CPU as {category: bytes}."""
        return cpu_snapshot(self, kind)

    def total(self, kind: str) -> int:
        """Return the ``kind`` ("current" or "peak") total on the CPU, in bytes."""
        return self.snapshot(kind)[_TOTAL]


_VIEWS: dict = {}


def _sums_two_gradients(func, args, kwargs) -> bool:
    """Return whether ``func`` on ``args`` sums two dense tensors of one shape and dtype, as autograd accumulates a gradient."""
    if func is not torch.ops.aten.add.Tensor or kwargs or len(args) != 2:
        return False
    first, second = args
    return (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.shape == second.shape
            and first.dtype == second.dtype and first.is_contiguous() and second.is_contiguous())


def _returns_a_view(func) -> bool:
    """Return True when the operation ``func`` returns (a view of) one of its inputs: its schema says the output aliases one."""
    if func not in _VIEWS:
        _VIEWS[func] = any(ret.alias_info is not None for ret in func._schema.returns)
    return _VIEWS[func]


def _kernels_to_follow() -> dict:
    """Return {bitsandbytes optimizer operation: its CPU implementation}, empty unless bitsandbytes is imported.

    bitsandbytes 0.50 implements its CPU optimizer updates in Python torch
    operations, registered as one custom operation each: a dispatch mode sees
    the operation, not the fp32 states and temporaries it allocates inside.
    """
    if "bitsandbytes" not in sys.modules:  # importing it here would stop accelerate's notebook_launcher
        return {}
    from bitsandbytes.backends.cpu import ops as cpu_ops

    return {
        torch.ops.bitsandbytes.optimizer_update_8bit_blockwise.default: cpu_ops._optimizer_update_8bit_blockwise_cpu,
        torch.ops.bitsandbytes.optimizer_update_32bit.default: cpu_ops._optimizer_update_32bit_cpu,
    }


def cpu_snapshot(tracker, kind: str) -> dict[str, int]:
    """Return MemTracker's ``kind`` snapshot ("current" or "peak") of the CPU as {category: bytes}."""
    snapshot = tracker.get_tracker_snapshot(kind).get(torch.device("cpu"), {})
    # Keys are MemTracker's category enum members (their value is the name) and the string "Total".
    by_name = {getattr(key, "value", key): int(value) for key, value in snapshot.items()}
    categories = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other", _TOTAL)
    return {name: by_name.get(name, 0) for name in categories}
