"""Settings shared by every test: offline, a fresh Accelerate state per test, and the order tests are handed out."""

import os
import signal
import sys
from pathlib import Path

# Captures the environment pytest started with, before anything below changes it: the
# tests start the course kernel from that one, the learner's (tests/kernel_env.py).
import kernel_env  # noqa: E402, F401  (tests/ is on the path: pyproject.toml's pythonpath)

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
from hard_limits import fail_after  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state; reset it so tests cannot leak settings (e.g. cpu=True)."""
    yield
    if "accelerate.state" not in sys.modules:
        return  # nothing imported it, so there is no state (and importing torch here costs seconds)
    from course_utils.accelerate_state import reset_accelerate_state

    reset_accelerate_state()


# A test that launches processes and waits longer than this has hung (the slowest takes about a
# minute on a loaded 2-core machine): fail it, which stops its workers (launcher.launch stops them on
# any exception), rather than hang make test until CI gives up. torch 2.13's gloo teardown can
# deadlock a worker (course_utils.sharding.gloo_group says how); most launches pass no timeout.
FORKING_TEST_LIMIT_SECONDS = 600
EXERCISES_DIR = Path(__file__).resolve().parent / "exercises"


@pytest.fixture(autouse=True)
def forking_tests_do_not_hang(request):
    """Fail a `forks` test that runs past the limit (SIGALRM in pytest's main thread, where launches wait)."""
    # Not the exercise checks': their own time limit takes SIGALRM when nobody else holds it.
    checks_exercises = EXERCISES_DIR in request.node.path.parents
    if request.node.get_closest_marker("forks") is None or checks_exercises or not hasattr(signal, "SIGALRM"):
        yield
        return
    with fail_after(FORKING_TEST_LIMIT_SECONDS, "a launched process hung"):
        yield


BROWSER_DIR = Path(__file__).resolve().parent / "browser"


def pytest_collection_modifyitems(config, items):
    """Longest first, so that make test's two workers finish together.

    make test hands whole modules (a re-run lesson: a class) to whichever of its two
    pytest-xdist workers is free, in this order (--no-loadscope-reorder): the re-run
    lessons (`rerun`, minutes each), the browser tests (their `slow` module first), the
    other `slow` modules, then the rest; each group in the order pytest collected it
    (by folder and file name). A sort by markers, not a list of files: a new test joins
    the rest, or its group by its marker.
    """
    items.sort(key=handed_out_order)


def handed_out_order(item) -> tuple[bool, bool, bool]:
    """Return the sort key of one test: False sorts first (a re-run lesson, a browser test, a slow module)."""
    return (
        item.get_closest_marker("rerun") is None,
        BROWSER_DIR not in item.path.parents,
        item.get_closest_marker("slow") is None,
    )
