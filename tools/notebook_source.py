"""One source per lesson, two notebooks: the learner copy and the solved copy.

A lesson source ``lessons/NN_name.py`` is a Python file in jupytext's "percent"
format (https://jupytext.readthedocs.io/en/latest/formats-scripts.html), read and
written by jupytext itself: ``# %%`` starts a code cell, ``# %% [markdown]`` a
markdown cell, tags and titles as jupytext writes them (``# %% tags=["hide-input"]``),
and the YAML header jupytext adds when an author pairs the file in JupyterLab and
saves it is fine. An author can open a lesson in JupyterLab as a notebook.

On top of the format, the course adds solution regions, which this module checks:

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

``build_notebooks.py`` (beside this file) writes and executes the notebooks;
this module parses, renders, compares and writes them, and is what the tests
use. Notebooks are nbformat objects throughout. Cells keep their tags (nbval's
``nbval-check-output`` among them); other cell metadata (titles, jupytext's
layout hints) stays in the source.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jupytext
import nbformat
from tools.notebook_widgets import widget_text_problems

VARIANTS = ("learner", "solved")
"""The two copies of a lesson: learner (exercises left blank) and solved."""

LESSON_GLOB = "[0-9][0-9]_*.py"
LESSON_FORMAT = "py:percent"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (course)", "language": "python"}

# Cell tags the builder honours when it checks an executed notebook.
TAG_RAISES = "raises-exception"  # the cell shows an error on purpose (nbclient's own tag)
TAG_ALLOW_STDERR = "allow-stderr"  # the cell writes to stderr on purpose

# jupytext's own pattern for a percent-format cell marker, used only to number lines in errors.
_CELL_MARKER = re.compile(r"^\s*#\s*%%(%*)(\s.*)?$")
_CODE_MARKER = re.compile(r"^\s*#\s*(?P<action>BEGIN|END)\s+(?P<region>SOLUTION|STARTER)\s*$")
_MARKDOWN_MARKER = re.compile(r"^\s*<!--\s*(?P<action>BEGIN|END)\s+SOLUTION\s*-->\s*$")
# jupytext uncomments IPython magics (`# %time ...` in the file is `%time ...` in the cell).
_MAGIC = re.compile(r"^\s*[%!]")


class LessonSourceError(ValueError):
    """A lesson source breaks a rule of the solution regions; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class SourceCell:
    """One cell of a lesson source.

    ``lines`` pairs each line with its region: ``"shared"`` (both copies),
    ``"solution"`` (solved copy only) or ``"starter"`` (learner copy only,
    already uncommented). Markdown lines are as jupytext reads them (no ``# ``).
    """

    kind: str  # "code" or "markdown"
    tags: tuple[str, ...]
    line_number: int  # of the cell's first line in the source file, counted from 1
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
    notebook = jupytext.reads(text, fmt=LESSON_FORMAT)
    if not any(cell.source.strip() for cell in notebook.cells):
        raise LessonSourceError(f"{path}:1: no cells: start each cell with a `# %%` line")
    file_lines = text.splitlines()
    cells = []
    for cell, (start, end) in zip(notebook.cells, _cell_spans(file_lines, len(notebook.cells))):
        numbered = _number_lines(cell.source.splitlines(), file_lines, start, end, cell.cell_type == "markdown")
        parse_body = _parse_code_lines if cell.cell_type == "code" else _parse_markdown_lines
        tags = tuple(cell.metadata.get("tags", ()))
        cells.append(SourceCell(cell.cell_type, tags, start + 1, tuple(parse_body(numbered, path))))
    return Lesson(path, tuple(cells))


def _cell_spans(file_lines: list[str], n_cells: int) -> list[tuple[int, int]]:
    """Return each cell's (first, end) 0-based line range in the file, for error messages.

    A cell starts at its ``# %%`` marker; when jupytext found one cell more than
    markers, the first cell is the text before the first marker (after any header).
    """
    markers = [index for index, line in enumerate(file_lines) if _CELL_MARKER.match(line)]
    if n_cells == len(markers) + 1:
        markers.insert(0, _header_end(file_lines))
    markers = (markers + [len(file_lines)] * n_cells)[:n_cells]
    return list(zip(markers, markers[1:] + [len(file_lines)]))


def _header_end(file_lines: list[str]) -> int:
    """Return the index of the first line after jupytext's ``# ---`` YAML header (0 if none)."""
    if file_lines and file_lines[0].strip() == "# ---":
        for index in range(1, len(file_lines)):
            if file_lines[index].strip() == "# ---":
                return index + 1
    return 0


def _number_lines(source: list[str], file_lines: list[str], start: int, end: int, markdown: bool) -> list[tuple[int, str]]:
    """Pair each line of a cell's source with its 1-based line number in the file.

    Lines are matched in order within the cell's span ``[start, end)``, as they
    appear in the file: a markdown line behind ``# ``, a magic behind ``# ``. A
    line not found gets the number after the previous one.
    """
    numbered, position = [], start
    for line in source:
        if markdown:
            candidates = {"#", ""} if not line.strip() else {f"# {line}".rstrip()}
        else:
            candidates = {line.rstrip(), f"# {line.lstrip()}".rstrip()}
        found = next((i for i in range(position + 1, end) if file_lines[i].strip() and file_lines[i].rstrip() in candidates
                      or not file_lines[i].strip() and not line.strip()), None)
        position = found if found is not None else position + 1
        numbered.append((position + 1, line))
    return numbered


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
    if _MAGIC.match(line):  # jupytext already took its comment off
        return line.rstrip()
    match = re.match(r"^(\s*)#(?: (.*)|)$", line)
    if match is None:
        raise LessonSourceError(
            f"{path}:{line_number}: lines in a STARTER region must be commented out with `# `, got {line!r}"
        )
    return (match.group(1) + (match.group(2) or "")).rstrip()


