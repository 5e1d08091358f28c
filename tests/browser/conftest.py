"""Fixtures of the browser tests: one headless Chromium and one JupyterLab server per test session.

Run them alone with `make test-browser` (or `pytest tests/browser`); `make test`
runs them with everything else. Screenshots go to test-artifacts/browser/ (under
`make test`, BROWSER_SCREENSHOTS=0, only those of failures), and the end of the
run prints how long each lesson's browser test took.

Every browser test is skipped, with the reason, when Chromium or Playwright is
missing; `make test`, `make test-browser` and `.ci/run` install Chromium first
(`tools/ensure_chromium.sh`).
"""

from __future__ import annotations

import pytest
from lab_helpers import (
    ARTIFACTS_DIR,
    SCREENSHOTS,
    chromium_missing_reason,
    copy_learner_notebooks,
    launch_chromium,
    running_lab,
)

# The browser and each page keep this size; screenshots are this wide.
VIEWPORT = {"width": 1280, "height": 900}


def pytest_collection_modifyitems(config, items):
    reason = chromium_missing_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


# For each lesson, the seconds its browser test took (opening, live runs, screenshots), printed at the end.
LESSON_TIMES: dict[str, float] = {}
# Set when a test asked for the screenshots folder, so the summary names it only then.
SCREENSHOTS_TAKEN: list[bool] = []


def pytest_terminal_summary(terminalreporter):
    if LESSON_TIMES:
        terminalreporter.write_line("Lessons in JupyterLab (seconds per lesson: open, live cells, screenshots):")
        for name, seconds in sorted(LESSON_TIMES.items()):
            terminalreporter.write_line(f"  {name}: {seconds:.0f} s")
        terminalreporter.write_line(f"  all lessons: {sum(LESSON_TIMES.values()):.0f} s")
    if SCREENSHOTS_TAKEN:
        what = "screenshots" if SCREENSHOTS else "screenshots of failures (BROWSER_SCREENSHOTS=0)"
        terminalreporter.write_line(f"Browser test {what}: {ARTIFACTS_DIR}")


@pytest.fixture(scope="session")
def artifacts_dir():
    """The folder the screenshots go to: test-artifacts/browser/ in the repository."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS_DIR.glob("*-failure.png"):  # from an earlier failed run
        stale.unlink()
    SCREENSHOTS_TAKEN.append(True)
    return ARTIFACTS_DIR


@pytest.fixture(scope="session")
def lesson_times():
    """A dict the lesson tests fill with {lesson stem: seconds the lesson's browser test took}."""
    return LESSON_TIMES


@pytest.fixture(scope="session")
def browser():
    """Headless Debian Chromium, driven by Playwright; closed at the end of the session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # Keep each phase's report on the test item, so the page fixture knows whether the test failed.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(browser, request, artifacts_dir):
    """A fresh browser tab (own cookies and storage), closed after the test without 'leave page?' prompts.

    When the test fails, the tab is saved first as ``<test name>-failure.png``.
    """
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    try:
        yield tab
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
            tab.screenshot(path=str(artifacts_dir / f"{name}-failure.png"))
        context.close()


@pytest.fixture(scope="session")
def lab_workdir(tmp_path_factory):
    """A throw-away copy of notebooks/ (no solutions), with data/ and course_utils/ beside it."""
    workdir = tmp_path_factory.mktemp("lab-copy")
    copy_learner_notebooks(workdir)
    return workdir


@pytest.fixture(scope="session")
def lab_server(lab_workdir, tmp_path_factory):
    """One JupyterLab server over the copied notebooks for the whole session, stopped at its end."""
    state_dir = tmp_path_factory.mktemp("lab-state")
    with running_lab([f"--notebook-dir={lab_workdir / 'notebooks'}"], cwd=lab_workdir, state_dir=state_dir) as server:
        yield server


@pytest.fixture
def shutdown_kernels(lab_server):
    """Shut every kernel down after the test, so lessons run one after another do not pile up memory."""
    yield
    lab_server.shutdown_all_kernels()


@pytest.fixture
def lab_page(shutdown_kernels, page):
    """A browser tab for the session's JupyterLab server.

    After the test the tab is closed (and saved first if the test failed), then
    the kernels are shut down: fixtures are torn down in the reverse order of
    the arguments above, so the failure screenshot still shows a live kernel.
    """
    return page
