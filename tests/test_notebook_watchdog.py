"""The watchdog of ``scripts/notebook_watchdog.py``: a cell whose client hangs fails fast, naming the cell.

The hang is made on the client side, as it was seen (the kernel idle, its cell
finished, nbclient waiting): once the cell's request is sent, the channel nbclient
waits on stops delivering and ignores its timeout. Short timeouts keep each test
a few seconds plus a kernel start.
"""

from __future__ import annotations

import asyncio
import signal
import time

import nbformat
import psutil
import pytest
from nbclient.exceptions import CellTimeoutError
from notebook_watchdog import DEADLINE_SLACK_S, WIND_DOWN_S, CellDeadlineError, WatchedNotebookClient

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
    def give_up(signum, frame):
        raise TimeoutError(f"still waiting after {HARD_LIMIT_S} s: the watchdog did not fire")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(HARD_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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
