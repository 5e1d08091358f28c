"""`make lab` (tools/open_lab.py): the learner's own copies, the offline kernel, JupyterLab without the internet."""

import errno
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_utils import REPO_DIR
from tools import open_lab
from tools.notebook_source import cells_fingerprint, parse_lesson, render_notebook

DEMO = REPO_DIR / "tests" / "fixtures" / "lessons" / "00_demo.py"


def course_notebook(folder, text=None, name="00_demo.ipynb"):
    """Write a built learner copy of the demo lesson (or of ``text``, a lesson source) into ``folder``."""
    from tools.notebook_source import parse_lesson_text

    lesson = parse_lesson(DEMO) if text is None else parse_lesson_text(text, DEMO)
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(render_notebook(lesson, "learner"), folder / name)
    return folder / name


@pytest.fixture
def course(tmp_path):
    course_dir = tmp_path / "notebooks"
    course_notebook(course_dir)
    course_notebook(course_dir / "solutions")
    (course_dir / "README.md").write_text("landing page\n")
    return course_dir


def edit(path, source):
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[2].source = source
    nbformat.write(notebook, path)


def test_first_use_makes_the_learners_copies_and_says_so_in_one_line(course, tmp_path):
    work = tmp_path / "my-notebooks"
    messages = open_lab.sync_working_copies(course, work)
    assert len(messages) == 1 and "made your own copies of 2 notebooks" in messages[0]
    assert (work / "00_demo.ipynb").read_bytes() == (course / "00_demo.ipynb").read_bytes()
    assert (work / "solutions" / "00_demo.ipynb").is_file() and (work / "README.md").read_text() == "landing page\n"
    assert open_lab.sync_working_copies(course, work) == [], "nothing to say the second time"


def test_the_learners_edits_are_kept_and_the_course_copy_is_never_touched(course, tmp_path):
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    course_bytes = (course / "00_demo.ipynb").read_bytes()
    edit(work / "00_demo.ipynb", "doubled = 21 + 21  # mine")
    assert open_lab.sync_working_copies(course, work) == []
    assert "# mine" in (work / "00_demo.ipynb").read_text()
    assert (course / "00_demo.ipynb").read_bytes() == course_bytes


def test_a_newer_course_lesson_goes_beside_an_edited_copy_never_over_it(course, tmp_path):
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    edit(work / "00_demo.ipynb", "doubled = 21 + 21  # mine")
    updated = course_notebook(course, DEMO.read_text().replace("Multiply 21 by 2.", "Double 21."))

    messages = open_lab.sync_working_copies(course, work)

    new_fingerprint = nbformat.read(updated, as_version=4).metadata.course.built_cells_sha256
    beside = work / f"00_demo.course-update-{new_fingerprint[:8]}.ipynb"
    assert messages == [f"{work / '00_demo.ipynb'}: the course has a new version of this lesson; "
                        f"it is in {beside.name}, beside yours, which is unchanged"]
    assert "# mine" in (work / "00_demo.ipynb").read_text()
    assert beside.read_bytes() == updated.read_bytes()
    assert open_lab.sync_working_copies(course, work) == [], "offered once"


def test_a_copy_never_saved_since_it_was_made_follows_the_course(course, tmp_path):
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    updated = course_notebook(course, DEMO.read_text().replace("Multiply 21 by 2.", "Double 21."))

    (message,) = open_lab.sync_working_copies(course, work)

    assert message == (f"{work / '00_demo.ipynb'}: updated to the course's new version (yours was as the course "
                       f"made it: never saved since, so neither edited nor run)")
    assert (work / "00_demo.ipynb").read_bytes() == updated.read_bytes()
    assert not list(work.glob("*.course-update-*"))


