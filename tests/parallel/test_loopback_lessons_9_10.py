"""Every launch of lessons 9 and 10 and of step_time_checks listens on loopback only: watched from /proc while it runs.

test_loopback.py shows that ``launcher.launch`` (which ``parallel.launch`` is)
keeps its store and a gloo group's sockets on loopback. The functions these
lessons launch open more than one group's sockets (tensor-parallel rows, pipeline
stages, the device meshes, Accelerate's own set-up in lesson 10's script and in
``meshes.accelerate_parallelism_config``), so each is launched here as its
lesson launches it, on smaller inputs, while a thread reads what the whole
process tree (this process, which hosts the store, and every worker) listens
on, every 20 ms until the launch returns. Every socket seen must be on a
loopback address, and some worker's gloo sockets must have been seen: a watch
that saw only the store would prove nothing about the workers.
"""

import os
import socket
import threading
import time

import psutil
import pytest

from course_utils import (
    experts, launch_files, meshes, parallel, pipeline, ring_attention, step_time_checks, tensor_parallel, your_run,
)
from listening_sockets import is_loopback, listening_sockets

# They launch worker processes: make test runs the `forks` tests in a pytest process of their own.
pytestmark = pytest.mark.forks

TIMEOUT_S = 300


class ListeningWatch:
    """While the block runs: every listening TCP socket of this process and its descendants, read every 20 ms."""

    def __init__(self):
        self.seen: dict[tuple, dict] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._done.is_set():
            try:
                for found in listening_sockets(os.getpid()):
                    self.seen[found["address"], found["port"], found["pid"]] = found
            except (psutil.Error, OSError):  # a worker left while its sockets were read: read again
                pass
            self._done.wait(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._done.set()
        self._thread.join()
        return False


def _listen_on_every_interface_a_moment():
    """In a launched process: listen on every interface (port 0: the system picks one) for a second, then close."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        time.sleep(1.0)


def test_the_watch_sees_a_worker_listening_on_every_interface():
    with ListeningWatch() as watch:
        parallel.launch(_listen_on_every_interface_a_moment, num_processes=2, quiet=True, timeout=TIMEOUT_S)
    outside = [found for found in watch.seen.values() if not is_loopback(found["address"])]
    assert {found["pid"] for found in outside} - {os.getpid()}, watch.seen


def lesson_10_run(tmp_path):
    """Lesson 10's launch of its script: the scaled-down model, sharded by the script on CPU processes."""
    small = launch_files.scaled_down_config("Llama 3.1 8B", tmp_path)
    return your_run.RunConfig(str(small), "zero3", batch_size=2, seq_len=32, steps=1, cpu=True),


LAUNCHES = {
    # lesson 9, section by section
    "tensor_parallel.run_split": (tensor_parallel.run_split, lambda tmp_path: (), 2),
    "pipeline.run_pipeline": (pipeline.run_pipeline, lambda tmp_path: ((("GPipe", 2), ("1F1B", 2)), 1), 2),
    "pipeline.run_torch_schedule": (pipeline.run_torch_schedule, lambda tmp_path: (), 2),
    "ring_attention.context_parallel_run": (ring_attention.context_parallel_run, lambda tmp_path: ((0,), 64), 2),
    "experts.expert_parallel_run": (experts.expert_parallel_run, lambda tmp_path: ((0,), (0.0,)), 2),
    "meshes.run_mesh": (meshes.run_mesh, lambda tmp_path: (["FSDP x TP"],), 4),
    "meshes.accelerate_parallelism_config": (meshes.accelerate_parallelism_config, lambda tmp_path: (2, 2), 4),
    # lesson 10
    "your_run.training_function": (your_run.training_function, lesson_10_run, 2),
    # the time model's CPU measurements
    "step_time_checks.measure_cpu_steps": (step_time_checks.measure_cpu_steps, lambda tmp_path: (4, 1), 2),
}


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_the_launch_listens_on_loopback_only(name, tmp_path):
    function, arguments, num_processes = LAUNCHES[name]
    with ListeningWatch() as watch:
        parallel.launch(function, arguments(tmp_path), num_processes=num_processes, quiet=True,
                        oversubscribe=num_processes > 2, timeout=TIMEOUT_S)
    sockets = list(watch.seen.values())
    outside = [found for found in sockets if not is_loopback(found["address"])]
    assert not outside, f"{name}: listening outside loopback: {outside}"
    workers = {found["pid"] for found in sockets} - {os.getpid()}
    assert workers, f"{name}: no worker's listening socket was seen (only {sockets})"
