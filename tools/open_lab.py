"""Open the course in JupyterLab, on the learner's own copies of the lessons.

    python -m tools.open_lab                  # what `make lab` runs; the conda route runs it too
    python -m tools.open_lab --online         # kernels may download from the Hugging Face hub
    python -m tools.open_lab --print-command  # print the `jupyter lab` command, change nothing
    python -m tools.open_lab --install-kernel # only (re)install the course kernel (make venv, make test)

What it does, in order:

1. The course kernel ("Python 3 (course)", installed into this Python's prefix)
   runs ``python -P -m tools.course_kernel``, which hides the library lines known to be
   harmless before any cell can import those libraries, and starts offline:
   HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1, so the Hugging Face libraries
   fail at once instead of retrying the network; OMP_WAIT_POLICY=PASSIVE (idle
   OpenMP threads sleep instead of spinning); OMP_NUM_THREADS=1 (see KERNEL_ENV).
   ``--online`` installs it without the two offline variables; the next plain
   run puts them back. The tests run the lessons in this same kernel, with the
   same environment (tests/kernel_env.py).
2. The learner works in ``my-notebooks/`` (git ignores it), made on first use
   from the course's copies in ``notebooks/``, which stay as git has them, so
   ``git pull`` never meets a learner's edits. When the course's copy of a lesson
   (or of the landing page) is newer than the one a learner's copy was made from
   (the built-cells fingerprint in the notebook's metadata), the new one is put
   beside the learner's, never over it, and one line says so. Only a copy still
   exactly as it was made (never saved: neither edited nor run) is replaced. A copy
   that cannot be opened gets a line saying what is wrong and a fresh copy beside
   it; a folder that cannot be written stops make lab with one line.
3. JupyterLab starts on the landing page (also the page its printed URLs
   open), quietly (the URLs and one line on where to start), with the course's settings
   (``jupyterlab-settings/``), without its news feed, update check or PyPI
   extension manager (they reach for the internet and could suggest upgrades
   outside the tested versions), and with ``--allow-root`` when run as root
   (Jupyter refuses root otherwise; containers and CI run as root).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import webbrowser
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
COURSE_DIR = Path("notebooks")  # relative to REPO_DIR, where JupyterLab starts
WORK_DIR = Path("my-notebooks")
SETTINGS_DIR = Path("jupyterlab-settings")
LANDING_PAGE = "README.md"

KERNEL_NAME = "python3"  # the name every lesson notebook asks for
KERNEL_DISPLAY_NAME = "Python 3 (course)"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
KERNEL_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    # One OpenMP thread per process, as course_utils.threads gives torch in the kernel: every
    # process the kernel starts (the launches of lesson 6) inherits it, so a forked worker
    # never waits for threads of a pool it did not inherit, and Accelerate knows the number
    # was chosen (without it, each CPU worker of `notebook_launcher` warns
    # "OMP_NUM_THREADS/MKL_NUM_THREADS unset"). COURSE_NUM_THREADS still sets torch's threads.
    "OMP_NUM_THREADS": "1",
    # torch's C++ log at ERROR: offline (no DNS, as in `unshare -n`), every process that joins
    # a process group over TCP logs "[c10d] The hostname of the client socket cannot be
    # retrieved" on stderr, harmless (the store is on 127.0.0.1). Only C++ log lines go;
    # Python warnings from torch are untouched.
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    # The kernel starts as `python -P -m tools.course_kernel` in the notebook's folder: the
    # repository root on the path finds the tools package, which is not installed.
    "PYTHONPATH": str(REPO_DIR),
    **OFFLINE_ENV,
}
KERNEL_MODULE = "tools.course_kernel"

LAB_OFFLINE_ARGS = [
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
]
# What the learner's terminal shows: the URLs (Jupyter's CRITICAL-level block) and problems,
# not the servers' start-up log (a line per extension, the 19 language servers not installed).
LAB_QUIET_ARGS = ["--ServerApp.log_level=WARN", "--LabApp.log_level=WARN"]
# The URLs Jupyter prints open the landing page too, not only the page it opens in a
# browser: a learner without one (a remote machine, a container) copies a URL.
LAB_LANDING_ARGS = [f"--LabApp.default_url=/lab/tree/{LANDING_PAGE}"]
WHERE_TO_START = f"JupyterLab opens on {WORK_DIR / LANDING_PAGE}: start there, then lesson 1. Stop it with Ctrl-C."


# --------------------------------------------------------------------------- the kernel


def kernel_env(online: bool = False) -> dict[str, str]:
    """Return the environment the course kernel starts with (offline unless ``online``)."""
    return {key: value for key, value in KERNEL_ENV.items() if not (online and key in OFFLINE_ENV)}


def kernel_spec_path(prefix: str | Path = sys.prefix) -> Path:
    """Return where the course kernel's ``kernel.json`` lives under ``prefix`` (``ipykernel install --sys-prefix``)."""
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json"


