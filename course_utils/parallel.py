"""Data parallelism on several processes, with or without a GPU (lesson 4).

Data parallelism runs one full copy of the model in each process. Every step,
each process trains on its own shard of the data; ``accelerator.backward``
averages the gradients across processes, so every copy takes the same
optimizer step and the copies stay identical.

This module holds what the lesson needs around that idea:

- **sharding**: which examples each process gets (:func:`shards_of_each_process`,
  :func:`batches_per_process`), computed with Accelerate's own sampler;
- **launching** from a notebook: :func:`launch` checks the usual traps
  (:func:`check_can_launch`) before calling ``accelerate.notebook_launcher``,
  and returns what each worker returned; :func:`run_command` runs the
  command-line version as a terminal would;
- **evidence**: each process describes itself in a :class:`ProcessReport`
  (:func:`report_process`), the reports are gathered in rank order
  (:func:`gather_reports`), printed once (:func:`format_reports`) and judged
  (:func:`diagnose_launch`), which names the silent failure where every worker
  trains alone;
- **equivalence**: :func:`without_dropout`, :func:`parameters_of`,
  :func:`parameter_differences` and :func:`max_parameter_difference` compare a
  run on N processes with a run on one (:data:`NOISE_ONLY_PARAMETERS` names the
  few parameters that only rounding noise moves).
"""

from __future__ import annotations

import contextlib
import gc
import io
import math
import os
import pickle
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "LaunchError",
    "NOISE_ONLY_PARAMETERS",
    "ProcessReport",
    "batches_per_process",
    "check_can_launch",
    "check_process_group",
    "diagnose_launch",
    "find_free_port",
    "format_reports",
    "gather_reports",
    "gradient_checksum",
    "launch",
    "max_parameter_difference",
    "parameter_differences",
    "parameters_of",
    "port_is_free",
    "report_process",
    "run_command",
    "shards_of_each_process",
    "silence_library_progress_bars",
    "without_dropout",
]

LOCALHOST = "127.0.0.1"


class LaunchError(RuntimeError):
    """Launching several processes would fail (or silently go wrong); the message says what to do."""


# --------------------------------------------------------------------------- sharding


def batches_per_process(num_batches: int, num_processes: int) -> int:
    """Return how many batches each process takes from a dataloader of ``num_batches`` batches.

    With Accelerate's defaults (``split_batches=False``, ``even_batches=True``)
    process ``i`` takes batches ``i``, ``i + N``, ``i + 2N`` ...; when
    ``num_batches`` is not a multiple of ``N`` the last round is completed with
    examples from the start of the data, so every process takes the same number
    of steps: ``ceil(num_batches / N)``.
    """
    _check_positive_int(num_batches, "num_batches")
    _check_positive_int(num_processes, "num_processes")
    return math.ceil(num_batches / num_processes)


def shards_of_each_process(
    num_examples: int, batch_size: int, num_processes: int, split_batches: bool = False
) -> list[list[list[int]]]:
    """Return the example indices each process trains on: ``shards[process][step]`` is a list of ints.

    Computed with Accelerate's own ``BatchSamplerShard`` over the examples in
    order ``0 .. num_examples - 1`` (a shuffled dataloader shards its shuffled
    order the same way). With ``split_batches=False`` (the default) each process
    takes whole batches of ``batch_size`` in turn; with ``split_batches=True``
    every batch of ``batch_size`` is cut into ``num_processes`` equal pieces.
    """
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    _check_positive_int(num_examples, "num_examples")
    _check_positive_int(batch_size, "batch_size")
    _check_positive_int(num_processes, "num_processes")
    if split_batches and batch_size % num_processes:
        raise ValueError(
            f"with split_batches=True, batch_size must be a multiple of num_processes, "
            f"got batch_size={batch_size} and num_processes={num_processes}"
        )
    batches = BatchSampler(SequentialSampler(range(num_examples)), batch_size=batch_size, drop_last=False)
    return [
        [list(batch) for batch in BatchSamplerShard(batches, num_processes, index, split_batches=split_batches)]
        for index in range(num_processes)
    ]


# --------------------------------------------------------------------------- launching from a notebook


