"""The landing page's lesson times are measured, this version's, and written from the build's record.

``tools/build_notebooks.py`` times each learner copy's run into
``notebooks/lesson_times.json`` and writes the table of ``notebooks/README.md``
from it (``tools/lesson_times.py``); nothing here runs a lesson except the demo.
"""

import json

import nbformat
import pytest

from course_utils import REPO_DIR
from tools import build_notebooks, lesson_times
from tools.notebook_source import lesson_sources, notebook_path

NOTEBOOKS_DIR = REPO_DIR / "notebooks"
LESSONS = [path.stem for path in lesson_sources(REPO_DIR / "lessons")]
FIXTURES = REPO_DIR / "tests" / "fixtures" / "lessons"


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_lessons_time_was_measured_on_this_version_of_it(lesson):
    recorded = lesson_times.read_times(NOTEBOOKS_DIR).get(lesson)
    committed = nbformat.read(notebook_path(NOTEBOOKS_DIR, lesson, "learner"), as_version=4)
    retime = f"python -m tools.build_notebooks --times --only {lesson[:2]}"
    assert recorded is not None, f"no run time recorded for {lesson}: {retime}"
    assert recorded["cells_sha256"] == committed.metadata.course.built_cells_sha256, \
        f"{lesson}'s recorded time is another version's: {retime}"
    assert recorded["seconds"] > 0 and recorded["cores"] >= 1 and recorded["cpu"]


def test_the_landing_page_shows_the_recorded_times_and_types_none():
    readme = (NOTEBOOKS_DIR / "README.md").read_text()
    assert lesson_times.with_table(readme, lesson_times.read_times(NOTEBOOKS_DIR)) == readme, \
        "python -c 'from tools import lesson_times; lesson_times.write_readme_table(\"notebooks\")'"
    assert "a minute or so" not in readme  # issue 32: typed, and not this version's


def test_the_table_has_a_row_per_lesson_in_order_with_its_machine():
    times = {"02_b": {"seconds": 312.4, "cpu": "Some CPU", "cores": 2, "load_average": 3.5},
             "01_a": {"seconds": 41.0, "cpu": "Some CPU", "cores": 8, "load_average": None}}
    assert lesson_times.table(times).splitlines()[1:-1] == [
        "| Lesson | Run All took | on | cores | load average then |",
        "| --- | --- | --- | --- | --- |",
        "| 1 | 41 s | Some CPU | 8 | unknown |",
        "| 2 | 5.2 min | Some CPU | 2 | 3.5 |",
    ]


def test_a_page_without_the_markers_is_refused_by_name():
    with pytest.raises(ValueError, match="must hold the markers"):
        lesson_times.with_table("# a page\n", {})


def test_a_run_time_that_is_not_positive_is_refused(tmp_path):
    for seconds in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="seconds must be a positive run time"):
            lesson_times.record(tmp_path, "01_a", "abc", seconds)


def test_the_build_records_the_learner_copys_run_time_and_rewrites_the_table(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "README.md").write_text(f"# Course\n\n{lesson_times.BEGIN}\n{lesson_times.END}\n")

    assert build_notebooks.main(["--only", "00", "--lessons-dir", str(FIXTURES), "--notebooks-dir", str(notebooks)]) == 0

    (entry,) = json.loads((notebooks / "lesson_times.json").read_text()).values()
    built = nbformat.read(notebooks / "00_demo.ipynb", as_version=4)
    assert entry["cells_sha256"] == built.metadata.course.built_cells_sha256 and entry["seconds"] > 0
    assert f"| 0 | {lesson_times.shown_time(entry['seconds'])} |" in (notebooks / "README.md").read_text()