def kernel_argv() -> list[str]:
    """Return the command the course kernel starts with (``{connection_file}`` is Jupyter's placeholder)."""
    # -P: the notebook's folder (the kernel's working folder) is not put first on sys.path while
    # the kernel starts, so a learner's logging.py or tools/ there cannot replace what it imports
    # (tools/course_kernel.py puts the folder back, after the standard library, once it is up).
    return [sys.executable, "-P", "-m", KERNEL_MODULE, "-f", "{connection_file}"]


def install_kernel(online: bool = False) -> bool:
    """Install the course kernel into this Python's prefix unless it is already as wanted; return True if installed."""
    wanted = kernel_env(online)
    path = kernel_spec_path()
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if spec.get("env", {}) == wanted and spec.get("argv") == kernel_argv():
            return False
    except (OSError, ValueError):
        pass
    command = [sys.executable, "-m", "ipykernel", "install", "--sys-prefix",
               "--name", KERNEL_NAME, "--display-name", KERNEL_DISPLAY_NAME]
    for key, value in wanted.items():
        command += ["--env", key, value]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    # ipykernel writes `python -m ipykernel_launcher`; the course kernel starts through its own module.
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["argv"] = kernel_argv()
    path.write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    return True


# --------------------------------------------------------------------------- the learner's copies


def _recorded_fingerprint(notebook: dict) -> str | None:
    """Return the fingerprint of the course cells a notebook was built (or copied) from."""
    return notebook.get("metadata", {}).get("course", {}).get("built_cells_sha256")


RECORD_NAME = ".course-copies.json"  # in the learner's folder: what each copy was when the course made it


def _read(path: Path) -> dict | None:
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return notebook if isinstance(notebook, dict) and isinstance(notebook.get("cells"), list) else None


def what_is_wrong(path: Path) -> str | None:
    """Return what keeps the notebook at ``path`` from opening (empty, cut short, not JSON, not a notebook), or None."""
    data = path.read_bytes()
    if not data.strip():
        return f"is empty ({len(data)} bytes)"
    try:
        notebook = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        return f"is not text (byte {error.start} is not UTF-8)"
    except json.JSONDecodeError as error:
        # Cut short: the parser ran out of text (a string still open at the end counts too).
        if error.pos >= len(data.decode("utf-8").rstrip()) or error.msg.startswith("Unterminated string"):
            return (f"ends part-way through, after {len(data):,} bytes (a save cut short, by a full disk "
                    f"for one, leaves a file like this)")  # fmt: skip
        return f"is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        return "is valid JSON but not a notebook (it has no list of cells)"
    return None


