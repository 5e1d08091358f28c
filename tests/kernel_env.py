"""The environment the tests start the course kernel in: the learner's, every difference named here.

A learner's lessons run in the course kernel that ``make lab`` installs (the
kernelspec named ``python3`` in this Python's prefix, ``tools/open_lab.py``),
started from their shell's environment, to which the kernelspec adds its own
variables. The tests that run lessons (the re-run test, the browser test, the
kernel tests) start that same kernelspec from the environment pytest itself was
started with, captured here before ``tests/conftest.py`` changes anything for
the test processes (OMP_NUM_THREADS).

Deliberate differences from a learner's kernel, all of them:

- ``PYTEST_*`` variables (pytest's and pytest-xdist's bookkeeping) are left out;
- ``make test`` itself starts pytest with OMP_WAIT_POLICY=PASSIVE,
  HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1: the values the course kernelspec
  sets anyway, so the kernel sees no difference;
- the kernels the re-run and kernel tests start themselves get
  ``KERNEL_ARGUMENTS``: the kernel application's own log at ERROR instead of
  WARN (kept from before; it applies to ipykernel's own messages only, not to
  Python warnings or the libraries' loggers, which the lessons' cells show);
- the browser test's JupyterLab keeps its settings, workspaces and IPython
  folder in a temporary folder (``lab_helpers.isolated_lab_env``), so nothing
  of the learner's own Jupyter set-up changes what it sees.
"""

from __future__ import annotations

import os
import sys

# Imported by tests/conftest.py before it sets anything: the environment pytest started with.
_STARTED_WITH = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}

COURSE_KERNEL_NAME = "python3"
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


def learner_env() -> dict[str, str]:
    """Return the environment a test starts a course kernel (or JupyterLab) from: a copy, the learner's."""
    return dict(_STARTED_WITH)


def course_kernel_spec():
    """Return the kernelspec a lesson asking for ``python3`` gets; fail unless it is the course's, as installed."""
    import pytest
    from jupyter_client.kernelspec import KernelSpecManager

    from tools import open_lab

    spec = KernelSpecManager().get_kernel_spec(COURSE_KERNEL_NAME)
    if spec.argv != open_lab.kernel_argv() or spec.env != open_lab.kernel_env():
        pytest.fail(f"the kernel named {COURSE_KERNEL_NAME!r} ({spec.resource_dir}) is not the course kernel as "
                    f"`make venv` installs it (argv {spec.argv}, env {spec.env}): run "
                    f"`{sys.executable} -m tools.open_lab --install-kernel`", pytrace=False)  # fmt: skip
    return spec
