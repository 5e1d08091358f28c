"""Drive JupyterLab in headless Chromium the way a learner does: open a notebook, run it, look at it.

The browser tests use these helpers in three steps:

1. ``running_lab(...)`` starts a JupyterLab server from this Python environment
   on a free localhost port with a random token and throw-away settings, and
   always stops it (and its kernels) afterwards;
2. ``open_notebook``, ``run_all_above`` and ``rerun_cell``
   work the notebook through the JupyterLab user interface (the menus and keys
   a learner uses);
3. ``read_cells`` reads back what a learner sees in each cell: the prompt,
   error and stderr boxes, figures, widgets and exercise feedback.

Playwright only drives Debian's Chromium (``/usr/bin/chromium``); it never
downloads a browser of its own.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kernel_env import course_kernel_spec, learner_env  # noqa: E402  (tests/ is on the path: pyproject.toml)

REPO_DIR = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_DIR / "notebooks"
# Screenshots land here (ignored by git through /test-artifacts/).
ARTIFACTS_DIR = REPO_DIR / "test-artifacts" / "browser"

# BROWSER_SCREENSHOTS=0 (make test) saves only the screenshots of failures: the tall ones
# of every lesson and slider cost Chromium about 30 CPU-s and check nothing.
SCREENSHOTS = os.environ.get("BROWSER_SCREENSHOTS", "1") != "0"

CHROMIUM = Path("/usr/bin/chromium")
# The background-networking flags stop Chromium calling Google's services, which a
# closed network refuses many times a second; the rest keep a headless run quiet.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]

# Without these JupyterLab asks whether to fetch news, looks for updates and lists
# extensions on the internet: the same flags make lab uses (tools/open_lab.py).
from tools.open_lab import LAB_OFFLINE_ARGS  # noqa: E402

# Settings written into the throw-away user-settings folder of every test server.
LAB_USER_SETTINGS = {
    # Never show the "fetch official Jupyter news?" toast over the notebook.
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    # Keep every cell attached to the page, so the tests can read cells that are
    # scrolled out of view (the default only renders what is on screen).
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

# The three outcomes of an exercise check, as course_utils.exercises labels them.
FEEDBACK_LABELS = ("Not attempted yet", "Incorrect", "Correct")
# Shown when the check itself is broken: never acceptable in a lesson.
CHECK_ERROR_LABEL = "The check itself failed"
# Plain-text stand-ins a learner sees where a figure or widget should be: a figure
# returned as a value ("<Figure size 640x480 with 1 Axes>", "(<Figure ...>, <Axes: >)"),
# a plot call's return value ("[<matplotlib.lines.Line2D at 0x...>]", "Text(0.5, 1.0, 'loss')"),
# or a widget's repr shown as text ("VBox(children=...", a tqdm bar "planning:   0%|   | 0/4"),
# which is what JupyterLab shows of a widget output the build left with its repr
# (tools/notebook_widgets.py, on the path above).
from tools.notebook_widgets import WIDGET_REPR_PATTERN, WIDGET_VIEW  # noqa: E402, F401 (WIDGET_VIEW: for the tests)

PLACEHOLDER_PATTERN = (
    r"^\(?(<Figure size \d+x\d+ with \d+ Axes>|<Axes: |\[<matplotlib\.|Text\()|" + WIDGET_REPR_PATTERN
)


def chromium_missing_reason() -> str | None:
    """Return why the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return (
            f"Chromium is not installed ({CHROMIUM} is missing): the browser test needs Debian's chromium. "
            "Install it with `bash tools/ensure_chromium.sh` (as root) or `sudo apt-get install chromium`."
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed: run `make venv` (it is in the [test] extra)."
    return None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def isolated_lab_env(state_dir: Path, user_settings: dict | None = None) -> dict[str, str]:
    """Return an environment for a JupyterLab server whose config, settings and workspaces live in ``state_dir``.

    Nothing the test does (open tabs, settings, kernel history) leaks into the
    learner's own Jupyter folders, and nothing of theirs changes what the test sees.
    Its kernels are the course kernel, offline through the kernelspec, as in ``make lab``.
    ``user_settings`` ({plugin id: settings}) replaces ``LAB_USER_SETTINGS``.
    """
    folders = {
        "JUPYTER_CONFIG_DIR": state_dir / "config",
        "JUPYTER_RUNTIME_DIR": state_dir / "runtime",
        "JUPYTERLAB_SETTINGS_DIR": state_dir / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": state_dir / "lab-workspaces",
        "IPYTHONDIR": state_dir / "ipython",
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    for plugin, settings in (LAB_USER_SETTINGS if user_settings is None else user_settings).items():
        package, plugin_name = plugin.rsplit("/", 1)
        settings_file = folders["JUPYTERLAB_SETTINGS_DIR"] / package / f"{plugin_name}.jupyterlab-settings"
        settings_file.parent.mkdir(parents=True, exist_ok=True)
        settings_file.write_text(json.dumps(settings, indent=2))

    # The learner's environment (tests/kernel_env.py: not the test process's own, which sets
    # OMP_NUM_THREADS); its kernels add the course kernelspec's variables, as in make lab.
    env = learner_env()
    env.update({name: str(folder) for name, folder in folders.items()})
    # A server started from a test must not open a desktop browser of its own.
    env.pop("BROWSER", None)
    return env


@dataclass
class LabServer:
    """A JupyterLab server started by ``running_lab``."""

    process: subprocess.Popen
    port: int
    token: str
    log_path: Path
    workspaces_dir: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """Return the address of ``path`` (e.g. ``lab/tree/01_x.ipynb``) with the token."""
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def api(self, method: str, path: str, timeout_s: float = 10.0) -> object:
        """Call the server's REST API (``path`` like ``api/kernels``); return the decoded JSON or None."""
        request = urllib.request.Request(
            f"{self.base_url}/{path.lstrip('/')}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 3000) -> str:
        """Return the end of the server's log, for failure messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    def shutdown_all_kernels(self) -> int:
        """Shut down every running kernel (frees its memory); return how many there were."""
        kernels = self.api("GET", "api/kernels") or []
        for kernel in kernels:
            try:
                self.api("DELETE", f"api/kernels/{kernel['id']}", timeout_s=30)
            except urllib.error.HTTPError as error:
                if error.code != 404:  # already gone is fine
                    raise
        return len(kernels)


def _printed_token(server: LabServer, timeout_s: float) -> str:
    """Return the token in the first URL the server printed (waiting for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.process.poll() is None:
        found = re.search(r"[?&]token=([0-9a-f]+)", server.log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.5)
    raise TimeoutError(f"JupyterLab printed no URL with a token within {timeout_s:.0f} s:\n{server.log_tail()}")


def _wait_until_ready(server: LabServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with code {server.process.returncode} while starting:\n{server.log_tail()}"
            )
        try:
            urllib.request.urlopen(f"{server.url('api/status')}", timeout=2).read()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer /api/status within {timeout_s:.0f} s:\n{server.log_tail()}")


def _stop(server: LabServer) -> None:
    """Stop the server: shut its kernels down, then SIGTERM, wait, and SIGKILL if it hangs."""
    if server.process.poll() is None:
        try:
            server.shutdown_all_kernels()
        except (OSError, urllib.error.URLError):
            pass  # the server is going down anyway; SIGTERM below also stops kernels
        server.process.terminate()
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            # The server runs in its own process group: kill all of it.
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)


@contextmanager
def running_lab(
    lab_args: list[str],
    *,
    cwd: Path,
    state_dir: Path,
    startup_timeout_s: float = 120.0,
    user_settings: dict | None = None,
    own_token: bool = False,
) -> Iterator[LabServer]:
    """Run ``python -m jupyter lab <lab_args>`` in ``cwd`` for the duration of the ``with`` block.

    The server listens on a free port of 127.0.0.1 with a random token, keeps its
    settings and workspaces in ``state_dir`` (see ``isolated_lab_env``) and never
    opens a browser unless ``lab_args`` says how (``user_settings``: see
    ``isolated_lab_env``). It is stopped, kernels included, when the block
    ends, also when a test inside it fails. With ``own_token`` the server makes
    its own token, as for a learner, and prints it (read from its log).
    """
    course_kernel_spec()  # the lessons' kernel ("python3") is the course's, as make venv installs it
    port, token = free_port(), secrets.token_hex(16)
    env = isolated_lab_env(state_dir, user_settings)
    workspaces_dir = Path(env["JUPYTERLAB_WORKSPACES_DIR"])
    command = [
        sys.executable, "-m", "jupyter", "lab",
        *lab_args,
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        *([] if own_token else [f"--IdentityProvider.token={token}"]),
        f"--LabApp.workspaces_dir={workspaces_dir}",
        # Only those lab_args lacks: an option given twice ("got 2 values") makes
        # JupyterLab drop its whole LabApp configuration, settings folder included.
        *(arg for arg in LAB_OFFLINE_ARGS if arg not in lab_args),
    ]  # fmt: skip
    if not any(arg.startswith(("--ServerApp.browser", "--ServerApp.open_browser")) for arg in lab_args):
        command.append("--no-browser")
    if os.geteuid() == 0 and "--allow-root" not in lab_args:
        # Containers and CI often run as root; Jupyter refuses that unless told.
        command.append("--allow-root")
    log_path = state_dir / "jupyterlab.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(process, port, token, log_path, workspaces_dir)
    try:
        if own_token:
            server.token = _printed_token(server, startup_timeout_s)
        _wait_until_ready(server, startup_timeout_s)
        yield server
    finally:
        _stop(server)


def copy_learner_notebooks(destination: Path) -> Path:
    """Copy the learner notebooks and the landing README into ``destination/notebooks``; return that folder.

    The browser runs and may autosave the copies, never the committed notebooks.
    The solutions are left out: the browser test is about the learner's copies.
    Every other top-level entry of the repository (``data/``, ``course_utils/``,
    the Makefile...) is linked beside the copy, so relative paths such as
    ``../data`` mean what they mean in the repository.
    """
    target = destination / "notebooks"
    shutil.copytree(
        NOTEBOOKS_DIR,
        target,
        ignore=shutil.ignore_patterns("solutions", ".backups", ".ipynb_checkpoints"),
    )
    for entry in REPO_DIR.iterdir():
        if entry.name not in ("notebooks", ".git", "test-artifacts") and not (destination / entry.name).exists():
            (destination / entry.name).symlink_to(entry)
    return target


# --------------------------------------------------------------------------- in the browser


def launch_chromium(playwright):
    """Start headless Debian Chromium through Playwright, with a fresh profile; return the Browser."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)


# True when the status bar reads "<kernel name> | Idle" and the toolbar's indicator agrees.
# The toolbar alone says idle for a moment before the kernel even exists.
_KERNEL_IDLE_JS = """
() => {
  const texts = Array.from(document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem'))
    .map(e => e.textContent.trim());
  const indicator = document.querySelector(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
  return texts.some(t => /\\S \\| Idle$/.test(t)) && indicator?.getAttribute('data-status') === 'idle';
}
"""


def kernel_is_idle(page) -> bool:
    """Return True when the open notebook's kernel is started and idle, as JupyterLab shows it."""
    return page.evaluate(_KERNEL_IDLE_JS)


def wait_for_kernel_idle(page, timeout_s: float = 120.0) -> None:
    """Wait until the open notebook's kernel is started and idle (status bar and toolbar)."""
    page.wait_for_function(_KERNEL_IDLE_JS, timeout=timeout_s * 1000, polling=250)


def open_notebook(page, server: LabServer, name: str, timeout_s: float = 120.0) -> None:
    """Open ``name`` (a path under the server's notebook folder) in JupyterLab and wait for its idle kernel.

    The notebook opens in a workspace of its own: JupyterLab would otherwise
    reopen every notebook an earlier test opened, each with a kernel.
    """
    workspace = "".join(c if c.isalnum() else "-" for c in name) + "-" + secrets.token_hex(4)
    page.goto(server.url(f"lab/workspaces/{workspace}/tree/{name}"))
    expected_cells = len(server.api("GET", f"api/contents/{name}?content=1")["content"]["cells"])
    page.wait_for_function(
        "(n) => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell').length === n",
        arg=expected_cells,
        timeout=timeout_s * 1000,
    )
    wait_for_kernel_idle(page, timeout_s)


def click_menu(page, menu: str, item: str) -> None:
    """Click ``menu`` in JupyterLab's menu bar, then ``item`` in it (e.g. "Run", "Run All Cells")."""
    page.locator("#jp-menu-panel .lm-MenuBar-itemLabel", has_text=menu).first.click()
    entry = page.locator(".lm-Menu:not(.lm-MenuBar) .lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel")
    entry.get_by_text(item, exact=True).first.click()


# What the learner sees in each cell, read in one pass inside the page.
_READ_CELLS_JS = """
(args) => {
  const [feedbackLabels, checkErrorLabel, placeholderPattern] = args;
  const placeholder = new RegExp(placeholderPattern);
  const rawFeedback = new RegExp('(\\\\*\\\\*|<span style)[^\\n]*(' + feedbackLabels.concat([checkErrorLabel]).join('|') + ')');
  const notebook = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const cells = Array.from(notebook.querySelectorAll(':scope .jp-Cell'));
  return cells.map((cell, index) => {
    const isCode = cell.classList.contains('jp-CodeCell');
    const prompt = isCode ? (cell.querySelector('.jp-InputPrompt')?.textContent || '').trim() : '';
    const source = (cell.querySelector('.jp-InputArea-editor .cm-content')?.innerText || '').trim();
    const outputs = Array.from(cell.querySelectorAll('.jp-OutputArea-output'));
    const stderr = outputs
      .filter(o => o.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr')
      .map(o => o.innerText.trim());
    const texts = outputs.map(o => o.innerText);
    const feedback = [];
    for (const text of texts) {
      for (const line of text.split('\\n')) {
        for (const label of [checkErrorLabel, ...feedbackLabels]) {
          if (line.trim().startsWith(label + ':') || line.includes(': ' + label + ':')) { feedback.push(label); break; }
        }
      }
    }
    return {
      index,
      isCode,
      prompt,
      source: source.slice(0, 300),
      stderr,
      widgetErrors: texts.filter(t => t.includes('Error displaying widget')).map(t => t.trim().slice(0, 300)),
      plainTexts: outputs.filter(o => o.getAttribute('data-mime-type') === 'text/plain').map(o => o.innerText.trim()),
      placeholders: outputs
        .filter(o => o.getAttribute('data-mime-type') === 'text/plain')
        .map(o => o.innerText.trim())
        .filter(t => placeholder.test(t)),
      images: cell.querySelectorAll('.jp-OutputArea-output img').length,
      // Feedback labels shown by an output rendered as Markdown, and feedback shown with its markup as plain text.
      markdownFeedback: Array.from(cell.querySelectorAll('.jp-OutputArea-output.jp-RenderedMarkdown'))
        .flatMap(o => feedbackLabels.concat([checkErrorLabel]).filter(label => o.innerText.includes(label + ':'))),
      rawMarkup: outputs
        .filter(o => !o.classList.contains('jp-RenderedMarkdown') && !o.classList.contains('jp-RenderedHTMLCommon'))
        .map(o => o.innerText)
        .filter(t => rawFeedback.test(t)).map(t => t.trim().slice(0, 200)),
      widgets: cell.querySelectorAll('.jp-OutputArea .jupyter-widgets').length,
      sliders: cell.querySelectorAll('.jp-OutputArea .widget-slider').length,
      feedback,
    };
  });
}
"""


def read_cells(page) -> list[dict]:
    """Return what a learner sees in each cell of the open notebook, one dict per cell.

    Keys: ``index``, ``isCode``, ``prompt`` ("[3]:", "[*]:", "[ ]:"), ``source``
    (the first 300 characters), ``stderr`` (texts of error and stderr boxes;
    JupyterLab shows tracebacks as stderr), ``widgetErrors``, ``placeholders``
    (plain-text outputs matching ``PLACEHOLDER_PATTERN``), ``plainTexts`` (the
    texts of all plain-text outputs), ``images``,
    ``widgets`` and ``sliders`` (counts in the outputs), ``feedback`` (exercise
    labels shown, such as "Not attempted yet"), ``markdownFeedback`` (the labels
    shown by outputs rendered as Markdown), ``rawMarkup`` (output texts showing
    Markdown or HTML markup, ``**`` or ``<span style``, instead of rendering it).
    """
    return page.evaluate(_READ_CELLS_JS, [list(FEEDBACK_LABELS), CHECK_ERROR_LABEL, PLACEHOLDER_PATTERN])


# The prompt of every code cell, by cell index: a cheap poll while a notebook runs.
_PROMPTS_JS = """
() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell'))
  .map((cell, index) => [index, cell.classList.contains('jp-CodeCell')
                                ? (cell.querySelector('.jp-InputPrompt')?.textContent || '').trim() : ''])
"""


def wait_until_run_finished(page, timeout_s: float) -> list[dict]:
    """Wait until no cell is queued or running and the kernel is idle; return ``read_cells``.

    Stops waiting early when a cell raised: JupyterLab then abandons the rest
    of the queue, and the failure is the thing to report.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    quiet_polls = 0
    while True:
        busy = [index for index, prompt in page.evaluate(_PROMPTS_JS) if prompt == "[*]:"]
        now = time.monotonic()
        if not busy and kernel_is_idle(page):
            # The kernel can be idle for a moment between two cells: require two quiet polls.
            quiet_polls += 1
            if quiet_polls >= 2:
                return read_cells(page)
        else:
            quiet_polls = 0
        if now > deadline:
            raise TimeoutError(f"cells {busy} still queued or running after {timeout_s:.0f} s")
        # Most waits are for one short cell: poll often at first, so the test does not
        # sit idle for seconds after every cell (about 30 such waits per run).
        page.wait_for_timeout(250 if now - started < 5 else 1000)


# Marks a cell's prompt when JupyterLab rewrites it ("[*]:", then "[n]:"): a run can end
# on the number the committed notebook showed, so comparing texts alone could wait forever.
_WATCH_PROMPT_JS = """
(cell) => {
  const prompt = cell.querySelector('.jp-InputPrompt');
  delete cell.dataset.promptRewritten;
  const observer = new MutationObserver(() => { cell.dataset.promptRewritten = '1'; observer.disconnect(); });
  observer.observe(prompt, {childList: true, characterData: true, subtree: true});
}
"""
# True once a watched cell's prompt was rewritten and shows an execution count.
_PROMPT_REWRITTEN_JS = """
(index) => {
  const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')[index];
  const prompt = cell.querySelector('.jp-InputPrompt').textContent.trim();
  return cell.dataset.promptRewritten === '1' && /^\\[\\d+\\]:$/.test(prompt);
}
"""


def run_all_above(page, index: int, timeout_s: float) -> list[dict]:
    """Select cell ``index``, run every cell above it from the Run menu, and wait; return ``read_cells``."""
    cell = _cell(page, index)
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").click()  # selects the cell without entering the editor
    first = next(i for i, prompt in page.evaluate(_PROMPTS_JS) if prompt)  # the first code cell
    _cell(page, first).evaluate(_WATCH_PROMPT_JS)
    click_menu(page, "Run", "Run All Above Selected Cell")
    page.wait_for_function(_PROMPT_REWRITTEN_JS, arg=first, timeout=timeout_s * 1000)
    return wait_until_run_finished(page, timeout_s)


def rerun_cell(page, index: int, timeout_s: float = 60.0) -> dict:
    """Run cell ``index`` (again) the way a learner does (select it, Ctrl+Enter); return its new ``read_cells`` entry."""
    cell = _cell(page, index)
    cell.scroll_into_view_if_needed()
    # Clicking the prompt selects the cell without entering the editor.
    cell.locator(".jp-InputPrompt").click()
    cell.evaluate(_WATCH_PROMPT_JS)
    page.keyboard.press("Control+Enter")
    page.wait_for_function(_PROMPT_REWRITTEN_JS, arg=index, timeout=timeout_s * 1000)
    return wait_until_run_finished(page, timeout_s)[index]


def _cell(page, index: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)


def move_slider(page, cell_index: int) -> tuple[str, str]:
    """Move the first slider in cell ``cell_index``'s output by one step with the keyboard; return its readouts.

    Focuses the slider's handle and presses the right arrow key, as a learner
    may; a slider already at its maximum is moved left instead. Returns the
    slider's readout before and after (e.g. ``("0.90", "0.91")``).
    """
    slider = _cell(page, cell_index).locator(".jp-OutputArea .widget-slider").first
    readout = slider.locator(".widget-readout")
    slider.scroll_into_view_if_needed()
    before = readout.inner_text().strip()
    for key in ("ArrowRight", "ArrowLeft"):
        slider.locator(".noUi-handle").first.focus()
        page.keyboard.press(key)
        page.wait_for_timeout(300)
        after = readout.inner_text().strip()
        if after != before:
            return before, after
    return before, before


def image_sources(page, cell_index: int) -> list[str]:
    """Return the ``src`` of every image in cell ``cell_index``'s outputs (data: URLs for figures)."""
    return _cell(page, cell_index).locator(".jp-OutputArea-output img").evaluate_all("images => images.map(i => i.src)")


def wait_for_new_figure(page, cell_index: int, old_sources: list[str], timeout_s: float = 60.0) -> list[str]:
    """Wait until cell ``cell_index`` shows figures other than ``old_sources``; return their ``src``."""
    page.wait_for_function(
        """([index, old]) => {
             const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')[index];
             const now = Array.from(cell.querySelectorAll('.jp-OutputArea-output img')).map(i => i.src);
             return now.length > 0 && now.some(src => !old.includes(src));
           }""",
        arg=[cell_index, old_sources],
        timeout=timeout_s * 1000,
    )
    return image_sources(page, cell_index)


def open_dialogs(page) -> list[str]:
    """Return the text of every JupyterLab dialog on screen (e.g. "Kernel Restarting"), empty when none."""
    return page.locator(".jp-Dialog").all_inner_texts()


def screenshot_cell(page, cell_index: int, path: Path, max_height_px: int = 15000) -> Path:
    """Save cell ``cell_index`` (source and outputs) as PNG at ``path``; return ``path``.

    The window is stretched to fit a cell taller than the screen, as in ``screenshot_notebook``.
    Saves nothing when ``SCREENSHOTS`` is off.
    """
    if not SCREENSHOTS:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cell = _cell(page, cell_index)
    viewport = page.viewport_size
    cell_height = cell.evaluate("c => c.getBoundingClientRect().height")
    try:
        # Room for the menu, toolbar and status bar around the notebook.
        page.set_viewport_size(
            {"width": viewport["width"], "height": int(min(max(viewport["height"], cell_height + 300), max_height_px))}
        )
        page.wait_for_timeout(300)  # let JupyterLab lay out the taller window
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(path))
    finally:
        page.set_viewport_size(viewport)
    return path


_CONTENT_HEIGHT_JS = """s => {
    const cells = s.querySelectorAll('.jp-Cell');
    const last = cells[cells.length - 1];
    const bottom = last ? last.getBoundingClientRect().bottom - s.getBoundingClientRect().top + s.scrollTop : s.scrollHeight;
    return [Math.ceil(bottom), s.clientHeight];
}"""


def screenshot_notebook(page, path: Path, max_height_px: int = 15000) -> list[Path]:
    """Save the whole open notebook as PNG, as tall as its content; return the files written.

    The notebook scrolls inside its own panel, so a plain full-page screenshot
    shows one screen. The viewport is stretched to the notebook's height
    instead; a notebook taller than ``max_height_px`` (Chromium's limit is
    near 16,000 pixels) is saved in parts, ``<name>-part2.png`` and so on.
    Saves nothing (returns []) when ``SCREENSHOTS`` is off.
    """
    if not SCREENSHOTS:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    viewport = page.viewport_size
    scroller = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    # The notebook's height is where its last cell ends: the panel scrolls on past
    # it (room to scroll the last cell up), and a part showing only that room is blank.
    content_height, client_height = page.eval_on_selector(scroller, _CONTENT_HEIGHT_JS)
    wanted = viewport["height"] + max(0, content_height - client_height)
    height = min(wanted, max_height_px)
    written = []
    try:
        page.set_viewport_size({"width": viewport["width"], "height": height})
        page.wait_for_timeout(500)  # let JupyterLab lay out the taller window
        visible = page.eval_on_selector(scroller, "s => s.clientHeight")
        parts = max(1, -(-content_height // max(1, visible)))
        for part in range(parts):
            page.eval_on_selector(scroller, "(s, top) => { s.scrollTop = top; }", part * visible)
            page.wait_for_timeout(200)
            target = path if part == 0 else path.with_name(f"{path.stem}-part{part + 1}{path.suffix}")
            page.screenshot(path=str(target))
            written.append(target)
    finally:
        page.set_viewport_size(viewport)
    return written
