"""`make lab` opens on the lessons: the first page a learner sees lists every lesson, in order, as links.

The browser test starts JupyterLab with the arguments ``make lab`` uses (``make -n
lab`` names the command, ``python -m tools.open_lab``, whose ``--print-command`` prints
the ``jupyter lab`` line), on the learner's working copies made as ``make lab``
makes them, lets the server "open the browser" as it does for a learner, and
follows that same page in Chromium.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from lab_helpers import NOTEBOOKS_DIR, REPO_DIR, copy_learner_notebooks, running_lab, wait_for_kernel_idle

from tools import open_lab

LANDING_PAGE = NOTEBOOKS_DIR / "README.md"
# Every lesson with a source, in order.
LESSON_NUMBERS = sorted(path.name[:2] for path in (REPO_DIR / "lessons").glob("[0-9][0-9]_*.py"))
# A Markdown link to a notebook next to the README: [text](NN_name.ipynb)
LESSON_LINK = re.compile(r"\[([^\]]+)\]\((\d\d_[A-Za-z0-9_]+\.ipynb)\)")


def make_lab_arguments() -> list[str]:
    """Return the arguments ``make lab`` passes to ``jupyter lab`` (the words after ``lab``).

    ``make -n`` prints the command with the Makefile's variables expanded, without
    running it; ``-o`` keeps it from printing the virtual environment's set-up.
    That command, given ``--print-command``, prints the ``jupyter lab`` line it runs.
    """
    printed = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "lab"],
        cwd=REPO_DIR, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in printed.splitlines():
        words = shlex.split(line)
        if "tools.open_lab" in words:
            lab_line = subprocess.run(
                [sys.executable, *words[1:], "--print-command"], cwd=REPO_DIR, capture_output=True, text=True, check=True
            ).stdout
            lab_words = shlex.split(lab_line)
            start = lab_words.index("lab")
            assert lab_words[start - 2 : start] == ["-m", "jupyter"], lab_line
            return lab_words[start + 1 :]
    raise AssertionError(f"`make -n lab` runs no tools.open_lab:\n{printed}")


def lesson_links(markdown: str) -> list[tuple[str, str]]:
    """Return the ``(text, target)`` of every link to a lesson notebook in ``markdown``, in order."""
    return LESSON_LINK.findall(markdown)


def test_landing_page_links_every_lesson_in_order():
    targets = [target for _, target in lesson_links(LANDING_PAGE.read_text())]
    assert [target[:2] for target in targets] == LESSON_NUMBERS
    missing = [target for target in targets if not (NOTEBOOKS_DIR / target).is_file()]
    assert not missing, f"notebooks/README.md links to notebooks that do not exist: {missing}"


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed: `make lab` cannot run here")


@needs_make
def test_make_lab_opens_the_landing_page():
    args = make_lab_arguments()
    opened = [arg for arg in args if not arg.startswith("-")]
    assert opened == ["my-notebooks/README.md"], f"make lab should open my-notebooks/README.md, it opens {opened}"
    assert "--notebook-dir=my-notebooks" in args
    assert ("--allow-root" in args) is (os.geteuid() == 0), "as root, Jupyter refuses to start without --allow-root"


@pytest.fixture(scope="module")
def make_lab_server(tmp_path_factory):
    """JupyterLab as ``make lab`` starts it, on working copies made as it makes them: ``(server, folder)``.

    The folder has the repository's layout (see copy_learner_notebooks), so the
    Makefile's relative paths mean the same thing there. The server "opens the
    browser" by running a command that records the page it was given (the
    file:// page that redirects to what make lab opens) in ``opened-url.txt``.
    Only the course's own settings apply (jupyterlab-settings/, none of the
    other browser tests' settings), as for a learner.
    """
    folder = tmp_path_factory.mktemp("make-lab")
    copy_learner_notebooks(folder)
    open_lab.sync_working_copies(folder / "notebooks", folder / "my-notebooks")  # as make lab does
    recorder = f"import sys, pathlib; pathlib.Path({str(folder / 'opened-url.txt')!r}).write_text(sys.argv[1])"
    # As on a learner's desktop: a browser to open (make lab leaves it closed where Python's
    # webbrowser finds none, as here); the server's start-up log kept, for the checks below.
    desktop = [arg for arg in make_lab_arguments() if arg not in ("--ServerApp.open_browser=False", "--LabApp.log_level=WARN")]
    lab_args = [*desktop, f"--ServerApp.browser={shlex.join([sys.executable, '-c', recorder])} %s"]
    with running_lab(lab_args, cwd=folder, state_dir=folder / "lab-state", user_settings={}) as server:
        yield server, folder


@needs_make
def test_make_labs_server_fetches_no_news_checks_no_update_and_lists_no_pypi_extensions(make_lab_server):
    # Each of these answers from the server itself; with JupyterLab's defaults each
    # would first try the internet (news feed, latest release, PyPI).
    server, _ = make_lab_server
    assert server.api("GET", "lab/api/news") == {"news": []}
    assert server.api("GET", "lab/api/update") == {"notification": None}
    extensions = server.api("GET", "lab/api/extensions?refresh=0")
    assert isinstance(extensions, list), extensions
    log = server.log_path.read_text(errors="replace")
    assert "error linking extension" not in log, log[-3000:]
    assert "Extension Manager is 'readonly'" in log, log[-3000:]


@needs_make
@pytest.mark.browser
def test_make_lab_shows_the_lessons_in_order_with_links_that_open_them(browser, artifacts_dir, make_lab_server):
    server, folder = make_lab_server
    opened_url = folder / "opened-url.txt"
    deadline = time.monotonic() + 60
    while not opened_url.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert opened_url.exists(), f"make lab's server never opened a browser:\n{server.log_tail()}"

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(opened_url.read_text().strip())
        page.wait_for_url(re.compile(r"/lab/tree/README\.md"), timeout=30_000)
        shown = page.locator(
            ".jp-MainAreaWidget:not(.lm-mod-hidden) :is(.jp-RenderedMarkdown, .jp-FileEditor)"
        ).first
        try:
            shown.wait_for(timeout=30_000)
        finally:
            page.screenshot(path=str(artifacts_dir / "landing-page.png"))
        readme = page.locator(".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-RenderedMarkdown")
        assert readme.count() == 1, (
            "make lab opens my-notebooks/README.md as raw Markdown in the text editor, not rendered with links: "
            "JupyterLab opens .md files in the editor unless the setting "
            "@jupyterlab/docmanager-extension:plugin defaultViewers maps markdown to 'Markdown Preview' "
            f"(screenshot {artifacts_dir / 'landing-page.png'})"
        )
        current_tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
        assert current_tab.first.inner_text() == "README.md"

        # JupyterLab rewrites [text](01_x.ipynb) to http://.../files/01_x.ipynb?_xsrf=...
        links = readme.locator("a[href*='.ipynb']")
        names = links.evaluate_all("links => links.map(a => decodeURIComponent(new URL(a.href).pathname.split('/').pop()))")
        assert [name[:2] for name in names] == LESSON_NUMBERS, f"lesson links on the landing page: {names}"

        for index, name in enumerate(names):
            if not (folder / "my-notebooks" / name).is_file():
                continue  # the file-level test above reports a missing lesson
            links.nth(index).click()
            page.wait_for_function(
                "(name) => Array.from(document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current'))"
                ".some(t => t.textContent.trim() === name)",
                arg=name,
                timeout=30_000,
            )
            assert current_tab.first.inner_text() == name
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.wait_for(timeout=30_000)
            wait_for_kernel_idle(page)
            # Back to the landing page for the next link, as a learner would.
            page.locator("#jp-main-dock-panel .lm-TabBar-tabLabel", has_text="README.md").click()
            readme.wait_for()
    finally:
        context.close()


@needs_make
@pytest.mark.browser
def test_make_labs_terminal_shows_a_url_of_the_landing_page_and_no_log(browser, artifacts_dir, tmp_path):
    # Issue 22: the terminal showed "No web browser found", the 19 language servers not
    # installed and the start-up log, and the printed URL opened the Launcher, not README.md.
    copy_learner_notebooks(tmp_path)
    open_lab.sync_working_copies(tmp_path / "notebooks", tmp_path / "my-notebooks")
    args = make_lab_arguments()
    if "--ServerApp.open_browser=False" not in args:
        args.append("--ServerApp.open_browser=False")  # a machine with a browser: as make lab runs without one
    with running_lab(args, cwd=tmp_path, state_dir=tmp_path / "lab-state", user_settings={}, own_token=True) as server:
        log = server.log_path.read_text(errors="replace")
        urls = re.findall(r"http://127\.0\.0\.1:\d+/\S+", log)
        assert urls and all("/lab/tree/README.md?token=" in url for url in urls), log
        for noise in ("No web browser found", "Skipped non-installed server", "[I ", "[W ", "!!"):
            assert noise not in log, f"{noise!r} in make lab's terminal:\n{log}"
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        try:
            page.goto(urls[0])
            page.locator(".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-RenderedMarkdown").first.wait_for(timeout=60_000)
            current_tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
            assert current_tab.first.inner_text() == "README.md"
        finally:
            page.screenshot(path=str(artifacts_dir / "landing-page-from-printed-url.png"))
            context.close()