def port_is_free(port: int, host: str = LOCALHOST) -> bool:
    """Return True if nothing on this machine listens on TCP ``port`` of ``host``."""
    _check_port(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR, as torch.distributed's own server sets it: a port left in
        # TIME_WAIT by a finished run is usable and must not count as busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port of ``host`` that is free right now (the operating system picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_can_launch(num_processes: int, port: int | None = None) -> int:
    """Check that ``num_processes`` workers can start from this Python process; return the port to use.

    Raises :class:`LaunchError`, with what to do, when:

    - an ``Accelerator`` (or any Accelerate state) already exists here: the
      workers are forked copies of this process and must create their own;
    - bitsandbytes is imported: it may initialise a GPU on import, so
      ``notebook_launcher`` refuses to fork;
    - ``num_processes`` is more than this machine's CPU cores (``os.cpu_count()``);
    - ``port`` is given and busy (a previous run may still hold it).

    With ``port=None``, a port the operating system reports free is used (not
    torch's default 29500: two launches at the same time would both pick it).
    """
    _check_positive_int(num_processes, "num_processes")
    if port is not None:
        _check_port(port)
    from accelerate.state import AcceleratorState, PartialState

    if AcceleratorState._shared_state or PartialState._shared_state:
        raise LaunchError(
            "An Accelerator already exists in this Python process (a notebook cell created one). The "
            "workers would inherit it and could not form their own group. Restart the kernel "
            "(Kernel > Restart Kernel), and create the Accelerator only inside the function you launch."
        )
    if "bitsandbytes" in sys.modules:
        raise LaunchError(
            "bitsandbytes is imported in this Python process, and Accelerate refuses to fork workers after it "
            "(it may initialise a GPU on import). Restart the kernel, and import bitsandbytes only inside "
            "the function you launch."
        )
    cores = os.cpu_count() or 1
    if num_processes > cores:
        raise LaunchError(
            f"num_processes={num_processes} is more than the {cores} CPU cores of this machine: the workers "
            f"would take turns on the cores and every step would wait for the slowest. "
            f"Use num_processes <= {cores}."
        )
    if port is None:
        return find_free_port()
    if not port_is_free(port):
        raise LaunchError(
            f"Port {port} is busy: another program (perhaps an earlier run that has not finished) listens on "
            f"it, and the workers could not meet there. Pass port={find_free_port()}, which is free now, "
            f"or port=None to let launch() pick one."
        )
    return port


def launch(function, args: tuple = (), num_processes: int = 2, port: int | None = None, quiet: bool = False) -> list:
    """Run ``function(*args)`` in ``num_processes`` new processes; return their return values, in worker order.

    Several processes start with ``accelerate.notebook_launcher``, after
    :func:`check_can_launch`. The workers are forked from this process, so
    ``function`` may be defined in the notebook. Each worker computes with one
    thread: a forked process inherits the bookkeeping of this process's OpenMP
    thread pool but not its threads, and a worker that asked for several could
    wait for them forever. One process also runs in a forked child, not here,
    so that this process never holds an ``Accelerator`` (which would stop
    every later launch).

    Whatever each worker returns comes back through a temporary file
    (so it must pickle): element ``i`` of the list is worker ``i``'s.
    ``quiet=True`` leaves out the line that announces the launch.
    """
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of arguments for function, got {type(args).__name__}")
    port = check_can_launch(num_processes, port)
    _import_before_fork()
    # An earlier launch leaves torch.distributed objects behind as garbage (its
    # rendezvous store and the store's server thread). Destroy them here, where
    # that thread exists: a forked worker that collected them would wait forever
    # for a thread it never had.
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="launch-") as results_dir:
        worker = _worker(function, Path(results_dir), sys.stdout)
        # OMP_NUM_THREADS tells Accelerate that the threads per process were chosen on purpose
        # (otherwise each worker warns that it picks a number itself, more than one on a big machine).
        with _environment(OMP_NUM_THREADS="1"):
            if num_processes == 1:
                _run_in_child(worker, args)
            else:
                _notebook_launch(worker, args, num_processes, port, quiet)
        return [_read_result(Path(results_dir), rank) for rank in range(num_processes)]


def _worker(function, results_dir: Path, stdout):
    """Return what each launched process runs: ``function(*args)``, its return value saved for the launcher."""

    def run_and_save(*args):
        # The launcher may have filtered this process's stdout; the worker prints to the real one.
        sys.stdout = stdout
        # One thread: the parent's OpenMP threads did not survive the fork (see launch()).
        torch.set_num_threads(1)
        silence_library_progress_bars()
        result = function(*args)
        rank = int(os.environ.get("RANK", "0"))
        with open(results_dir / f"worker-{rank}.pkl", "wb") as file:
            pickle.dump(result, file)
        sys.stdout.flush()

    # torch's elastic launcher names the workers after the function in its messages.
    run_and_save.__name__ = getattr(function, "__name__", "function")
    return run_and_save


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


