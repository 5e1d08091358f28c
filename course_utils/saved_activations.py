"""What autograd keeps for the backward pass, counted while it is alive (lesson 9).

The activations of a training step are the tensors the forward pass saves for
the backward pass. :class:`ActivationMeter` sees each one as autograd saves it
(``torch.autograd.graph.saved_tensors_hooks``) and follows it until autograd
lets it go (the backward pass used it, or the graph was dropped), counting each
storage once and never the parameters (a weight saved for the backward pass is
already counted as a weight). Its ``peak`` is what the process held at most:
with pipeline schedules, it says how many micro-batches a stage keeps at once.
"""

from __future__ import annotations

import weakref

import torch

from course_utils.validation import check_instance

__all__ = ["ActivationMeter"]


def _storage(tensor: torch.Tensor):
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    storage = local.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class ActivationMeter:
    """Within ``with ActivationMeter(model) as meter:``, count the bytes autograd saves; ``meter.live``, ``meter.peak``.

    - ``live``: bytes saved and not yet released (each storage once);
    - ``peak``: the most ``live`` reached;
    - ``saved``: every byte saved, released or not (the activations of the passes run).

    ``model``'s parameters are left out; so are storages of no bytes.
    """

    def __init__(self, model: torch.nn.Module | None = None):
        if model is not None:
            check_instance(model, "model", torch.nn.Module, "a torch.nn.Module (whose parameters are not activations)")
        self._parameters = set() if model is None else {_storage(p)[0] for p in model.parameters()}
        self._holders: dict[int, int] = {}  # storage -> how many saved tensors still hold it
        self.live = self.peak = self.saved = 0

    def _pack(self, tensor: torch.Tensor):
        pointer, nbytes = _storage(tensor)
        if pointer in self._parameters or nbytes == 0:
            return tensor
        if self._holders.get(pointer, 0) == 0:
            self.live += nbytes
            self.saved += nbytes
            self.peak = max(self.peak, self.live)
        self._holders[pointer] = self._holders.get(pointer, 0) + 1
        # The object returned here is what autograd holds; when autograd drops it, the storage is released.
        held = tensor.detach()
        weakref.finalize(held, self._release, pointer, nbytes)
        return held

    def _release(self, pointer: int, nbytes: int) -> None:
        self._holders[pointer] -= 1
        if self._holders[pointer] == 0:
            del self._holders[pointer]
            self.live -= nbytes

    def reset_peak(self) -> None:
        """Start the peak again from what is live now."""
        self.peak = self.live

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._hooks.__exit__(*exc_info)
        return False
