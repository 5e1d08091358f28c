"""One source per lesson, two notebooks: the learner copy and the solved copy.

A lesson source ``lessons/NN_name.py`` is a Python file in the "percent" format:

- ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines
  are comments (``# text``; ``#`` alone is a blank line). Tags may follow:
  ``# %% tags=["hide-input"]``.
- In a code cell, a solution region is followed directly by the learner's
  starter code, commented out so the source file runs as the solution::

      # BEGIN SOLUTION
      num_params = sum(p.numel() for p in model.parameters())
      # END SOLUTION
      # BEGIN STARTER
      # num_params = ____
      # END STARTER

  The solved copy keeps the solution; the learner copy keeps the starter,
  uncommented. Marker lines appear in neither.
- In a markdown cell, ``<!-- BEGIN SOLUTION -->`` ... ``<!-- END SOLUTION -->``
  surrounds text only the solved copy shows (say, the answer to an open question).

``scripts/build_notebooks.py`` writes and executes the notebooks; this module
parses, renders, compares and writes them, and is what the tests use.

Notebooks are handled as plain dicts in the nbformat v4 layout, and nbformat is
imported only to write one: importing it costs over a second (its JSON-schema
checks), which would make ``build_notebooks.py --check`` slow.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

VARIANTS = ("learner", "solved")
"""The two copies of a lesson: learner (exercises left blank) and solved."""

LESSON_GLOB = "[0-9][0-9]_*.py"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (course)", "language": "python"}

# Cell tags the builder honours when it checks an executed notebook.
TAG_RAISES = "raises-exception"  # the cell shows an error on purpose (nbclient's own tag)
TAG_ALLOW_STDERR = "allow-stderr"  # the cell writes to stderr on purpose

_HEADER = re.compile(r"^# %%(?P<rest>\s.*)?$")
_HEADER_REST = re.compile(r"^(?:\[(?P<kind>markdown|md|code)\])?\s*(?:tags=(?P<tags>.+))?$")
_CODE_MARKER = re.compile(r"^\s*#\s*(?P<action>BEGIN|END)\s+(?P<region>SOLUTION|STARTER)\s*$")
_MARKDOWN_MARKER = re.compile(r"^\s*<!--\s*(?P<action>BEGIN|END)\s+SOLUTION\s*-->\s*$")


class LessonSourceError(ValueError):
    """A lesson source breaks a rule of the format; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class SourceCell:
    """One cell of a lesson source.

    ``lines`` pairs each line with its region: ``"shared"`` (both copies),
    ``"solution"`` (solved copy only) or ``"starter"`` (learner copy only,
    already uncommented). Markdown lines have their ``# `` prefix removed.
    """

    kind: str  # "code" or "markdown"
    tags: tuple[str, ...]
    line_number: int  # of the cell's `# %%` header, counted from 1
    lines: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Lesson:
    """A parsed lesson source: where it came from and its cells."""

    path: Path
    cells: tuple[SourceCell, ...]

    @property
    def name(self) -> str:
        """The lesson's file name without ``.py``, e.g. ``01_from_loop_to_accelerator``."""
        return self.path.stem


# --------------------------------------------------------------------------- parsing


def parse_lesson(path: str | Path) -> Lesson:
    """Return the parsed lesson source at ``path``; raise ``LessonSourceError`` if it breaks a rule."""
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise FileNotFoundError(f"path must be an existing lesson source file (.py), got {str(path)!r}")
    return parse_lesson_text(path.read_text(encoding="utf-8"), path)


def parse_lesson_text(text: str, path: str | Path = "<lesson>") -> Lesson:
    """Return the lesson parsed from ``text``; ``path`` only names the source in error messages."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    path = Path(path)
    cells: list[SourceCell] = []
    header: tuple[str, tuple[str, ...], int] | None = None
    body: list[tuple[int, str]] = []

    def close_cell() -> None:
        if header is not None:
            kind, tags, line_number = header
            parse_body = _parse_code_lines if kind == "code" else _parse_markdown_lines
            cells.append(SourceCell(kind, tags, line_number, tuple(parse_body(body, path))))

    for line_number, line in enumerate(text.splitlines(), start=1):
        if _HEADER.match(line):
            close_cell()
            header = (*_parse_header(line, path, line_number), line_number)
            body = []
        elif header is None:
            if line.strip():
                raise LessonSourceError(f"{path}:{line_number}: text before the first `# %%` cell marker")
        else:
            body.append((line_number, line))
    close_cell()
    if not cells:
        raise LessonSourceError(f"{path}:1: no cells: start each cell with a `# %%` line")
    return Lesson(path, tuple(cells))


def _parse_header(line: str, path: Path, line_number: int) -> tuple[str, tuple[str, ...]]:
    """Return (kind, tags) of a ``# %%`` header line."""
    rest = (_HEADER.match(line).group("rest") or "").strip()
    match = _HEADER_REST.match(rest)
    if match is None:
        raise LessonSourceError(
            f"{path}:{line_number}: cannot read cell header {line!r}; "
            'expected `# %%`, `# %% [markdown]`, optionally followed by tags=["tag", ...]'
        )
    kind = "markdown" if match.group("kind") in ("markdown", "md") else "code"
    tags: tuple[str, ...] = ()
    if match.group("tags") is not None:
        try:
            parsed = json.loads(match.group("tags"))
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(tag, str) for tag in parsed):
            raise LessonSourceError(
                f'{path}:{line_number}: tags must be a JSON list of strings, like tags=["hide-input"]; '
                f"got {match.group('tags')}"
            )
        tags = tuple(parsed)
    return kind, tags


