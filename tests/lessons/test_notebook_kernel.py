"""The course kernel shows no library noise on any machine: each machine-dependent branch forced here.

What a library prints at import can depend on the CPU (bitsandbytes on AVX512-BF16)
or on the learner's environment (a variable an old guide told them to set). The
machine running these tests may not take those branches, so each test forces one
in the course kernel as ``make lab`` installs it (``tools/course_kernel.py``),
started from the learner's environment (``tests/kernel_env.py``), and asserts that
a lesson's first cell and the course's libraries print nothing on stderr.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from jupyter_client.manager import start_new_kernel

from course_utils import REPO_DIR
from kernel_env import COURSE_KERNEL_NAME, KERNEL_ARGUMENTS, course_kernel_spec, learner_env

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
# Every library the course imports, and what they import at import time.
COURSE_LIBRARIES = "import torch, transformers, peft, bitsandbytes, accelerate, datasets"


class CourseKernel:
    """A course kernel started from ``env``; ``run(code)`` returns (stdout, stderr, error or None)."""

    def __init__(self, env: dict[str, str]):
        course_kernel_spec()
        self.manager, self.client = start_new_kernel(
            kernel_name=COURSE_KERNEL_NAME, env=env, cwd=str(NOTEBOOKS_DIR),
            extra_arguments=KERNEL_ARGUMENTS,
        )  # fmt: skip

    def run(self, code: str, timeout_s: float = 300) -> tuple[str, str, str | None]:
        streams = {"stdout": "", "stderr": ""}
        errors = []

        def keep(message):
            if message["msg_type"] == "stream":
                streams[message["content"]["name"]] += message["content"]["text"]
            elif message["msg_type"] == "error":
                errors.append(f"{message['content']['ename']}: {message['content']['evalue']}")

        self.client.execute_interactive(code, timeout=timeout_s, output_hook=keep)
        return streams["stdout"], streams["stderr"], errors[0] if errors else None

    def close(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def first_code_cell(lesson_prefix: str) -> str:
    """Return the source of the first code cell of the learner copy of lesson ``lesson_prefix`` ("01")."""
    (path,) = sorted(NOTEBOOKS_DIR.glob(f"{lesson_prefix}_*.ipynb"))
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    source = next(cell["source"] for cell in cells if cell["cell_type"] == "code")
    return "".join(source) if isinstance(source, list) else source


# Makes bitsandbytes' CPU-feature probe report AVX512-BF16 whatever this CPU has: when
# bitsandbytes.functional is first imported, its has_avx512bf16() is replaced before
# bitsandbytes/backends/cpu/ops.py imports it (and branches on it, at import).
FORCE_AVX512_BF16 = textwrap.dedent('''
    import importlib.abc, importlib.machinery, sys
    assert "bitsandbytes" not in sys.modules, "imported before the probe could be forced"

    class _ReportAvx512Bf16(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "bitsandbytes.functional":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                module.has_avx512bf16 = lambda: True

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _ReportAvx512Bf16())
    del _ReportAvx512Bf16
''')
# The branch was taken: ops.py defines this name only inside `if has_avx512bf16():`.
AVX512_BF16_BRANCH_TAKEN = (
    "print(hasattr(sys.modules['bitsandbytes.backends.cpu.ops'], 'gemm_4bit_forward_kernel'))"
)


# Lesson 1's first cell (issue 22 saw the line under the first cell of lessons 1, 2, 3 and 5);
# then every library the course imports, for the other lessons (a kernel start costs ~20 CPU-s).
@pytest.mark.parametrize("lesson", ["01"])
def test_on_a_cpu_with_avx512_bf16_a_lessons_first_cell_prints_nothing_on_stderr(lesson):
    # Issue 22: on AMD Zen 4 / Intel Sapphire Rapids, bitsandbytes logged "Failed to load CPU
    # gemm_4bit_forward from kernels-community" in red under the first cell of lessons 1, 2, 3, 5.
    kernel = CourseKernel(learner_env())
    try:
        assert kernel.run(FORCE_AVX512_BF16) == ("", "", None)
        for code in (first_code_cell(lesson), COURSE_LIBRARIES):
            out, err, error = kernel.run(code)
            assert error is None, error
            assert err == "", f"`{code.splitlines()[0]}` printed on stderr:\n{err}"
        assert kernel.run(AVX512_BF16_BRANCH_TAKEN)[0].strip() == "True", "the forced branch was not taken"
    finally:
        kernel.close()


def test_with_the_deprecated_hf_transfer_variable_set_the_libraries_print_nothing_on_stderr():
    # huggingface_hub warns at import when HF_HUB_ENABLE_HF_TRANSFER is set (older guides set it).
    kernel = CourseKernel({**learner_env(), "HF_HUB_ENABLE_HF_TRANSFER": "1"})
    try:
        out, err, error = kernel.run(COURSE_LIBRARIES + "\nimport os, huggingface_hub.constants as c\n"
                                     "print(c._is_true(os.environ.get('HF_HUB_ENABLE_HF_TRANSFER')) "
                                     "and not c.HF_XET_HIGH_PERFORMANCE)")  # fmt: skip
        assert error is None, error
        assert err == "", err
        assert out.strip() == "True", "the variable did not reach the kernel: the branch was not taken"
    finally:
        kernel.close()


def test_accelerates_notebook_launcher_on_cpu_workers_prints_nothing_on_stderr():
    # Issue 22: in the kernel make lab installs, lesson 6's notebook_launcher cell printed
    # "OMP_NUM_THREADS/MKL_NUM_THREADS unset" from each worker; the tests never saw it because
    # their own processes set OMP_NUM_THREADS. A learner's shell does not.
    env = {name: value for name, value in learner_env().items() if name != "OMP_NUM_THREADS"}
    kernel = CourseKernel(env)
    try:
        out, err, error = kernel.run(textwrap.dedent('''
            from accelerate import Accelerator, notebook_launcher
            from course_utils import launcher

            def report():
                accelerator = Accelerator(cpu=True)
                print(f"process {accelerator.process_index} of {accelerator.num_processes}", flush=True)

            notebook_launcher(report, num_processes=2, use_port=str(launcher.find_free_port()))
        '''), timeout_s=240)  # fmt: skip
        assert error is None, error
        assert "process 1 of 2" in out, out
        assert err == "", err
    finally:
        kernel.close()