def update_copy_name(path: Path, fingerprint: str) -> Path:
    """Return where the course's newer version of ``path`` goes: beside it, named after its fingerprint."""
    return path.with_name(f"{path.stem}.course-update-{fingerprint[:8]}{path.suffix}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` whole or not at all: a full disk never leaves half a notebook."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        shutil.copy2(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _read_record(work_dir: Path) -> dict[str, str]:
    try:
        record = json.loads((work_dir / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def sync_working_copies(course_dir: Path, work_dir: Path) -> list[str]:
    """Bring ``work_dir`` (the learner's copies) up to date with ``course_dir``; return one line per thing done.

    Missing copies are made, and what each was when made is recorded (its SHA-256, in
    ``work_dir/.course-copies.json``). When the course has a newer version of a file
    (a notebook's built-cells fingerprint, the landing page's bytes), a copy still as
    it was made is replaced; any other (edited, or run and saved: its outputs are the
    learner's too) is left alone and the newer version is written beside it
    (``NAME.course-update-XXXXXXXX.ipynb``), once. A notebook that cannot be opened
    (empty, cut short, not JSON) is left as it is, with a fresh copy beside it and a
    line saying what is wrong and what to do. Nothing of the learner's is deleted.
    """
    course_dir, work_dir = Path(course_dir), Path(work_dir)
    record = _read_record(work_dir)
    made, messages = [], []

    def copy(course_path: Path, mine: Path) -> None:
        _copy(course_path, mine)
        record[mine.relative_to(work_dir).as_posix()] = _sha256(mine)

    def as_made(mine: Path) -> bool:
        return record.get(mine.relative_to(work_dir).as_posix()) == _sha256(mine)

    def offer_beside(course_path: Path, mine: Path, version: str, why: str) -> None:
        beside = update_copy_name(mine, version)
        if not beside.exists():
            _copy(course_path, beside)
            messages.append(why.replace("{beside}", beside.name))

    for course_path in sorted(course_dir.glob("*.ipynb")) + sorted(course_dir.glob("solutions/*.ipynb")):
        mine = work_dir / course_path.relative_to(course_dir)
        course = _read(course_path)
        new = _recorded_fingerprint(course) if course else None
        if not mine.exists():
            copy(course_path, mine)
            made.append(mine)
            continue
        if new is None:
            continue  # the course copy is not a built notebook
        wrong = what_is_wrong(mine)
        if wrong is not None:
            beside = update_copy_name(mine, new)
            if not beside.exists():
                _copy(course_path, beside)
            messages.append(f"{mine} {wrong}: JupyterLab cannot open it. It is left as it is, and a fresh copy "
                            f"of the lesson is beside it, {beside.name}: work in that one, and once you have "
                            f"taken what you need from yours (a text editor opens it), delete yours and rename "
                            f"the fresh copy to {mine.name}")  # fmt: skip
            continue
        if _recorded_fingerprint(_read(mine)) == new:
            if _sha256(mine) == _sha256(course_path):
                record.setdefault(mine.relative_to(work_dir).as_posix(), _sha256(mine))
            continue  # made from the course's current version
        if as_made(mine):
            copy(course_path, mine)
            messages.append(f"{mine}: updated to the course's new version (yours was as the course made it: "
                            f"never saved since, so neither edited nor run)")  # fmt: skip
            continue
        offer_beside(course_path, mine, new, f"{mine}: the course has a new version of this lesson; it is in "
                                             "{beside}, beside yours, which is unchanged")
    for course_path in sorted(course_dir.iterdir()):
        if course_path.is_file() and course_path.suffix == ".md":  # the pages (not lesson_times.json, the build's)
            mine = work_dir / course_path.name
            if not mine.exists():
                copy(course_path, mine)
            elif mine.read_bytes() != course_path.read_bytes():
                if as_made(mine):
                    copy(course_path, mine)  # the landing page as made: it follows the course, as before
                else:
                    offer_beside(course_path, mine, _sha256(course_path),
                                 f"{mine}: the course has a new version of this page; it is in {{beside}}, "
                                 f"beside yours, which is unchanged")
    if record != _read_record(work_dir):
        (work_dir / RECORD_NAME).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if made:
        messages.insert(0, f"{work_dir}/: made your own copies of {len(made)} notebooks; the course's "
                           f"copies in {course_dir}/ stay as they are (README.md: updating the course)")
    return messages


def cannot_write_line(error: OSError) -> str:
    """Return the one line ``make lab`` prints when it cannot write the learner's copies (no traceback)."""
    where = error.filename or WORK_DIR
    if error.errno == errno.ENOSPC:
        fix = "free some disk space"
    elif error.errno == errno.EROFS:
        fix = "its file system is mounted read-only: clone the course where you can write"
    else:
        fix = f"make the folder writable (chmod -R u+w {WORK_DIR}), or run make lab as the user who owns it"
    return (f"make lab stopped: cannot write {where} ({error.strerror or error}). {WORK_DIR}/ holds your own "
            f"copies of the lessons: {fix}, then run make lab again.")


# --------------------------------------------------------------------------- JupyterLab


def can_open_a_browser() -> bool:
    """Return True if Python's ``webbrowser`` (what Jupyter uses) finds a browser to open here."""
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def lab_command(work_dir: Path = WORK_DIR, settings_dir: Path = SETTINGS_DIR, as_root: bool | None = None,
                browser: bool | None = None) -> list[str]:
    """Return the ``jupyter lab`` command that opens ``work_dir``'s landing page (paths as given, relative to the repository).

    ``as_root`` and ``browser`` (can one be opened here?) are found out when None.
    Without a browser Jupyter is not asked to open one (it would log "No web
    browser found"); the URLs it prints lead to the landing page either way.
    """
    if as_root is None:
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if browser is None:
        browser = can_open_a_browser()
    command = [
        sys.executable, "-m", "jupyter", "lab",
        f"--notebook-dir={work_dir}",
        f"--LabApp.app_settings_dir={settings_dir}",
        *LAB_OFFLINE_ARGS,
        *LAB_QUIET_ARGS,
        *LAB_LANDING_ARGS,
    ]  # fmt: skip
    if not browser:
        command.append("--ServerApp.open_browser=False")
    if as_root:
        command.append("--allow-root")
    return command + [f"{work_dir / LANDING_PAGE}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--online", action="store_true", help="let the kernels use the Hugging Face hub")
    parser.add_argument("--print-command", action="store_true", help="print the jupyter lab command and exit")
    parser.add_argument("--install-kernel", action="store_true", help="install the course kernel if needed and exit")
    args = parser.parse_args(argv)
    command = lab_command()
    if args.print_command:
        print(shlex.join(command))
        return 0
    os.chdir(REPO_DIR)
    if args.install_kernel:
        install_kernel(online=args.online)
        return 0
    if install_kernel(online=args.online):
        state = "online: kernels may download from the hub" if args.online else "offline"
        print(f"course kernel installed ({state})")
    try:
        lines = sync_working_copies(COURSE_DIR, WORK_DIR)
    except OSError as error:  # a read-only or full my-notebooks/: one line, not a traceback
        print(cannot_write_line(error), file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(WHERE_TO_START)
    sys.stdout.flush()
    os.execv(sys.executable, command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