def _notebook_launch(worker, args, num_processes, port, quiet):
    from accelerate import notebook_launcher

    # Before any worker looks, notebook_launcher guesses the device type and,
    # on a machine without a GPU, announces "Launching training on 2 CUDAs".
    # That line is false here, so it is replaced by one that is true.
    guessed_cuda = not torch.cuda.is_available()
    if guessed_cuda and not quiet:
        print(f"Launching {num_processes} worker processes; each one's Accelerator decides its device.")
    stdout = _DropLines(sys.stdout, "Launching training on") if guessed_cuda else sys.stdout
    with contextlib.redirect_stdout(stdout):
        notebook_launcher(worker, args=args, num_processes=num_processes, use_port=str(port))
    if isinstance(stdout, _DropLines) and stdout.pending:
        sys.stdout.write(stdout.pending)  # a last line without its newline yet


def _run_in_child(worker, args):
    import torch.multiprocessing as mp

    # Fork, as notebook_launcher does: the function may be defined in a notebook.
    mp.start_processes(_call_worker, args=(worker, args), nprocs=1, start_method="fork")


def _call_worker(index, worker, args):
    worker(*args)


class _DropLines(io.TextIOBase):
    """A text stream that forwards everything to ``stream`` except lines starting with ``prefix``."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.pending = stream, prefix, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not line.startswith(self.prefix):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def _environment(**variables):
    """Set environment variables for the duration of a ``with`` block (ones already set are kept)."""
    added = {name: value for name, value in variables.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _read_result(results_dir: Path, rank: int):
    path = results_dir / f"worker-{rank}.pkl"
    if not path.exists():
        raise LaunchError(f"worker {rank} finished without returning a result (no {path.name} was written)")
    with open(path, "rb") as file:
        return pickle.load(file)


# --------------------------------------------------------------------------- the command line, from a notebook

# The programs a lesson types in a terminal, run with this Python environment's own copies.
_PROGRAMS = {
    "python": [sys.executable],
    "accelerate": [sys.executable, "-m", "accelerate.commands.accelerate_cli"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def run_command(command: str, cwd: str | Path | None = None, timeout: float = 600) -> str:
    """Run ``command`` as a terminal in the repository would; print and return its output (stdout and stderr).

    ``command`` starts with ``python``, ``accelerate`` or ``torchrun``, which run
    from this notebook's Python environment (its ``bin`` may not be on ``PATH``).
    The hub libraries are told they are offline. Raises ``RuntimeError`` with
    the output if the command fails.
    """
    import shlex
    import subprocess

    from course_utils import REPO_DIR

    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"command must be a non-empty string, got {command!r}")
    program, *arguments = shlex.split(command)
    if program not in _PROGRAMS:
        raise ValueError(f"command must start with one of {sorted(_PROGRAMS)}, got {program!r}")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    completed = subprocess.run(
        _PROGRAMS[program] + arguments, cwd=cwd or REPO_DIR, env=environment, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"`{command}` failed with exit code {completed.returncode}:\n{completed.stdout[-4000:]}")
    print(completed.stdout, end="")
    return completed.stdout


# --------------------------------------------------------------------------- evidence from each process


@dataclass(frozen=True)
class ProcessReport:
    """What one worker process saw. Gathered from every process, the reports show whether they trained together.

    - ``worker``: the number the launcher gave this process (``RANK`` in its environment), 0 .. N-1;
    - ``process_index``, ``num_processes``, ``distributed_type``: its rank, the group size and the
      mode, as its ``Accelerator`` sees them (``"MULTI_CPU"`` for processes over gloo, ``"NO"`` alone);
    - ``num_batches``: batches this process trained on per epoch (its shard);
    - ``last_loss``: the loss of its last batch (each shard has its own);
    - ``gradient_checksum``: the sum of all its gradient elements after the last ``accelerator.backward``.
    """

    worker: int
    process_index: int
    num_processes: int
    distributed_type: str
    num_batches: int
    last_loss: float
    gradient_checksum: float


def gradient_checksum(model: torch.nn.Module) -> float:
    """Return the sum of every gradient element of ``model`` (float64); parameters without gradient count 0.

    Two processes whose gradients are equal give equal sums; gradients that
    differ almost surely give different sums.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.grad.double().sum().item() for p in model.parameters() if p.grad is not None)