def _parse_code_lines(body: list[tuple[int, str]], path: Path) -> list[tuple[str, str]]:
    """Return the (region, line) pairs of a code cell, checking its SOLUTION/STARTER regions."""
    lines: list[tuple[str, str]] = []
    region, opened_at = "shared", 0
    solution_needing_starter = 0  # line of a closed SOLUTION's BEGIN, until its STARTER opens
    for line_number, line in body:
        marker = _CODE_MARKER.match(line)
        found = (marker.group("action"), marker.group("region")) if marker else None
        if solution_needing_starter and (found or line.strip()) and found != ("BEGIN", "STARTER"):
            raise _missing_starter(path, solution_needing_starter)
        if found is None:
            lines.append((region, _uncomment(line, path, line_number) if region == "starter" else line))
            continue
        action, name = found
        if action == "BEGIN":
            if region != "shared":
                raise LessonSourceError(
                    f"{path}:{line_number}: BEGIN {name} inside the {region.upper()} region opened at line {opened_at}"
                )
            if name == "STARTER" and not solution_needing_starter:
                raise LessonSourceError(
                    f"{path}:{line_number}: a STARTER region must come directly after a SOLUTION region"
                )
            region, opened_at, solution_needing_starter = name.lower(), line_number, 0
        else:
            if region != name.lower():
                raise LessonSourceError(f"{path}:{line_number}: END {name} without a matching BEGIN {name}")
            if name == "SOLUTION":
                solution_needing_starter = opened_at
            region = "shared"
    if region != "shared":
        raise LessonSourceError(f"{path}:{opened_at}: BEGIN {region.upper()} is never closed with END {region.upper()}")
    if solution_needing_starter:
        raise _missing_starter(path, solution_needing_starter)
    return lines


def _missing_starter(path: Path, line_number: int) -> LessonSourceError:
    return LessonSourceError(
        f"{path}:{line_number}: this SOLUTION region has no STARTER region right after it; "
        "add `# BEGIN STARTER`, the learner's code commented out (e.g. `# answer = ____`), `# END STARTER`"
    )


def _uncomment(line: str, path: Path, line_number: int) -> str:
    """Return a STARTER line with one ``# `` removed (``#`` alone gives an empty line)."""
    if not line.strip():
        return ""
    match = re.match(r"^(\s*)#(?: (.*)|)$", line)
    if match is None:
        raise LessonSourceError(
            f"{path}:{line_number}: lines in a STARTER region must be commented out with `# `, got {line!r}"
        )
    return (match.group(1) + (match.group(2) or "")).rstrip()


def _parse_markdown_lines(body: list[tuple[int, str]], path: Path) -> list[tuple[str, str]]:
    """Return the (region, line) pairs of a markdown cell, without their ``# `` prefix."""
    lines: list[tuple[str, str]] = []
    region, opened_at = "shared", 0
    for line_number, line in body:
        if line.strip() in ("", "#"):
            text = ""
        elif line.startswith("# "):
            text = line[2:]
        else:
            raise LessonSourceError(
                f"{path}:{line_number}: markdown cell lines must start with `# ` (or be `#` alone), got {line!r}"
            )
        marker = _MARKDOWN_MARKER.match(text)
        if marker is None:
            lines.append((region, text))
        elif marker.group("action") == "BEGIN":
            if region != "shared":
                raise LessonSourceError(f"{path}:{line_number}: BEGIN SOLUTION inside the region opened at line {opened_at}")
            region, opened_at = "solution", line_number
        else:
            if region != "solution":
                raise LessonSourceError(f"{path}:{line_number}: END SOLUTION without a matching BEGIN SOLUTION")
            region = "shared"
    if region != "shared":
        raise LessonSourceError(f"{path}:{opened_at}: <!-- BEGIN SOLUTION --> is never closed with <!-- END SOLUTION -->")
    return lines


# --------------------------------------------------------------------------- rendering


