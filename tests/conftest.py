"""Settings shared by every test: offline, and a fresh Accelerate state per test."""

import os

# The course never downloads: make the libraries fail fast instead of trying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import pytest  # noqa: E402
import torch  # noqa: E402

# One compute thread in the test process. Several tests fork worker processes
# (notebook_launcher, the 2-process lessons); a child forked from a parent whose
# OpenMP thread pool is running can deadlock in its first tensor operation.
# Set before any tensor operation, so the pool is never started. Not through
# the OMP_NUM_THREADS variable: the notebook kernels that nbval and the browser
# test start inherit the environment, and they should compute as a learner's
# kernel does, on every core.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state; reset it so tests cannot leak settings (e.g. cpu=True)."""
    yield
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    PartialState._reset_state()