def report_process(accelerator, model: torch.nn.Module, num_batches: int, last_loss: float) -> ProcessReport:
    """Return this process's :class:`ProcessReport`, for a ``model`` just trained with ``accelerator``."""
    _check_positive_int(num_batches, "num_batches")
    return ProcessReport(
        worker=int(os.environ.get("RANK", "0")),
        process_index=accelerator.process_index,
        num_processes=accelerator.num_processes,
        distributed_type=accelerator.distributed_type.value,
        num_batches=num_batches,
        last_loss=float(last_loss),
        gradient_checksum=gradient_checksum(model),
    )


def gather_reports(accelerator, report: ProcessReport) -> list[ProcessReport]:
    """Return the reports of every process in the group, in rank order (the same list on every process).

    A collective operation: every process of the group must call it. A process
    that is alone (``num_processes == 1``) gets its own report only.
    """
    from accelerate.utils import gather_object

    if not isinstance(report, ProcessReport):
        raise TypeError(f"report must be a ProcessReport, got {type(report).__name__}")
    reports = gather_object([report]) if accelerator.num_processes > 1 else [report]
    return sorted(reports, key=lambda r: r.process_index)


def format_reports(reports: list[ProcessReport]) -> str:
    """Return the reports as a table, one line per process, in the order given."""
    _check_reports(reports)
    lines = [
        f"{'worker':>6}  {'rank':>4}  {'world size':>10}  {'mode':<10}  {'batches':>7}  "
        f"{'last loss':>9}  {'gradient checksum':>17}"
    ]
    for r in reports:
        lines.append(
            f"{r.worker:>6}  {r.process_index:>4}  {r.num_processes:>10}  {r.distributed_type:<10}  "
            f"{r.num_batches:>7}  {r.last_loss:>9.4f}  {r.gradient_checksum:>17.9f}"
        )
    return "\n".join(lines)


def diagnose_launch(reports: list[ProcessReport], num_processes: int) -> str:
    """Return a plain-language verdict on a launch of ``num_processes`` workers, from their reports.

    The cases: one process alone, as launched; the workers formed one group of
    ``num_processes`` and their gradients agree (data parallelism works); every
    worker is alone (the silent failure: usually ``Accelerator()`` without
    ``cpu=True`` on a machine without a GPU); anything else (a group of the
    wrong size, gradients that disagree).
    """
    _check_reports(reports)
    _check_positive_int(num_processes, "num_processes")
    if len(reports) != num_processes:
        return f"Expected {num_processes} reports, one per worker, but got {len(reports)}."
    sizes = sorted({r.num_processes for r in reports})
    modes = sorted({r.distributed_type for r in reports})
    checksums = [r.gradient_checksum for r in reports]
    spread = max(checksums) - min(checksums)
    if num_processes == 1 and sizes == [1]:
        return (
            f"One process (mode {modes[0]}): no group to form and no gradient to share; it trained on "
            f"all {reports[0].num_batches} batches per epoch."
        )
    if num_processes > 1 and sizes == [1]:
        batches = sorted({r.num_batches for r in reports})
        return (
            f"Silent failure: {num_processes} workers ran, but each one's Accelerator says num_processes=1 "
            f"(mode {', '.join(modes)}). They never formed a group: each trained alone on the whole dataset "
            f"({', '.join(map(str, batches))} batches per epoch), and no gradient was shared. Their gradients agree "
            f"(checksums differ by {spread:.1e}) only because each repeated the same work from the same seed: "
            f"{num_processes} times the compute for the training of one. On a machine without a GPU, an "
            f"Accelerator joins the other processes only when it is allowed to run on the CPU."
        )
    if sizes == [num_processes] and sorted(r.process_index for r in reports) == list(range(num_processes)):
        shares = sorted({r.num_batches for r in reports})
        agree = spread <= 1e-6 * max(1.0, max(abs(c) for c in checksums))
        verdict = "agree" if agree else "DISAGREE"
        return (
            f"Data parallel: the {num_processes} workers formed one group (mode {', '.join(modes)}), each trained "
            f"on its own shard ({', '.join(map(str, shares))} batches per epoch), and their gradients after "
            f"accelerator.backward {verdict} (checksums differ by {spread:.1e})."
        )
    return (
        f"Unexpected: {num_processes} workers were launched, but they report group sizes {sizes} and modes {modes}. "
        f"Every worker should create its Accelerator the same way, inside the launched function."
    )