def test_a_copy_the_learner_ran_keeps_its_outputs_and_gets_the_new_version_beside(course, tmp_path):
    # Issue 31: a copy run but not edited was replaced ("you had not changed it") and its outputs lost.
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    executed = nbformat.read(work / "00_demo.ipynb", as_version=4)
    executed.cells[4].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42 from my run\n")]
    nbformat.write(executed, work / "00_demo.ipynb")  # ran and saved, not edited
    ran = (work / "00_demo.ipynb").read_bytes()
    updated = course_notebook(course, DEMO.read_text().replace("Multiply 21 by 2.", "Double 21."))

    (message,) = open_lab.sync_working_copies(course, work)

    assert "beside yours, which is unchanged" in message and "had not changed" not in message
    assert (work / "00_demo.ipynb").read_bytes() == ran
    (beside,) = work.glob("00_demo.course-update-*.ipynb")
    assert beside.read_bytes() == updated.read_bytes()


def cut_short(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def corrupt(path):
    path.write_text(path.read_text().replace('"cells": [', '"cells": [ <<<<<<< HEAD', 1))


@pytest.mark.parametrize("breaks, said", [
    (lambda path: path.write_text(""), "is empty (0 bytes)"),
    (cut_short, "ends part-way through, after"),
    (corrupt, "is not valid JSON (Expecting value at line 2, column"),
    (lambda path: path.write_text("[1, 2]"), "is valid JSON but not a notebook"),
])  # fmt: skip
@pytest.mark.parametrize("course_changed", [False, True])
def test_a_copy_that_cannot_be_opened_is_kept_said_so_and_given_a_fresh_copy_beside(
        course, tmp_path, breaks, said, course_changed):  # fmt: skip
    # Issue 31: an emptied, half-written (full disk) or corrupted copy got "the course has a new version" or nothing.
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    breaks(work / "00_demo.ipynb")
    broken = (work / "00_demo.ipynb").read_bytes()
    if course_changed:
        course_notebook(course, DEMO.read_text().replace("Multiply 21 by 2.", "Double 21."))

    (message,) = open_lab.sync_working_copies(course, work)

    (fresh,) = work.glob("00_demo.course-update-*.ipynb")
    assert message.startswith(f"{work / '00_demo.ipynb'} {said}")
    assert "JupyterLab cannot open it" in message and "new version" not in message
    assert f"a fresh copy of the lesson is beside it, {fresh.name}: work in that one" in message
    assert (work / "00_demo.ipynb").read_bytes() == broken, "nothing of the learner's is changed"
    assert fresh.read_bytes() == (course / "00_demo.ipynb").read_bytes()
    assert open_lab.sync_working_copies(course, work) == [message], "said again while it stays broken, copied once"


def test_the_learners_notes_in_the_landing_page_are_kept_and_the_new_page_goes_beside(course, tmp_path):
    # Issue 31: make lab replaced my-notebooks/README.md whenever it differed from the course's.
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    (work / "README.md").write_text("landing page\nmy notes\n")
    (course / "README.md").write_text("landing page, new\n")

    (message,) = open_lab.sync_working_copies(course, work)

    (beside,) = work.glob("README.course-update-*.md")
    assert message == f"{work / 'README.md'}: the course has a new version of this page; it is in {beside.name}, " \
                      f"beside yours, which is unchanged"
    assert (work / "README.md").read_text() == "landing page\nmy notes\n"
    assert beside.read_text() == "landing page, new\n"
    assert open_lab.sync_working_copies(course, work) == [], "offered once"


def test_a_landing_page_as_made_follows_the_course(course, tmp_path):
    work = tmp_path / "my-notebooks"
    open_lab.sync_working_copies(course, work)
    (course / "README.md").write_text("landing page, new\n")
    assert open_lab.sync_working_copies(course, work) == []
    assert (work / "README.md").read_text() == "landing page, new\n"


def test_a_copy_cut_short_by_a_full_disk_is_never_left_in_the_learners_folder(course, tmp_path, monkeypatch):
    def half_then_full(source, target):
        target.write_bytes(source.read_bytes()[:100])
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(open_lab.shutil, "copy2", half_then_full)
    with pytest.raises(OSError):
        open_lab.sync_working_copies(course, tmp_path / "my-notebooks")
    assert not [path for path in (tmp_path / "my-notebooks").rglob("*") if path.is_file()]


@pytest.mark.parametrize("error, fix", [
    (PermissionError(errno.EACCES, "Permission denied", "my-notebooks/00_demo.ipynb"), "chmod -R u+w my-notebooks"),
    (OSError(errno.EROFS, "Read-only file system", "my-notebooks/00_demo.ipynb"), "clone the course where you can write"),
    (OSError(errno.ENOSPC, "No space left on device", "my-notebooks/00_demo.ipynb"), "free some disk space"),
])  # fmt: skip
def test_make_lab_in_a_folder_it_cannot_write_stops_with_one_line(course, tmp_path, monkeypatch, capsys, error, fix):
    # Issue 31: a read-only my-notebooks/ gave a raw PermissionError traceback.
    def cannot(source, target):
        raise error

    monkeypatch.setattr(open_lab, "install_kernel", lambda online=False: False)
    monkeypatch.chdir(tmp_path)  # where the course fixture put notebooks/, as make lab runs in the repository
    monkeypatch.setattr(open_lab.shutil, "copy2", cannot)
    monkeypatch.setattr(open_lab.os, "chdir", lambda path: None)
    monkeypatch.setattr(open_lab.os, "execv", lambda path, command: pytest.fail("JupyterLab started"))

    assert open_lab.main([]) == 1

    printed = capsys.readouterr()
    (line,) = printed.err.splitlines()
    assert printed.out == "" and line.startswith("make lab stopped: cannot write my-notebooks/00_demo.ipynb (")
    assert error.strerror in line and fix in line and "make lab again" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder: the test above forces the error")
def test_make_lab_in_a_read_only_folder_stops_with_one_line(course, tmp_path):
    work = tmp_path / "my-notebooks"
    work.mkdir()
    work.chmod(0o555)
    try:
        with pytest.raises(PermissionError) as raised:
            open_lab.sync_working_copies(course, work)
        assert open_lab.cannot_write_line(raised.value).startswith(f"make lab stopped: cannot write {work}")
    finally:
        work.chmod(0o755)


def test_only_the_lessons_and_the_pages_are_copied_not_the_builds_record(course, tmp_path):
    (course / "lesson_times.json").write_text("{}\n")  # tools/lesson_times.py: the build's, not the learner's
    open_lab.sync_working_copies(course, tmp_path / "my-notebooks")
    assert not (tmp_path / "my-notebooks" / "lesson_times.json").exists()
    assert (tmp_path / "my-notebooks" / "README.md").exists()


def test_the_copy_records_the_fingerprint_of_the_cells_it_was_made_from(course):
    notebook = nbformat.read(course / "00_demo.ipynb", as_version=4)
    assert notebook.metadata.course.built_cells_sha256 == cells_fingerprint(notebook)


def test_git_ignores_the_learners_folder():
    assert "/my-notebooks/" in (REPO_DIR / ".gitignore").read_text().splitlines()
    if shutil.which("git") and (REPO_DIR / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", "my-notebooks/01_x.ipynb"], cwd=REPO_DIR)
        assert ignored.returncode == 0


# --------------------------------------------------------------------------- the kernel and JupyterLab


def test_the_course_kernel_runs_offline_on_one_openmp_thread_unless_asked_online():
    # ...and torch's C++ log at ERROR: offline, c10d logs a harmless hostname line on stderr.
    # ...and the repository root on its path: it starts as `python -P -m tools.course_kernel` in a notebook's folder.
    threads = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR",
               "PYTHONPATH": str(REPO_DIR)}
    assert open_lab.kernel_env() == {**threads, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert open_lab.kernel_env(online=True) == threads


def test_the_installed_course_kernel_has_that_environment():
    # make venv installs it (tools/open_lab.py install_kernel); nbval and JupyterLab start it.
    spec = json.loads(open_lab.kernel_spec_path(sys.prefix).read_text())
    assert spec["display_name"] == "Python 3 (course)"
    assert spec.get("env") == open_lab.kernel_env(), "run `make venv` again (or python -m tools.open_lab) to reinstall"
    # It starts through the course's own module, which silences known-harmless library lines first,
    # with -P: the notebook's folder is not first on sys.path while the kernel starts.
    assert spec["argv"] == [sys.executable, "-P", "-m", "tools.course_kernel", "-f", "{connection_file}"]


def test_a_kernel_started_from_the_spec_sees_the_offline_variables():
    from jupyter_client.manager import start_new_kernel

    env = {key: value for key, value in os.environ.items() if key not in open_lab.KERNEL_ENV}
    printed = []
    manager, client = start_new_kernel(kernel_name="python3", env=env, extra_arguments=["--IPKernelApp.log_level=ERROR"])
    try:
        reply = client.execute_interactive(
            "import os; print([os.environ.get(k) for k in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE', 'OMP_WAIT_POLICY', 'OMP_NUM_THREADS')])",
            timeout=60, output_hook=printed.append,
        )
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    text = "".join(msg["content"].get("text", "") for msg in printed if msg["msg_type"] == "stream")
    assert text.strip() == "['1', '1', 'PASSIVE', '1']"


def start_as_jupyterlab_does(folder, run: str) -> tuple[str, str]:
    """Start the installed course kernel in ``folder`` as JupyterLab does (no extra arguments), run ``run``.

    Returns what the cell printed (stdout, or the error) and what the kernel wrote on
    its own stderr, which JupyterLab leaves in the learner's terminal.
    """
    from jupyter_client.manager import KernelManager

    from kernel_env import course_kernel_spec, learner_env

    course_kernel_spec()
    printed = []
    with open(folder / "kernel-stderr.txt", "w") as stderr:
        manager = KernelManager(kernel_name="python3")
        manager.start_kernel(cwd=str(folder), env=learner_env(), stderr=stderr)
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            client.execute_interactive(run, timeout=60, output_hook=printed.append)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    shown = "".join(msg["content"].get("text", "") + msg["content"].get("evalue", "")
                    for msg in printed if msg["msg_type"] in ("stream", "error"))  # fmt: skip
    return shown, (folder / "kernel-stderr.txt").read_text()


def test_a_learners_logging_py_or_tools_folder_beside_the_notebook_does_not_stop_the_kernel(tmp_path):
    # Issue 31: the kernel started with the notebook's folder first on sys.path, so these ran
    # at its start (instead of the standard library's logging, the course's tools) and killed it.
    (tmp_path / "logging.py").write_text("raise SystemExit('the learner\'s logging.py ran at kernel start')\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("raise SystemExit('the learner\'s tools/ ran at kernel start')\n")
    (tmp_path / "my_helpers.py").write_text("ANSWER = 42\n")

    shown, _ = start_as_jupyterlab_does(tmp_path, (
        "import logging, sys, sysconfig, my_helpers\n"
        "stdlib = sysconfig.get_paths()['stdlib']\n"
        "print(my_helpers.ANSWER, logging.__file__.startswith(stdlib), sys.path.index('') > sys.path.index(stdlib))"))

    # The learner's own modules still import from the notebook's folder, after the standard library.
    assert shown.split() == ["42", "True", "True"], shown


def test_a_kernel_started_as_make_lab_starts_it_prints_no_warning_in_the_terminal(tmp_path):
    # ipykernel 7 logs "[IPKernelApp] WARNING | Kernel is running over TCP without encryption" at
    # every start; the ports are on loopback, and open_lab promises a quiet start.
    shown, stderr = start_as_jupyterlab_does(tmp_path, "print('started')")
    assert shown.strip() == "started"
    assert "without encryption" not in stderr and "[IPKernelApp]" not in stderr, stderr


def test_the_notebook_folder_goes_on_the_path_where_ipython_puts_it():
    from tools.course_kernel import put_the_notebook_folder_on_the_path

    path = ["/repo", "/usr/lib/python3.11", "/usr/lib/python3.11/lib-dynload", "/venv/lib/python3.11/site-packages"]
    put_the_notebook_folder_on_the_path(path)
    assert path == ["/repo", "/usr/lib/python3.11", "/usr/lib/python3.11/lib-dynload", "",
                    "/venv/lib/python3.11/site-packages"]
    put_the_notebook_folder_on_the_path(path)
    assert path.count("") == 1


def test_jupyterlab_starts_without_news_update_check_or_pypi_extension_manager():
    command = open_lab.lab_command(as_root=False)
    assert "--LabApp.news_url=None" in command
    assert "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate" in command
    assert "--LabApp.extension_manager=readonly" in command
    settings = json.loads((REPO_DIR / "jupyterlab-settings" / "overrides.json").read_text())
    assert settings["@jupyterlab/apputils-extension:notification"] == {"checkForUpdates": False, "fetchNews": "false"}


def test_the_update_check_class_exists_in_this_jupyterlab():
    from jupyterlab.handlers.announcements import NeverCheckForUpdate  # noqa: F401


@pytest.mark.parametrize("as_root", [True, False])
def test_allow_root_is_passed_exactly_when_running_as_root(as_root):
    assert ("--allow-root" in open_lab.lab_command(as_root=as_root)) is as_root


def test_the_command_defaults_to_the_users_own_id():
    assert ("--allow-root" in open_lab.lab_command()) is (os.geteuid() == 0)


def test_lab_opens_the_landing_page_of_the_learners_copies():
    command = open_lab.lab_command(as_root=False)
    assert command[1:4] == ["-m", "jupyter", "lab"]
    assert "--notebook-dir=my-notebooks" in command and command[-1] == "my-notebooks/README.md"
    assert "--LabApp.app_settings_dir=jupyterlab-settings" in command


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_runs_open_lab_and_passes_online_through():
    def printed(*args):
        return subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "lab", *args],
                              cwd=REPO_DIR, capture_output=True, text=True, check=True).stdout.split()
    assert printed()[-2:] == ["-m", "tools.open_lab"]
    assert printed("ONLINE=1")[-3:] == ["-m", "tools.open_lab", "--online"]


def test_lab_is_quiet_and_its_printed_urls_open_the_landing_page():
    command = open_lab.lab_command(as_root=False, browser=True)
    assert "--ServerApp.log_level=WARN" in command and "--LabApp.log_level=WARN" in command
    assert "--LabApp.default_url=/lab/tree/README.md" in command
    assert "--ServerApp.open_browser=False" not in command


def test_without_a_browser_jupyter_is_not_asked_to_open_one():
    # Jupyter would log "No web browser found" in the learner's terminal (issue 22).
    assert "--ServerApp.open_browser=False" in open_lab.lab_command(as_root=False, browser=False)


def test_make_lab_prints_one_line_on_where_to_start_then_starts_jupyterlab(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(open_lab, "install_kernel", lambda online=False: False)
    monkeypatch.setattr(open_lab, "sync_working_copies", lambda course, work: [])
    monkeypatch.setattr(open_lab.os, "chdir", lambda path: None)
    monkeypatch.setattr(open_lab.os, "execv", lambda path, command: started.append(command))
    open_lab.main([])
    assert capsys.readouterr().out.splitlines() == [open_lab.WHERE_TO_START]
    assert "README.md" in open_lab.WHERE_TO_START and "lesson 1" in open_lab.WHERE_TO_START
    assert started and started[0][-1] == "my-notebooks/README.md"
