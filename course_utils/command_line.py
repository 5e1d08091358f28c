"""Command lines run from a notebook, and a command-line run that finds itself alone (lessons 6 and 7).

- :func:`run_command` runs a command line (``python``, ``accelerate``,
  ``torchrun``) as a terminal would, its launches on loopback only, and stops
  everything it started when interrupted or too slow.
- :func:`check_process_group` stops a command-line run whose processes were
  launched together but whose Accelerator is alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from course_utils.launcher import LaunchError
from course_utils.loopback import gloo_on_loopback
from course_utils.validation import check_accelerator, check_existing_directory, check_positive_number

__all__ = ["check_process_group", "run_command"]


# --------------------------------------------------------------------------- the command line, from a notebook

# The programs a lesson types in a terminal, run with this Python environment's own copies;
# the two launchers through course_utils.loopback, so that the store their agent hosts
# listens on loopback only (torch's listens on every interface).
_PROGRAMS = {
    "python": [sys.executable],
    "accelerate": [sys.executable, "-m", "course_utils.loopback", "accelerate.commands.accelerate_cli"],
    "torchrun": [sys.executable, "-m", "course_utils.loopback", "torch.distributed.run"],
}


def run_command(command: str, cwd: str | Path | None = None, timeout: float = 600) -> str:
    """Run ``command`` as a terminal in the repository would; print and return its output (stdout and stderr).

    ``command`` starts with ``python``, ``accelerate`` or ``torchrun``, which run
    from this notebook's Python environment (its ``bin`` may not be on ``PATH``).
    The hub libraries are told they are offline; the rendezvous store and
    gloo's sockets of a launch listen on loopback only
    (``course_utils.loopback``). Raises ``RuntimeError`` with the
    output if the command fails. Interrupted, or still running after ``timeout``
    seconds, it stops the command and every process the command started (the
    workers of ``accelerate launch`` included), and says so in one line.
    """
    import shlex
    import subprocess

    from course_utils import REPO_DIR

    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"command must be a non-empty string, got {command!r}")
    check_positive_number(timeout, "timeout")
    if cwd is not None:
        check_existing_directory(cwd, "cwd")
    program, *arguments = shlex.split(command)
    if program not in _PROGRAMS:
        raise ValueError(f"command must start with one of {sorted(_PROGRAMS)}, got {program!r}")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **gloo_on_loopback()}
    # A session of its own: the notebook's interrupt does not reach the command
    # half-way; this function stops it, and all it started, in order.
    process = subprocess.Popen(
        _PROGRAMS[program] + arguments, cwd=cwd or REPO_DIR, env=environment, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except KeyboardInterrupt:
        stopped = _stop_process_tree(process)
        raise KeyboardInterrupt(f"interrupted: `{command}` and the {stopped - 1} processes it started were stopped") from None
    except subprocess.TimeoutExpired:
        stopped = _stop_process_tree(process)
        raise RuntimeError(
            f"`{command}` was still running after {timeout:g} s; it and the {stopped - 1} processes it started "
            "were stopped"
        ) from None
    if process.returncode != 0:
        raise RuntimeError(f"`{command}` failed with exit code {process.returncode}:\n{output[-4000:]}")
    print(output, end="")
    return output


def _stop_process_tree(process) -> int:
    """Stop ``process`` and all its descendants (SIGTERM, then SIGKILL after 5 s); return how many there were."""
    import psutil

    try:
        root = psutil.Process(process.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    # Descendants first: torch's elastic agent would otherwise restart or report them.
    for member in reversed(tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(tree, timeout=5)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=5)
    process.wait()
    return len(tree)


# --------------------------------------------------------------------------- a command-line run that is alone


def check_process_group(accelerator) -> None:
    """Raise ``LaunchError`` if this process was launched as one of several but its Accelerator is alone.

    Launchers (torchrun, ``accelerate launch``, ``notebook_launcher``) set
    ``WORLD_SIZE`` to the number of processes. An Accelerator that sees
    ``num_processes == 1`` anyway would train silently alone on all the data.
    """
    check_accelerator(accelerator)
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