def check_process_group(accelerator) -> None:
    """Raise ``LaunchError`` if this process was launched as one of several but its Accelerator is alone.

    Launchers (torchrun, ``accelerate launch``, ``notebook_launcher``) set
    ``WORLD_SIZE`` to the number of processes. An Accelerator that sees
    ``num_processes == 1`` anyway would train silently alone on all the data.
    """
    # `accelerate launch --cpu --num_processes N` (Accelerate 1.x) starts this one
    # process and leaves the others to MPI: it sets the rendezvous address for N
    # processes but no WORLD_SIZE. Training would go on alone, so say so.
    if (
        os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
        and "MASTER_PORT" in os.environ
        and "WORLD_SIZE" not in os.environ
        and "OMPI_COMM_WORLD_SIZE" not in os.environ  # started by mpirun: a real group
        and "PMI_SIZE" not in os.environ
    ):
        raise LaunchError(
            "`accelerate launch --cpu --num_processes N` started only this one process: Accelerate's CPU "
            "launcher expects mpirun (with a hostfile from `accelerate config`) to start the others. "
            "To start N CPU processes with torch's launcher instead: accelerate launch --multi_gpu "
            "--num_processes N --num_machines 1 --mixed_precision no --dynamo_backend no -m course_utils.train "
            "--cpu  (or: torchrun --nproc_per_node N -m course_utils.train --cpu)."
        )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes == 1:
        raise LaunchError(
            f"This process is one of {launched} launched ones (WORLD_SIZE={launched}), but its Accelerator is "
            f"alone (num_processes=1, mode {accelerator.distributed_type.value}): every process would train on "
            f"all the data, without sharing gradients. Without a GPU, create the Accelerator with cpu=True "
            f"(on the command line: pass --cpu to the training script)."
        )


# --------------------------------------------------------------------------- equivalence


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set the probability of every ``torch.nn.Dropout`` in ``model`` to 0; return the same model.

    Dropout draws a random mask in each process from that process's own random
    generator, so N processes cannot draw the masks one process would: only
    without dropout can their training be compared number for number.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def parameters_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return a copy of every parameter of ``model`` (name -> detached CPU float32 tensor)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return {name: p.detach().to("cpu", torch.float32).clone() for name, p in model.named_parameters()}


NOISE_ONLY_PARAMETERS = ("attention.k_lin.bias",)
"""Name parts of DistilBERT parameters whose gradient is zero in exact arithmetic.

The bias of the attention keys adds the same number to every score of a
query, and softmax ignores a constant added to all its inputs. So its gradient
is rounding noise (about 1e-10), and Adam, which divides each gradient by its
own running scale, turns that noise into steps of ordinary size. Two runs that
differ only in rounding disagree on these parameters, and only on these.
"""


def parameter_differences(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> dict[str, float]:
    """Return, for each parameter name, the largest absolute difference between its elements in ``first`` and ``second``.

    Both dicts must have the same names and shapes, as :func:`parameters_of` gives
    for two copies of one architecture.
    """
    if not isinstance(first, dict) or not isinstance(second, dict):
        raise TypeError("first and second must be dicts of name -> tensor, as parameters_of returns")
    if first.keys() != second.keys():
        differing = sorted(set(first) ^ set(second))[:3]
        raise ValueError(f"first and second must have the same parameter names; they differ on {differing}")
    differences = {}
    for name, tensor in first.items():
        if tensor.shape != second[name].shape:
            raise ValueError(
                f"parameter {name!r} has shape {tuple(tensor.shape)} in first and {tuple(second[name].shape)} in second"
            )
        differences[name] = (tensor.float() - second[name].float()).abs().max().item()
    return differences


def max_parameter_difference(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], skip: tuple[str, ...] = ()
) -> float:
    """Return the largest absolute difference between matching elements of two parameter dicts.

    Parameters whose name contains one of the strings in ``skip`` are left out
    (e.g. :data:`NOISE_ONLY_PARAMETERS`).
    """
    if isinstance(skip, str) or not all(isinstance(part, str) for part in skip):
        raise TypeError(f"skip must be a tuple of strings, got {skip!r}")
    differences = parameter_differences(first, second)
    kept = [gap for name, gap in differences.items() if not any(part in name for part in skip)]
    return max(kept, default=0.0)


# --------------------------------------------------------------------------- argument checks


def _check_positive_int(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_port(port) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an int from 1 to 65535, got {port!r}")


def _check_reports(reports) -> None:
    if not isinstance(reports, (list, tuple)) or not reports or not all(isinstance(r, ProcessReport) for r in reports):
        raise TypeError("reports must be a non-empty list of ProcessReport, as gather_reports or launch return")
