"""An nbclient ``NotebookClient`` whose every cell ends: with its outputs, with an error, or at a deadline.

Used by everything that drives a lesson through a real kernel (the re-run test,
the notebook benchmark, the notebook build).

A cell that shows output in an ipywidgets ``Output`` (lesson 2's moving-average
explorer, lesson 4's memory explorer) could stall in nbclient's ``execute_cell``:
the kernel idle, its cell finished and its ``idle`` status received, the client
waiting for an execute_reply that had in fact arrived and sat unread in the shell
socket until the wait's 600 s timeout (as in jupyter/nbclient#312). The cause is
a lost wake-up on the client's shell socket. nbclient plays the front end of an
``Output`` widget: for each output captured in it, it sends the widget's new
state to the kernel on the shell channel, from the task reading IOPub, while
another task awaits the execute_reply on that same socket. jupyter_client's
``Session.send`` writes a ``zmq.asyncio`` socket raw, through a blocking shadow
of it; a raw send also processes the socket's pending commands, which clears the
edge-triggered ``ZMQ_FD``, and pyzmq re-checks the socket's events only after its
own operations. A reply that landed just before such a send therefore wakes
nobody. ``WatchedNotebookClient`` sends on the shell channel through the
``zmq.asyncio`` socket's own ``send_multipart``, which re-checks after sending
(:func:`send_through_the_asyncio_socket`).

The rest is a backstop for any other wait that does not end. nbclient 0.11 bounds
the waits it makes itself, the execute_reply by ``timeout`` and the outputs after
it by ``iopub_timeout``, but only as far as jupyter_client's and pyzmq's futures
honour their timeouts and cancellations (its read of the outputs has no timeout of
its own), and by default it takes outputs that stop coming for a warning: the cell
keeps whatever had arrived. So:

- outputs that never end (a lost ``idle`` message) are an error naming the cell
  (``raise_on_iopub_timeout``), not a cell silently missing its outputs;
- a watchdog: a cell still running ``DEADLINE_SLACK_S`` after nbclient's own
  bounds would have ended it (``timeout`` for the reply plus ``iopub_timeout``
  for the outputs) has its kernel killed and raises ``CellDeadlineError``,
  naming the notebook, the cell and how long it waited.
"""

from __future__ import annotations

import asyncio
import time

from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_core.utils import ensure_async, run_sync
from nbclient import NotebookClient

# After the execute_reply the kernel's remaining outputs and its 'idle' status are
# already on their way: nbclient's default of 4 s is ample on a quiet machine, this
# leaves room for a busy one. Longer than that, they are lost.
IOPUB_TIMEOUT_S = 30
# Ample time for nbclient to raise its own error once one of its timeouts has passed
# (it does so at once, or at its next once-a-second check of the kernel): the
# watchdog fires only where nbclient did not.
DEADLINE_SLACK_S = 5
# How long a hung cell's run may take to end once its kernel is killed (nbclient
# notices a dead kernel within a second, then stops waiting).
WIND_DOWN_S = 3


class CellDeadlineError(RuntimeError):
    """A cell that had not finished at its deadline; its kernel was killed."""


class _AsyncioSends:
    """What ``Session.send`` writes to: a ``zmq.asyncio`` socket, used through its own ``send_multipart``.

    ``Session.send`` writes a ``zmq.asyncio.Socket`` through a blocking shadow of
    it, but calls the ``send_multipart`` of any other object it is given. Given
    this, it runs the asyncio socket's own, which after sending wakes a receive
    waiting on the socket for a message already there (module docstring).
    """

    def __init__(self, socket):
        self.socket = socket

    def send_multipart(self, parts, copy=True):
        sent = self.socket.send_multipart(parts, copy=copy)
        if sent.done():
            sent.result()  # raises what the immediate send raised, as the raw send would have
        # else the socket's queue sends it once it can, before any later send


def send_through_the_asyncio_socket(channel: AsyncZMQSocketChannel) -> None:
    """Make ``channel.send`` (a ``zmq.asyncio`` channel) send through its socket's own ``send_multipart``.

    Returns nothing; ``channel.send`` is replaced on that channel only.
    """
    stream = _AsyncioSends(channel.socket)

    def send(msg):
        channel.session.send(stream, msg)

    channel.send = send


class WatchedNotebookClient(NotebookClient):
    """A ``NotebookClient`` (same options) that ends every cell by its deadline (module docstring).

    ``label`` names the notebook in the error (its path, say). ``timeout`` is
    required: the deadline is built on it.
    """

    def __init__(self, nb, *, label: str, timeout: int, **options):
        options.setdefault("iopub_timeout", IOPUB_TIMEOUT_S)
        options.setdefault("raise_on_iopub_timeout", True)
        super().__init__(nb, timeout=timeout, **options)
        self.label = label

    async def async_start_new_kernel_client(self):
        """Start the kernel client as nbclient does, its shell sends waking the receives they share the socket with."""
        client = await super().async_start_new_kernel_client()
        send_through_the_asyncio_socket(client.shell_channel)
        return client

    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    @property
    def cell_deadline_s(self) -> int:
        """Seconds a cell may take before the watchdog kills its kernel."""
        return self.timeout + self.iopub_timeout + DEADLINE_SLACK_S

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        """Run ``cell`` as nbclient does; raise ``CellDeadlineError`` if it has not finished by the deadline."""
        started = time.monotonic()
        execution = asyncio.ensure_future(
            super().async_execute_cell(cell, cell_index, execution_count, store_history)
        )
        # asyncio.wait returns at the timeout whatever the run does. wait_for would not: it
        # first waits for the cancelled run to end, which a run stuck in an await may never do
        # (and nbclient reports any cancellation of a run as a dead kernel).
        await asyncio.wait({execution}, timeout=self.cell_deadline_s)
        if execution.done():
            return execution.result()
        waited = time.monotonic() - started
        await ensure_async(self.km.shutdown_kernel(now=True))
        await self._wind_down(execution)
        lines = cell.source.strip().splitlines()
        raise CellDeadlineError(
            f"{self.label}: cell {cell_index} (`{lines[0][:70] if lines else ''}`) had not finished after "
            f"{waited:.0f} s (its deadline: the {self.timeout} s cell timeout, {self.iopub_timeout} s for its "
            f"outputs and {DEADLINE_SLACK_S} s more), so its kernel was killed. nbclient's own timeouts should "
            "have ended it first: a kernel message was lost or a wait ignored its timeout (see jupyter/nbclient#312)."
        )

    execute_cell = run_sync(async_execute_cell)

    @staticmethod
    async def _wind_down(execution: asyncio.Future) -> None:
        """Let an abandoned run end (cancelled if it must be), so that nothing of it is left waiting."""
        await asyncio.wait({execution}, timeout=WIND_DOWN_S)
        if not execution.done():
            execution.cancel()
            await asyncio.wait({execution}, timeout=WIND_DOWN_S)
        if execution.done() and not execution.cancelled():
            execution.exception()  # nbclient reports the killed kernel as dead: expected, so only retrieved
