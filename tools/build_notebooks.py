"""Build the lesson notebooks from their one source in ``lessons/``.

For each ``lessons/NN_name.py`` this writes ``notebooks/NN_name.ipynb`` (the
learner copy) and ``notebooks/solutions/NN_name.ipynb`` (the solved copy), each
executed top to bottom in a fresh kernel so the committed notebooks carry
their outputs (nbval compares the cells tagged ``nbval-check-output``). The
sources are jupytext percent files (see ``notebook_source.py``, beside this one).

    python -m tools.build_notebooks              # build and execute every lesson
    python -m tools.build_notebooks --only 02    # one lesson
    python -m tools.build_notebooks --no-execute # write the notebooks without outputs
    python -m tools.build_notebooks --check      # exit 1 if a notebook is stale (fast, runs nothing)
    python -m tools.build_notebooks --widget-texts --only 02  # only redo the widgets' texts (runs nothing)
    python -m tools.build_notebooks --times --only 02  # only re-time the learner copy's run (writes no notebook)

The build fails (exit 1, naming the file and cell) when a cell raises or writes
to stderr. A notebook someone edited is backed up to ``notebooks/.backups/``
before it is overwritten. Each output that displays an ipywidgets widget gets,
as its text form, what the widget's saved state says (``notebook_widgets.py``):
that text is what JupyterLab shows in a committed notebook before its cell runs.
The learner copy's run time is recorded in ``notebooks/lesson_times.json`` and the
landing page's table of lesson times (``lesson_times.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

from tools import lesson_times
from tools.notebook_source import (
    VARIANTS,
    cells_fingerprint,
    LessonSourceError,
    execution_problems,
    lesson_sources,
    notebook_path,
    parse_lesson,
    read_notebook,
    render_notebook,
    stale_copies,
    stale_notebooks,
    write_notebook,
)
from tools.notebook_watchdog import WatchedNotebookClient
from tools.notebook_widgets import with_widget_texts

REPO_DIR = Path(__file__).resolve().parents[1]

CELL_TIMEOUT_S = 600
# The course never downloads; a kernel that tried would hang, then fail.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def execute(notebook, working_dir: Path, label: str = "notebook"):
    """Run ``notebook`` (nbformat v4; ``label`` names it in errors) top to bottom in a fresh ``python3`` kernel.

    Returns the notebook with its outputs, and why execution stopped early or
    None. An error in a cell is left in that cell's outputs (found by
    ``execution_problems``); a dead kernel, a cell timeout or a hung cell
    (``notebook_watchdog``) is the message.
    """
    node = nbformat.from_dict(notebook)  # a copy: the caller's notebook keeps no outputs
    client = WatchedNotebookClient(
        node,
        label=label,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(working_dir)}},
        record_timing=False,  # timestamps would change every build
        # Quiets the kernel's own log (e.g. "running over TCP without encryption");
        # cell outputs, where warnings go, are unaffected.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )
    stopped = None
    try:
        client.execute()
    except CellExecutionError:
        pass  # the error output is in the notebook
    except Exception as error:  # dead kernel, timeout, hung cell: nothing in the outputs says so
        stopped = f"execution stopped: {type(error).__name__}: {error}"
    return node, stopped


def build_lesson(source: Path, notebooks_dir: Path, run: bool) -> list[str]:
    """Write (and, if ``run``, execute) both copies of one lesson; return the problems found."""
    lesson = parse_lesson(source)
    problems = []
    for variant in VARIANTS:
        path = notebook_path(notebooks_dir, lesson.name, variant)
        notebook = render_notebook(lesson, variant, source_label=f"{source.parent.name}/{source.name}")
        if run:
            print(f"executing {path} ...", flush=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            notebook, stopped = execute(notebook, path.parent, label=str(path))
            seconds = time.perf_counter() - started
            notebook = with_widget_texts(notebook)
            found = execution_problems(notebook) + ([stopped] if stopped else [])
            problems += [f"{path}: {problem}" for problem in found]
            if variant == "learner" and not found:  # what Run All of a fresh learner copy takes
                lesson_times.record(notebooks_dir, lesson.name, cells_fingerprint(notebook), seconds)
                lesson_times.write_readme_table(notebooks_dir)
        backup_dir = notebooks_dir / ".backups" / path.parent.relative_to(notebooks_dir)
        backup = write_notebook(notebook, path, backup_dir)
        if backup is not None:
            print(f"{path} had been edited: your version is saved as {backup}")
        print(f"wrote {path}")
    return problems


def redo_widget_texts(source: Path, notebooks_dir: Path) -> list[str]:
    """Give the committed copies of lesson ``source`` the widget texts the build gives; return the problems.

    Rewrites only the ``text/plain`` of widget outputs (``with_widget_texts``), so
    a notebook built before the build did so needs no new execution. A copy that
    is missing or stale against its source is a problem, left as it is.
    """
    problems = stale_copies(source, notebooks_dir, widget_texts=False)
    if problems:
        return problems
    lesson = parse_lesson(source)
    for variant in VARIANTS:
        path = notebook_path(notebooks_dir, lesson.name, variant)
        committed = read_notebook(path)
        updated = with_widget_texts(committed)
        if updated != committed:
            write_notebook(updated, path, notebooks_dir / ".backups" / path.parent.relative_to(notebooks_dir))
            print(f"wrote {path} (widget texts)")
    return []


def time_lesson(source: Path, notebooks_dir: Path) -> list[str]:
    """Run the learner copy of lesson ``source`` as built and record its run time; return the problems.

    Writes no notebook: for a lesson whose committed copies are current (a copy
    stale against its source is a problem, left as it is), after a change that
    made its recorded time another version's (a merge, say).
    """
    problems = stale_copies(source, notebooks_dir)
    if problems:
        return problems
    lesson = parse_lesson(source)
    path = notebook_path(notebooks_dir, lesson.name, "learner")
    print(f"timing {path} ...", flush=True)
    started = time.perf_counter()
    notebook, stopped = execute(render_notebook(lesson, "learner"), path.parent, label=str(path))
    seconds = time.perf_counter() - started
    found = execution_problems(notebook) + ([stopped] if stopped else [])
    if found:
        return [f"{path}: {problem}" for problem in found]
    lesson_times.record(notebooks_dir, lesson.name, cells_fingerprint(notebook), seconds)
    lesson_times.write_readme_table(notebooks_dir)
    print(f"{path}: {lesson_times.shown_time(seconds)}")
    return []


def main(argv: list[str] | None = None) -> int:
    """Build or check the notebooks; return the exit status (0 all good, 1 problems, 2 bad usage)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only report notebooks that are stale against their source")
    mode.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    mode.add_argument("--widget-texts", action="store_true",
                      help="only give the committed notebooks' widget outputs their texts (runs nothing)")
    mode.add_argument("--times", action="store_true",
                      help="only run the learner copies as built and record their run times (writes no notebook)")
    parser.add_argument("--only", metavar="NN", help="build only lesson NN, e.g. 02")
    parser.add_argument("--lessons-dir", type=Path, default=REPO_DIR / "lessons")
    parser.add_argument("--notebooks-dir", type=Path, default=REPO_DIR / "notebooks")
    args = parser.parse_args(argv)

    if not args.lessons_dir.is_dir():
        parser.error(f"--lessons-dir {args.lessons_dir} is not a directory")
    sources = lesson_sources(args.lessons_dir)
    if args.only is not None:
        sources = [path for path in sources if path.name.startswith(f"{args.only}_")]
        if not sources:
            parser.error(f"--only {args.only}: no lesson source {args.lessons_dir}/{args.only}_*.py")

    if args.check:
        problems = stale_notebooks(args.lessons_dir, args.notebooks_dir, only=args.only)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{len(problems)} problem(s): rebuild with `python -m tools.build_notebooks`.")
            return 1
        print(f"{len(sources)} lesson(s): notebooks up to date.")
        return 0

    if args.widget_texts:
        problems = [problem for source in sources for problem in redo_widget_texts(source, args.notebooks_dir)]
        for problem in problems:
            print(f"PROBLEM {problem}", file=sys.stderr)
        return 1 if problems else 0

    os.environ.update(OFFLINE_ENV)  # inherited by every kernel started below
    if args.times:
        problems = [problem for source in sources for problem in time_lesson(source, args.notebooks_dir)]
        for problem in problems:
            print(f"PROBLEM {problem}", file=sys.stderr)
        return 1 if problems else 0
    problems = []
    for source in sources:
        try:
            problems += build_lesson(source, args.notebooks_dir, run=not args.no_execute)
        except LessonSourceError as error:
            problems.append(str(error))
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s): fix them in the lesson sources and rebuild.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