def _parse_markdown_lines(body: list[tuple[int, str]], path: Path) -> list[tuple[str, str]]:
    """Return the (region, line) pairs of a markdown cell, checking its SOLUTION regions."""
    lines: list[tuple[str, str]] = []
    region, opened_at = "shared", 0
    for line_number, text in body:
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


def render_notebook(lesson: Lesson, variant: str, source_label: str | None = None) -> nbformat.NotebookNode:
    """Return the ``variant`` ("learner" or "solved") of ``lesson``: an nbformat v4 notebook, not executed.

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
        make = nbformat.v4.new_code_cell if cell.kind == "code" else nbformat.v4.new_markdown_cell
        # Ids from positions, not random ones, so rebuilding gives the same file.
        notebook_cell = make(source, id=f"{variant}-{len(cells):03d}")
        if cell.tags:
            notebook_cell.metadata["tags"] = list(cell.tags)
        cells.append(notebook_cell)
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.nbformat_minor = 5
    notebook.metadata = nbformat.from_dict({
        "kernelspec": dict(KERNELSPEC),
        "language_info": {"name": "python"},
        "course": {
            "source": source_label or f"lessons/{lesson.path.name}",
            "copy": variant,
            "note": "Generated by scripts/build_notebooks.py: edit the source, not this notebook.",
            # Lets a later build tell "nobody touched this since it was built"
            # from "someone edited it" (see write_notebook), and `make lab` tell
            # a learner's copy made from an older lesson (tools/open_lab.py).
            "built_cells_sha256": cells_fingerprint(notebook),
        },
    })
    return notebook


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


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Return the notebook at ``path``; raise ValueError if it is not an nbformat v4 notebook."""
    with open(path, encoding="utf-8") as file:
        raw = json.load(file)  # a learner's broken file is a ValueError, not a log line
    if not isinstance(raw, dict) or raw.get("nbformat") != 4 or not isinstance(raw.get("cells"), list):
        raise ValueError(f"{path} is not an nbformat v4 notebook")
    return nbformat.from_dict(raw)


def _source(cell) -> str:
    # On disk a source may be a list of lines; nbformat.read joins them, a plain dict may not.
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def cell_signature(notebook, with_tags: bool = True) -> list[tuple]:
    """Return each cell's (type, source[, tags]): what a rebuild would change, ignoring outputs."""
    signature = []
    for cell in notebook["cells"]:
        entry = (cell["cell_type"], _source(cell))
        signature.append(entry + (tuple(cell.get("metadata", {}).get("tags", ())),) if with_tags else entry)
    return signature


def cells_fingerprint(notebook) -> str:
    """Return a SHA-256 hex digest of the notebook's cell types and sources (not tags or outputs)."""
    return hashlib.sha256(json.dumps(cell_signature(notebook, with_tags=False)).encode()).hexdigest()


def first_difference(old, new, with_tags: bool = True) -> str | None:
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
    sources and tags, not outputs (except the widgets' texts, see ``stale_copies``). ``only`` ("01") restricts the check to that
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


def stale_copies(source: str | Path, notebooks_dir: str | Path, widget_texts: bool = True) -> list[str]:
    """Return one line per copy of lesson ``source`` that is missing, unreadable or stale; [] if both are current.

    With ``widget_texts``, a copy whose widget outputs lack the build's texts
    (``notebook_widgets.with_widget_texts``) is stale too.
    """
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
        elif widget_texts:
            fix = f"python -m tools.build_notebooks --widget-texts --only {lesson.name[:2]}"
            problems += [f"{path}: {problem} (fix: {fix})" for problem in widget_text_problems(committed)]
    return problems


def built_notebooks(notebooks_dir: str | Path) -> list[Path]:
    """Return every learner and solved notebook in ``notebooks_dir`` (not backups or checkpoints)."""
    notebooks_dir = Path(notebooks_dir)
    return sorted(notebooks_dir.glob("*.ipynb")) + sorted((notebooks_dir / "solutions").glob("*.ipynb"))


def orphan_notebooks(lessons_dir: str | Path, notebooks_dir: str | Path) -> list[Path]:
    """Return the notebooks in ``notebooks_dir`` that no lesson source in ``lessons_dir`` builds."""
    lesson_names = {path.stem for path in lesson_sources(lessons_dir)}
    return [path for path in built_notebooks(notebooks_dir) if path.stem not in lesson_names]


def write_notebook(notebook, path: str | Path, backup_dir: str | Path) -> Path | None:
    """Write ``notebook`` to ``path``; return the backup made of the old file, or None.

    Whoever edited a course notebook keeps their work: when ``path`` holds a
    notebook someone edited, it is first copied to
    ``backup_dir/<name>.<YYYYmmdd-HHMMSS>.ipynb``. Edited means its cells are
    neither those it was built with (recorded in its metadata by
    ``render_notebook``) nor those of ``notebook``. A notebook that only gained
    outputs, or is simply older than its source, is overwritten without a backup.
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
    node = nbformat.from_dict(notebook)
    nbformat.validate(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(node, path)
    return backup


def _edited(path: Path, notebook) -> bool:
    """Return True if someone changed the cells of the notebook at ``path`` since it was built."""
    try:
        existing = read_notebook(path)
    except (OSError, ValueError):  # unreadable: keep a copy rather than guess
        return True
    fingerprint = cells_fingerprint(existing)
    as_built = existing.get("metadata", {}).get("course", {}).get("built_cells_sha256")
    return fingerprint not in (as_built, cells_fingerprint(notebook))


def execution_problems(notebook) -> list[str]:
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