def render_notebook(lesson: Lesson, variant: str, source_label: str | None = None) -> dict:
    """Return the ``variant`` ("learner" or "solved") of ``lesson``: an nbformat v4 notebook dict, not executed.

    ``source_label`` is recorded in the notebook's metadata as the file to edit
    (default: ``lessons/<file name>``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not isinstance(lesson, Lesson):
        raise TypeError(f"lesson must be a Lesson (from parse_lesson), got {type(lesson).__name__}")
    hidden_region = "solution" if variant == "learner" else "starter"
    cells = []
    for cell in lesson.cells:
        source = _join_trimmed([text for region, text in cell.lines if region != hidden_region])
        if cell.kind == "markdown" and not source:
            continue  # all of it was a solution: the learner copy gets no empty cell
        notebook_cell = {
            "cell_type": cell.kind,
            # Ids from positions, not random ones, so rebuilding gives the same file.
            "id": f"{variant}-{len(cells):03d}",
            "metadata": {"tags": list(cell.tags)} if cell.tags else {},
            "source": source,
        }
        if cell.kind == "code":
            notebook_cell.update(execution_count=None, outputs=[])
        cells.append(notebook_cell)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": dict(KERNELSPEC),
            "language_info": {"name": "python"},
            "course": {
                "source": source_label or f"lessons/{lesson.path.name}",
                "copy": variant,
                "note": "Generated by scripts/build_notebooks.py: edit the source, not this notebook.",
                # Lets a later build tell "nobody touched this since it was built"
                # from "someone edited it" (see write_notebook).
                "built_cells_sha256": cells_fingerprint({"cells": cells}),
            },
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _join_trimmed(lines: list[str]) -> str:
    """Return ``lines`` joined by newlines, without blank lines at either end."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[start:end])


# --------------------------------------------------------------------------- files and comparison


def lesson_sources(lessons_dir: str | Path) -> list[Path]:
    """Return the lesson sources ``NN_name.py`` in ``lessons_dir``, in lesson order."""
    lessons_dir = Path(lessons_dir)
    if not lessons_dir.is_dir():
        raise FileNotFoundError(f"lessons_dir must be a directory, got {str(lessons_dir)!r}")
    return sorted(lessons_dir.glob(LESSON_GLOB))


def notebook_path(notebooks_dir: str | Path, lesson_name: str, variant: str) -> Path:
    """Return where a copy goes: ``notebooks/NAME.ipynb`` (learner), ``notebooks/solutions/NAME.ipynb`` (solved)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    folder = Path(notebooks_dir) if variant == "learner" else Path(notebooks_dir) / "solutions"
    return folder / f"{lesson_name}.ipynb"


def read_notebook(path: str | Path) -> dict:
    """Return the notebook at ``path`` as a plain dict; raise ValueError if it is not an nbformat v4 notebook."""
    with open(path, encoding="utf-8") as file:
        notebook = json.load(file)
    if not isinstance(notebook, dict) or notebook.get("nbformat") != 4 or not isinstance(notebook.get("cells"), list):
        raise ValueError(f"{path} is not an nbformat v4 notebook")
    return notebook


def _source(cell: Mapping) -> str:
    # On disk a source is a list of lines; in memory usually one string.
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def cell_signature(notebook: Mapping, with_tags: bool = True) -> list[tuple]:
    """Return each cell's (type, source[, tags]): what a rebuild would change, ignoring outputs."""
    signature = []
    for cell in notebook["cells"]:
        entry = (cell["cell_type"], _source(cell))
        signature.append(entry + (tuple(cell.get("metadata", {}).get("tags", ())),) if with_tags else entry)
    return signature


def cells_fingerprint(notebook: Mapping) -> str:
    """Return a SHA-256 hex digest of the notebook's cell types and sources (not tags or outputs)."""
    return hashlib.sha256(json.dumps(cell_signature(notebook, with_tags=False)).encode()).hexdigest()


def first_difference(old: Mapping, new: Mapping, with_tags: bool = True) -> str | None:
    """Return a description of the first cell where ``old`` and ``new`` differ, or None if none does."""
    old_cells, new_cells = cell_signature(old, with_tags), cell_signature(new, with_tags)
    for index, (old_cell, new_cell) in enumerate(zip(old_cells, new_cells)):
        if old_cell != new_cell:
            return f"cell {index} differs"
    if len(old_cells) != len(new_cells):
        return f"{len(old_cells)} cells instead of {len(new_cells)}"
    return None


