"""Settings shared by every test: offline, and a fresh Accelerate state per test."""

import os
import sys

# Captures the environment pytest started with, before anything below changes it: the
# tests start the course kernel from that one, the learner's (tests/kernel_env.py).
import kernel_env  # noqa: E402, F401  (tests/ is on sys.path: this file's folder)

# The course never downloads: make the libraries fail fast instead of trying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One OpenMP thread per test process (not per notebook kernel: those start from the
# learner's environment, tests/kernel_env.py, and the course kernelspec sets it). Two reasons:
# - several tests fork worker processes (notebook_launcher, the 2-process
#   lessons); a child forked from a parent whose OpenMP thread pool is running
#   can deadlock in its first tensor operation. Set before torch is imported, so
#   the pool is never started;
# - `make test` runs two pytest workers on a 2-core machine: one core each.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state; reset it so tests cannot leak settings (e.g. cpu=True)."""
    yield
    if "accelerate.state" not in sys.modules:
        return  # nothing imported it, so there is no state (and importing torch here costs seconds)
    from course_utils.accelerate_state import reset_accelerate_state

    reset_accelerate_state()
