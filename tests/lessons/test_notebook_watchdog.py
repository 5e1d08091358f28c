"""The watchdog of ``tools/notebook_watchdog.py``: a cell whose client hangs fails fast, naming the cell.

The hang is made on the client side, as it was seen (the kernel idle, its cell
finished, nbclient waiting): once the cell's request is sent, the channel nbclient
waits on stops delivering and ignores its timeout. Short timeouts keep each test
a few seconds plus a kernel start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import nbformat
import psutil
import pytest
from hard_limits import fail_after
from nbclient.exceptions import CellTimeoutError
from tools.notebook_watchdog import DEADLINE_SLACK_S, WIND_DOWN_S, CellDeadlineError, WatchedNotebookClient

TIMEOUT_S = 1
IOPUB_TIMEOUT_S = 1
DEADLINE_S = TIMEOUT_S + IOPUB_TIMEOUT_S + DEADLINE_SLACK_S
# Killing the kernel (nbclient's bounded wait for it to exit), then the run winding down.
KILL_S = 5 + 2 * WIND_DOWN_S
# Without the watchdog these tests would hang (plain nbclient waits for good on
# the lost message): this ends them, kernel start included, as a failure.
HARD_LIMIT_S = 60


@pytest.fixture(autouse=True)
def hard_limit():
    with fail_after(HARD_LIMIT_S, "the watchdog did not fire"):
        yield


async def never_returns(*args, **kwargs):
    """A channel's ``get_msg`` that has lost its message and ignores its timeout."""
    await asyncio.get_running_loop().create_future()


def tiny_notebook():
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("answer = 6 * 7\nprint(answer)"),
        nbformat.v4.new_code_cell("print('the second cell')\nanswer"),
    ])  # fmt: skip


class ChannelStopsAt:
    """``on_cell_execute`` hook: from cell ``index`` on, ``channel`` of the client delivers nothing.

    Records when that cell was about to be sent and the kernel's process id.
    """

    def __init__(self, index: int, channel: str):
        self.index, self.channel = index, channel
        self.client = self.sent_at = self.kernel_pid = None

    def __call__(self, cell, cell_index):
        if cell_index == self.index:
            getattr(self.client.kc, self.channel).get_msg = never_returns
            self.kernel_pid = self.client.km.provisioner.process.pid
            self.sent_at = time.monotonic()


def watched_client(tmp_path, hook=None):
    options = {"on_cell_execute": hook} if hook else {}
    client = WatchedNotebookClient(
        tiny_notebook(), label="tiny.ipynb", timeout=TIMEOUT_S, iopub_timeout=IOPUB_TIMEOUT_S,
        kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"], **options,
    )  # fmt: skip
    if hook:
        hook.client = client
    return client


def test_cells_run_as_in_nbclient(tmp_path):
    client = watched_client(tmp_path)
    with client.setup_kernel():
        for index, cell in enumerate(client.nb.cells):
            client.execute_cell(cell, index)
        assert client.km.provisioner.process.poll() is None  # the kernel still runs
    assert client.nb.cells[0].outputs[0].text == "42\n"
    assert client.nb.cells[1].outputs[-1].data["text/plain"] == "42"


@pytest.mark.parametrize("run", ["execute_cell", "execute"], ids=["cell by cell", "whole notebook"])
def test_a_lost_reply_fails_at_the_deadline_naming_the_cell_and_kills_the_kernel(tmp_path, run):
    hang = ChannelStopsAt(1, "shell_channel")
    client = watched_client(tmp_path, hang)
    with pytest.raises(CellDeadlineError) as raised:
        if run == "execute":  # the build's way
            client.execute()
        else:  # the re-run test's and the benchmark's way
            with client.setup_kernel():
                for index, cell in enumerate(client.nb.cells):
                    client.execute_cell(cell, index)
    waited = time.monotonic() - hang.sent_at
    assert str(raised.value).startswith("tiny.ipynb: cell 1 (`print('the second cell')`) had not finished after")
    assert DEADLINE_S - 1 < waited < DEADLINE_S + KILL_S  # the watchdog's clock starts just before the hook runs
    assert not psutil.pid_exists(hang.kernel_pid)


def test_lost_outputs_are_an_error_naming_the_cell_not_a_cell_without_outputs(tmp_path):
    hang = ChannelStopsAt(1, "iopub_channel")
    client = watched_client(tmp_path, hang)
    with client.setup_kernel(), pytest.raises(CellTimeoutError, match="Timeout waiting for IOPub output") as raised:
        for index, cell in enumerate(client.nb.cells):
            client.execute_cell(cell, index)
    assert "print('the second cell')" in str(raised.value)
    assert time.monotonic() - hang.sent_at < DEADLINE_S