def stale_notebooks(lessons_dir: str | Path, notebooks_dir: str | Path, only: str | None = None) -> list[str]:
    """Return one line per problem: a copy missing or stale against its source, a notebook without a source.

    This is what ``build_notebooks.py --check`` reports. Compares cell types,
    sources and tags, not outputs. ``only`` ("01") restricts the check to that
    lesson (and skips the search for notebooks without a source). An empty
    list means everything is up to date.
    """
    sources = lesson_sources(lessons_dir)
    if only is not None:
        sources = [path for path in sources if path.name.startswith(f"{only}_")]
    problems = [problem for source in sources for problem in stale_copies(source, notebooks_dir)]
    if only is None:
        problems += [f"{path}: no lesson source {Path(lessons_dir) / (path.stem + '.py')}"
                     for path in orphan_notebooks(lessons_dir, notebooks_dir)]
    return problems


def stale_copies(source: str | Path, notebooks_dir: str | Path) -> list[str]:
    """Return one line per copy of lesson ``source`` that is missing, unreadable or stale; [] if both are current."""
    source = Path(source)
    try:
        lesson = parse_lesson(source)
    except LessonSourceError as error:
        return [str(error)]
    problems = []
    for variant in VARIANTS:
        path = notebook_path(notebooks_dir, lesson.name, variant)
        if not path.exists():
            problems.append(f"{path}: missing (source {source})")
            continue
        try:
            committed = read_notebook(path)
        except (OSError, ValueError) as error:
            problems.append(f"{path}: unreadable ({type(error).__name__}: {error})")
            continue
        difference = first_difference(committed, render_notebook(lesson, variant))
        if difference is not None:
            problems.append(f"{path}: stale against {source}: {difference}")
    return problems


def built_notebooks(notebooks_dir: str | Path) -> list[Path]:
    """Return every learner and solved notebook in ``notebooks_dir`` (not backups or checkpoints)."""
    notebooks_dir = Path(notebooks_dir)
    return sorted(notebooks_dir.glob("*.ipynb")) + sorted((notebooks_dir / "solutions").glob("*.ipynb"))


def orphan_notebooks(lessons_dir: str | Path, notebooks_dir: str | Path) -> list[Path]:
    """Return the notebooks in ``notebooks_dir`` that no lesson source in ``lessons_dir`` builds."""
    lesson_names = {path.stem for path in lesson_sources(lessons_dir)}
    return [path for path in built_notebooks(notebooks_dir) if path.stem not in lesson_names]


def write_notebook(notebook: Mapping, path: str | Path, backup_dir: str | Path) -> Path | None:
    """Write ``notebook`` to ``path``; return the backup made of the old file, or None.

    A learner's work is never lost: when ``path`` holds a notebook someone
    edited, it is first copied to ``backup_dir/<name>.<YYYYmmdd-HHMMSS>.ipynb``.
    Edited means its cells are neither those it was built with (recorded in its
    metadata by ``render_notebook``) nor those of ``notebook``. A notebook that
    only gained outputs, or is simply older than its source, is overwritten
    without a backup.
    """
    path, backup_dir = Path(path), Path(backup_dir)
    backup = None
    if path.exists() and _edited(path, notebook):
        backup_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        backup = backup_dir / f"{path.stem}.{stamp}.ipynb"
        counter = 1
        while backup.exists():  # two builds in the same second keep both backups
            backup = backup_dir / f"{path.stem}.{stamp}-{counter}.ipynb"
            counter += 1
        shutil.copy2(path, backup)
    import nbformat  # slow to import: only when writing

    node = nbformat.from_dict(notebook)
    nbformat.validate(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(node, path)
    return backup


def _edited(path: Path, notebook: Mapping) -> bool:
    """Return True if someone changed the cells of the notebook at ``path`` since it was built."""
    try:
        existing = read_notebook(path)
    except (OSError, ValueError):  # unreadable: keep a copy rather than guess
        return True
    fingerprint = cells_fingerprint(existing)
    as_built = existing.get("metadata", {}).get("course", {}).get("built_cells_sha256")
    return fingerprint not in (as_built, cells_fingerprint(notebook))


def execution_problems(notebook: Mapping) -> list[str]:
    """Return one line per problem in an executed notebook: an error output or text on stderr.

    A cell tagged ``raises-exception`` may show an error, one tagged
    ``allow-stderr`` may write to stderr (say why in the lesson). Progress bars
    from ``tqdm.auto`` are widgets in a notebook, not stderr, so they pass.
    """
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", ())
        lines = _source(cell).strip().splitlines()
        where = f"cell {index} (`{lines[0][:60] if lines else ''}`)"
        for output in cell.get("outputs", ()):
            if output["output_type"] == "error" and TAG_RAISES not in tags:
                problems.append(f"{where}: {output['ename']}: {output['evalue']}")
            elif output["output_type"] == "stream" and output["name"] == "stderr" and TAG_ALLOW_STDERR not in tags:
                text = "".join(output["text"]).strip().splitlines()
                problems.append(f"{where}: wrote to stderr: {text[0][:200] if text else '(blank)'}")
    return problems
