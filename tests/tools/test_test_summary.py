"""make test's last lines: one summary of its two pytest runs (tools/test_summary.py, called by the Makefile)."""

import shutil
import subprocess

import pytest

from tools import test_summary

POOL_FAILED = """\
tests/memory/test_planner.py ....F...
=================================== FAILURES ===================================
___ test_a_plan ___
E   AssertionError
=========================== short test summary info ============================
FAILED tests/memory/test_planner_families.py::test_a_qlora_model - RuntimeError: shape '[32, 0]' is invalid
ERROR tests/tools/test_assets.py::test_rebuild - OSError: disk full
= 1 failed, 2,448 passed, 3 skipped, 189 deselected, 14 warnings, 1 error in 612.30s (0:10:12) =
"""
FORKING_PASSED = """\
tests/parallel/test_launcher.py ......
=============== 189 passed, 2452 deselected in 301.02s (0:05:01) ===============
"""


def logs(tmp_path, pool, forking):
    (tmp_path / "pool.log").write_text(pool)
    (tmp_path / "forking.log").write_text(forking)
    return str(tmp_path / "pool.log"), str(tmp_path / "forking.log")


def test_the_end_gives_each_runs_summary_line_the_failing_tests_of_both_and_one_total(tmp_path, capsys):
    pool, forking = logs(tmp_path, POOL_FAILED, FORKING_PASSED.replace("189 passed", "1 failed, 188 passed").replace(
        "tests/parallel/test_launcher.py ......", "FAILED tests/parallel/test_loopback.py::test_a_launch - assert"))
    status = test_summary.main(["the pool", pool, "1", "the forking run", forking, "1"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert lines[-7:] == [
        f"the pool ({pool}): 1 failed, 2,448 passed, 3 skipped, 189 deselected, 14 warnings, 1 error "
        f"in 612.30s (0:10:12); exit status 1",
        f"the forking run ({forking}): 1 failed, 188 passed, 2452 deselected in 301.02s (0:05:01); exit status 1",
        "failing:",
        "  FAILED tests/memory/test_planner_families.py::test_a_qlora_model   (the pool)",
        "  ERROR tests/tools/test_assets.py::test_rebuild   (the pool)",
        "  FAILED tests/parallel/test_loopback.py::test_a_launch   (the forking run)",
        "in all: 2 failed, 2,636 passed, 3 skipped, 1 error: FAILED",  # deselected and warnings are not totalled
    ]


def test_two_green_runs_end_green_with_one_total(tmp_path, capsys):
    pool, forking = logs(tmp_path, "= 2,448 passed in 600.00s =\n", FORKING_PASSED)
    assert test_summary.main(["the pool", pool, "0", "the forking run", forking, "0"]) == 0
    out = capsys.readouterr().out
    assert "failing:" not in out
    assert out.splitlines()[-1] == "in all: 2,637 passed: passed"


def test_a_run_stopped_before_its_summary_line_fails_and_says_so(tmp_path, capsys):
    pool, forking = logs(tmp_path, "tests/a.py ...\nKilled\n", FORKING_PASSED)
    assert test_summary.main(["the pool", pool, "137", "the forking run", forking, "0"]) == 1
    assert f"the pool ({pool}): no pytest summary line (stopped, or it could not start: see the log); exit status 137" in (
        capsys.readouterr().out)


def test_the_arguments_are_checked():
    with pytest.raises(SystemExit, match="usage"):
        test_summary.main(["the pool", "log"])
    with pytest.raises(SystemExit, match="STATUS must be an exit status"):
        test_summary.main(["the pool", "log", ""])


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_ends_with_the_summary_of_both_runs_and_its_status():
    recipe = subprocess.run(["make", "-n", "--no-print-directory", "test"], capture_output=True, text=True,
                            check=True).stdout
    last = recipe[recipe.index("python -m pytest -m forks"):]
    assert "| tee test-artifacts/pool-tests.log" in last  # the pool's output is shown and kept
    end = last[last.index("cat test-artifacts/forking-tests.log"):]
    assert "-m tools.test_summary \"the pool\" test-artifacts/pool-tests.log" in end
    assert "\"the forking run\" test-artifacts/forking-tests.log $forked" in end
    assert "exit $((" not in end  # the summary's status is make test's
