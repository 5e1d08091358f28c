"""MemTracker as the course's measured step needs it (private; used by ``course_utils.memory.training_memory``).

torch's MemTracker sees every tensor storage a step allocates and sorts it
(parameters, gradients, activations, optimizer state). :class:`StepTracker`
adds what the course's step needs: frozen parameters, the peak of each phase
on its own, and the inside of bitsandbytes' CPU optimizer update.

Written against torch 2.13's MemTracker internals (``_param_to_grad_hook_handles``,
``_update_peak_stats``, ``_curr_mem_snap``, ``_peak_mem``, ``_peak_mem_snap``)
and bitsandbytes 0.50's CPU backend: after upgrading either, rerun
``pytest tests/test_training_memory.py tests/test_planner.py``.
"""

from __future__ import annotations

import sys

import torch
from torch.distributed._tools.mem_tracker import MemTracker

_TOTAL = "Total"


class _NoHook:
    """Stands in for a hook handle: MemTracker removes every handle it holds on exit."""

    def remove(self) -> None:
        pass


class StepTracker(MemTracker):
    """MemTracker that accepts frozen parameters, reports the peak of each phase on its own, and sees inside bitsandbytes."""

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
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL]:
                self._peak_mem[device] = snapshot[_TOTAL]
                self._peak_mem_snap[device] = dict(snapshot)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kernel = _kernels_to_follow().get(func)
        if kernel is None:
            return super().__torch_dispatch__(func, types, args, kwargs)
        # One bitsandbytes operation is a whole optimizer update written in torch: run its
        # CPU implementation with the tracker on, so that its temporaries are seen.
        with self:
            return kernel(*args, **(kwargs or {}))

    def start_phase(self) -> None:
        """Forget the peak so far: from now on the peak is this phase's."""
        current = self.get_tracker_snapshot("current")
        self._peak_mem = {device: snapshot[_TOTAL] for device, snapshot in current.items()}
        self._peak_mem_snap = current

    def total(self, kind: str) -> int:
        """Return the ``kind`` ("current" or "peak") total on the CPU, in bytes."""
        return cpu_snapshot(self, kind)[_TOTAL]


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
