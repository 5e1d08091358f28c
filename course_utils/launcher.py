"""Starting several processes from a notebook, and getting their results back (the machinery behind lesson 6).

Lesson 6 teaches data parallelism; this module is the plumbing its cells and
exercise checks use, and a learner does not need to read it:

- :func:`launch` runs a function on N forked worker processes that meet over
  ``torch.distributed`` (the same environment ``accelerate.notebook_launcher``
  gives them), and returns what each worker returned. It gives the workers a
  time limit, reports a worker's own exception and line, and stops every worker
  when the cell is interrupted.
- :func:`check_can_launch` names the traps before anything starts;
  :func:`find_free_port` and :func:`port_is_free` choose where the workers meet.
  Every launch listens on loopback only (``course_utils.loopback``): the
  store on a socket bound to ``127.0.0.1``, gloo on the loopback interface.
  Importing this module keeps the launches of this process on loopback, those
  of ``accelerate.notebook_launcher`` (lesson 6) included.
- :func:`silence_library_progress_bars` keeps the workers' library progress
  bars from interleaving.

Running a command line from a notebook (``accelerate launch``, ``torchrun``) is
``course_utils.command_line``'s; forgetting the notebook's ``Accelerator`` is
``course_utils.accelerate_state``'s.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import sysconfig
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from course_utils import PACKAGE_DIR
from course_utils.accelerate_state import reset_accelerate_state
from course_utils.loopback import LOCALHOST, gloo_on_loopback, keep_launches_on_loopback, listening_socket, loopback_store
from course_utils.validation import (
    check_bool, check_instance, check_int_in_range, check_positive_int, check_positive_number,
)

__all__ = [
    "LaunchError",
    "WorkerError",
    "WorkerTimeout",
    "check_can_launch",
    "find_free_port",
    "launch",
    "port_is_free",
    "silence_library_progress_bars",
]

keep_launches_on_loopback()

# How long workers still running get to finish after another one failed, before they are stopped (seconds).
_GRACE_SECONDS = 2.0


class LaunchError(RuntimeError):
    """The workers could not be started (or would silently go wrong); the message says what to do."""


@dataclass(eq=False)
class WorkerError(Exception):
    """A worker's function raised. ``str()`` gives the learner-facing account: the exception and where.

    - ``rank``: the worker that raised (the lowest rank, when several did);
    - ``error_type``, ``message``: the exception's class name and text;
    - ``filename``, ``lineno``, ``function``, ``line``: the innermost frame of the
      traceback that is not in a library or in ``course_utils`` (so, in a
      learner's cell: their own line), or ``None`` when there is none.
    """

    rank: int
    error_type: str
    message: str
    filename: str | None = None
    lineno: int | None = None
    function: str | None = None
    line: str | None = None

    def __str__(self) -> str:
        text = f"worker {self.rank} raised {self.error_type}: {self.message}"
        if self.lineno is not None:
            text += f"\n  in {self.function}, line {self.lineno}: {self.line}"
        return text


class WorkerTimeout(Exception):
    """The workers were still running after ``seconds`` seconds, and were stopped."""

    def __init__(self, seconds: float, num_processes: int):
        self.seconds, self.num_processes = seconds, num_processes
        super().__init__(
            f"your code was still running after {seconds:g} s; the {num_processes} worker process"
            f"{'es were' if num_processes > 1 else ' was'} stopped"
        )


# --------------------------------------------------------------------------- where the workers meet


def port_is_free(port: int, host: str = LOCALHOST) -> bool:
    """Return True if a server could listen on TCP ``port`` of ``host`` now.

    Checked as the launches bind (:func:`course_utils.loopback.listening_socket`
    on loopback): a port left in TIME_WAIT by a finished run counts as free.
    """
    check_int_in_range(port, "port", 1, 65535)
    check_instance(host, "host", str, "a host name or address (str)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as listening_socket and torch's server
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port of ``host`` that is free right now (the operating system picks it)."""
    check_instance(host, "host", str, "a host name or address (str)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_can_launch(num_processes: int, port: int | None = None, oversubscribe: bool = False) -> int:
    """Check that ``num_processes`` workers can start from this process; return the port they will meet on.

    Raises :class:`LaunchError`, with what to do, when ``num_processes`` is more
    than this machine's CPU cores, when CUDA is already initialised here (a
    forked process cannot use it), or when ``port`` is given and busy. With
    ``port=None``, a port the operating system reports free is used (not
    torch's default 29500, which two launches at the same time would share).
    ``oversubscribe=True`` allows more processes than cores, for a run whose
    point is how the work divides (lesson 7's three processes), not its speed.
    """
    check_positive_int(num_processes, "num_processes")
    if port is not None:
        check_int_in_range(port, "port", 1, 65535)
    check_bool(oversubscribe, "oversubscribe")
    cores = os.cpu_count() or 1
    if num_processes > cores and not oversubscribe:
        raise LaunchError(
            f"num_processes={num_processes} is more than the {cores} CPU cores of this machine: the workers "
            f"would take turns on the cores and every step would wait for the slowest. "
            f"Use num_processes <= {cores} (or oversubscribe=True when speed does not matter)."
        )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise LaunchError(
            "CUDA is already initialised in this process (a cell used the GPU), and forked workers cannot use it. "
            "Restart the kernel, and use the GPU only inside the function you launch."
        )
    with _meeting_socket(port) as listener:
        return listener.getsockname()[1]


def _meeting_socket(port: int | None) -> socket.socket:
    """Return the socket the workers will meet on: listening on loopback, on ``port`` (None: a free one).

    The bind is the free-port check: the port the workers are told is already held.
    """
    try:
        return listening_socket(port or 0)
    except OSError:
        raise LaunchError(
            f"Port {port} is busy: another program (perhaps an earlier run that has not finished) listens on "
            f"it, and the workers could not meet there. Pass port={find_free_port()}, which is free now, "
            f"or port=None to let launch() pick one."
        ) from None


# --------------------------------------------------------------------------- launching


def launch(function, args: tuple = (), num_processes: int = 2, port: int | None = None, quiet: bool = False,
           timeout: float | None = None, oversubscribe: bool = False) -> list:
    """Run ``function(*args)`` in ``num_processes`` new processes; return their return values, in rank order.

    The course's wrapper around what ``accelerate.notebook_launcher`` does: the
    workers are forked from this process (so ``function`` may be defined in a
    notebook) with the environment of a ``torch.distributed`` group
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``...); an
    ``Accelerator(cpu=True)`` created inside ``function`` joins that group.
    One process runs in a forked child too, with no group environment, so that
    this process never holds an ``Accelerator``.

    Unlike ``notebook_launcher``, what each worker returns comes back (through a
    pickle file, so it must pickle): element ``i`` is worker ``i``'s. Each worker
    starts from a clean Accelerate state (an ``Accelerator`` created in this
    process does not reach it) and computes with one thread. ``quiet=False``
    prints one line announcing the launch.

    Raises:

    - :class:`LaunchError` before anything starts (see :func:`check_can_launch`,
      which ``oversubscribe`` is passed to);
    - :class:`WorkerError` when ``function`` raised in a worker: its ``str()``
      is the exception and the learner's own line (no library frames, no logs
      of the launcher), and the other workers are stopped;
    - :class:`WorkerTimeout` when a worker was still running after ``timeout``
      seconds (``None``: no limit): every worker is stopped first;
    - ``KeyboardInterrupt`` when interrupted: every worker is stopped first,
      and the message says so in one line.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of arguments for function, got {type(args).__name__}")
    if timeout is not None:
        check_positive_number(timeout, "timeout")
    if port is not None:
        check_int_in_range(port, "port", 1, 65535)
    check_can_launch(num_processes, None, oversubscribe)
    _import_before_fork()
    # The rendezvous store lives here, as torch's elastic agent hosts it for torchrun and
    # notebook_launcher: hosted by worker 0, it would vanish when worker 0 returns first,
    # while the others still read from it ("Connection reset by peer").
    store, port = _rendezvous_store(port, num_processes) if num_processes > 1 else (None, None)
    if not quiet:
        print(f"Launching {num_processes} worker process{'es' if num_processes > 1 else ''}.")
    sys.stdout.flush()
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="launch-") as scratch:
        results_dir = Path(scratch)
        workers = [
            context.Process(target=_worker, args=(function, args, rank, num_processes, port, results_dir),
                            name=f"worker-{rank}")
            for rank in range(num_processes)
        ]
        try:
            _start_without_collecting(workers)
            _wait_for(workers, results_dir, timeout)
        except KeyboardInterrupt:
            _stop(workers)
            raise KeyboardInterrupt(
                f"interrupted: the {num_processes} worker process{'es' if num_processes > 1 else ''} of this launch "
                "were stopped"
            ) from None
        except BaseException:
            _stop(workers)
            raise
        finally:
            del store  # destroyed here, where its server thread runs
        return [_read_result(results_dir, rank)[1] for rank in range(num_processes)]


def _start_without_collecting(workers) -> None:
    """Start the forked ``workers`` with the garbage collector off; each worker freezes what it inherited.

    This process may hold garbage that only it can destroy: the rendezvous
    store of an earlier launch, whose destructor joins a server thread that
    exists here only. A worker that collected it would wait forever for a thread
    it never had. So the workers are forked with collection off, and each one
    first moves every object it inherited out of its collector's reach
    (``gc.freeze()``, as Python's documentation advises before a fork) and then
    turns collection back on for its own objects. Much cheaper than a full
    collection here before every launch: a kernel that imported transformers
    tracks millions of objects.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for worker in workers:
            worker.start()
    finally:
        if was_enabled:
            gc.enable()


def _rendezvous_store(port: int | None, num_processes: int):
    """Return (a ``torch.distributed.TCPStore`` server on loopback, its port), for the workers to meet through.

    On ``port`` (None: a free one), bound first: the bind is the free-port check.
    """
    listener = _meeting_socket(port)
    try:
        store = loopback_store(listener, num_processes, wait_for_workers=False)
    except BaseException:
        listener.close()
        raise
    return store, store.port


def silence_library_progress_bars() -> None:
    """Turn off the progress bars that transformers and datasets draw (loading weights, mapping a dataset).

    For worker processes: each would draw its own bar, and the bars of several
    processes interleave into noise. Affects only the process that calls it.
    """
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        import datasets

        datasets.disable_progress_bars()


def _import_before_fork():
    """Import here the modules every worker would import on its own, so that forked workers inherit them."""
    # accelerator.prepare(dataloader) imports `datasets` (about 2 s) the first time it runs.
    # Imported once before the fork, it costs nothing in each worker.
    with contextlib.suppress(ImportError):
        import datasets  # noqa: F401
    import accelerate  # noqa: F401
    # Every worker silences transformers' progress bars first (several seconds of import on a busy machine).
    import transformers.utils.logging  # noqa: F401


def _worker(function, args, rank, num_processes, port, results_dir):
    """What each forked process runs: ``function(*args)``, its value or its error saved for the launcher."""
    # Forked with collection off (see _start_without_collecting): the notebook's
    # objects, its garbage included, are never collected here; this worker's own are.
    gc.freeze()
    gc.enable()
    # The notebook's interrupt reaches every process of its group; the launcher
    # alone decides, and stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if num_processes > 1:
        os.environ.update(
            MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
            WORLD_SIZE=str(num_processes), LOCAL_WORLD_SIZE=str(num_processes), GROUP_RANK="0",
            TORCHELASTIC_USE_AGENT_STORE="True",  # meet through the launcher's store (see launch())
            **gloo_on_loopback(),
        )
    # Tells Accelerate that the threads per process were chosen on purpose (it warns otherwise).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # One thread: a forked process inherits the bookkeeping of the parent's OpenMP
    # pool but not its threads, and a worker that asked for several could wait for them forever.
    torch.set_num_threads(1)
    reset_accelerate_state()
    silence_library_progress_bars()
    try:
        value = function(*args)
    except BaseException as error:  # noqa: BLE001 - whatever the learner's code raised goes back to the launcher
        payload = pickle.dumps(("error", _describe(error, rank)))
    else:
        try:
            payload = pickle.dumps(("value", value))
        except Exception as error:  # noqa: BLE001
            payload = pickle.dumps(("error", dict(
                rank=rank, error_type=type(error).__name__,
                message=f"the function returned a value that cannot be sent back to the notebook ({error})",
            )))
    (results_dir / f"worker-{rank}.pkl").write_bytes(payload)
    sys.stdout.flush()
    sys.stderr.flush()


def _describe(error: BaseException, rank: int) -> dict:
    """Return the fields of a :class:`WorkerError` for ``error``, located at its innermost frame outside the libraries."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not _is_library_file(frame.filename)]
    where = own[-1] if own else None
    return dict(
        rank=rank, error_type=type(error).__name__, message=str(error),
        filename=where.filename if where else None, lineno=where.lineno if where else None,
        function=where.name if where else None, line=where.line if where else None,
    )


def _library_directories() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({str(Path(paths[key]).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib")}) + (
        str(PACKAGE_DIR),
    )


_LIBRARY_DIRECTORIES = _library_directories()


def _is_library_file(filename: str) -> bool:
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return resolved.startswith(_LIBRARY_DIRECTORIES)


def _wait_for(workers, results_dir: Path, timeout: float | None) -> None:
    """Wait until every worker has finished; raise the first :class:`WorkerError` or a :class:`WorkerTimeout`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        running = [worker for worker in workers if worker.exitcode is None]
        failed = [rank for rank, worker in enumerate(workers) if worker.exitcode is not None
                  and _read_result(results_dir, rank, worker.exitcode)[0] == "error"]
        if failed:
            # The others may wait forever for the one that failed (in a gradient all-reduce):
            # give them a moment to finish or fail on their own, then stop them. (Waiting on
            # no process at all would sleep the whole moment.)
            if running:
                multiprocessing.connection.wait([w.sentinel for w in running], timeout=_GRACE_SECONDS)
            finished = [rank for rank, worker in enumerate(workers) if worker.exitcode is not None]
            _stop(workers)
            # Only the workers that ended on their own tell what went wrong; the stopped ones were waiting.
            errors = [_read_result(results_dir, rank, workers[rank].exitcode) for rank in finished]
            raise next(error for kind, error in errors if kind == "error")
        if not running:
            return
        if deadline is not None and time.monotonic() >= deadline:
            _stop(workers)
            raise WorkerTimeout(timeout, len(workers))
        remaining = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        multiprocessing.connection.wait([w.sentinel for w in running], timeout=remaining)


def _read_result(results_dir: Path, rank: int, exitcode: int | None = 0):
    """Return ``("value", value)`` or ``("error", WorkerError)`` for worker ``rank``."""
    path = results_dir / f"worker-{rank}.pkl"
    if path.exists():
        kind, content = pickle.loads(path.read_bytes())
        return (kind, WorkerError(**content)) if kind == "error" else (kind, content)
    if exitcode is None:  # stopped by the launcher
        return ("stopped", None)
    how = f"was killed by signal {-exitcode}" if exitcode < 0 else f"exited with code {exitcode}"
    return ("error", WorkerError(rank, "WorkerDied", f"the process {how} without returning a result"))


def _stop(workers) -> None:
    """Stop every worker still running: SIGTERM, then SIGKILL for one that ignores it."""
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        worker.join(timeout=3)
        if worker.is_alive():
            worker.kill()
            worker.join()