def test_a_cell_past_the_cell_timeout_gets_nbclients_own_error_not_the_watchdogs(tmp_path):
    client = watched_client(tmp_path)
    client.shutdown_kernel = "immediate"  # the kernel is still asleep in the cell
    cell = nbformat.v4.new_code_cell("import time\ntime.sleep(60)")
    with client.setup_kernel():
        started = time.monotonic()
        with pytest.raises(CellTimeoutError, match="Cell execution timed out"):
            client.execute_cell(cell, 0)
        assert time.monotonic() - started < DEADLINE_S


# ------------------------------------------------------------------ the lost wake-up on the shell socket
# What stalled lesson 2's explorer cell (tools/notebook_watchdog.py, module docstring): a send on the shell
# channel just after the execute_reply landed left the receive waiting for it asleep until its timeout.

RECEIVE_TIMEOUT_S = 3


async def _reply_lands_then_the_client_sends(send_safely: bool) -> float:
    """Return the seconds a pending receive takes to see a reply that landed just before another send."""
    import zmq
    import zmq.asyncio
    from jupyter_client.channels import AsyncZMQSocketChannel
    from jupyter_client.session import Session
    from tools.notebook_watchdog import send_through_the_asyncio_socket

    kernel = zmq.Context.instance().socket(zmq.ROUTER)
    client = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    try:
        client.connect(f"tcp://127.0.0.1:{kernel.bind_to_random_port('tcp://127.0.0.1')}")
        session = Session(key=b"test")
        channel = AsyncZMQSocketChannel(client, session)
        if send_safely:
            send_through_the_asyncio_socket(channel)
        channel.send(session.msg("execute_request", {}))
        identity, *request = kernel.recv_multipart()
        reply = asyncio.ensure_future(channel.get_msg(timeout=RECEIVE_TIMEOUT_S))
        await asyncio.sleep(0.1)  # the receive is waiting
        kernel.send_multipart([identity, *request])
        time.sleep(0.3)  # the client busy (the loop blocked): the reply lands before the loop looks
        channel.send(session.msg("comm_msg", {}))  # as nbclient sends an Output widget's state
        started = time.monotonic()
        await reply
        return time.monotonic() - started
    finally:
        client.close(linger=0)
        kernel.close(linger=0)


def _run_in_a_thread_of_its_own(coroutine):
    """Return ``asyncio.run(coroutine)`` run in a new thread.

    A test that ran earlier in the same pytest worker may have left an event loop
    running in this thread (Playwright's sync API keeps one for the browser tests'
    session), and asyncio.run refuses to start inside one.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_a_send_on_the_shell_channel_does_not_leave_a_landed_reply_unread():
    assert _run_in_a_thread_of_its_own(_reply_lands_then_the_client_sends(send_safely=True)) < 1
    # The same with jupyter_client's own send: the receive sleeps until its timeout (if this fails,
    # jupyter_client no longer loses the wake-up, and send_through_the_asyncio_socket may go).
    assert _run_in_a_thread_of_its_own(_reply_lands_then_the_client_sends(send_safely=False)) > RECEIVE_TIMEOUT_S / 2


def test_a_cell_printing_into_an_output_widget_gets_its_reply_at_once(tmp_path):
    cell = nbformat.v4.new_code_cell(
        "import ipywidgets as widgets\nout = widgets.Output()\ndisplay(out)\nwith out:\n    print('inside the widget')"
    )
    client = WatchedNotebookClient(
        nbformat.v4.new_notebook(cells=[cell]), label="widget.ipynb", timeout=10, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}}, extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )  # fmt: skip
    delayed = []
    process_message = client.process_message

    def busy_when_the_widget_gets_output(msg, cell, cell_index):
        # The stall's timing, forced: the kernel's execute_reply lands while the client is still busy with
        # the print captured by the widget, before nbclient sends the widget's new state on the shell channel.
        if msg["msg_type"] == "stream" and client.output_hook_stack[msg["parent_header"].get("msg_id")]:
            time.sleep(0.5)
            delayed.append(msg["content"]["text"])
        return process_message(msg, cell, cell_index)

    client.process_message = busy_when_the_widget_gets_output
    with client.setup_kernel():
        started = time.monotonic()
        client.execute_cell(cell, 0)
        took = time.monotonic() - started
    assert delayed == ["inside the widget\n"]
    widget_outputs = [state["outputs"] for state in client.widget_state.values() if "outputs" in state]
    assert widget_outputs == [[{"output_type": "stream", "name": "stdout", "text": "inside the widget\n"}]]
    assert took < 5  # not the 10 s cell timeout: plain nbclient finds the reply only when its wait times out
