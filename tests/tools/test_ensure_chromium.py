"""`tools/ensure_chromium.sh` (make test, make test-browser): what it installs on the system, and how to skip it.

Each test runs the script with fake ``apt-get`` and ``id`` commands first on the PATH, so
nothing is installed and the root branch is taken whoever runs the tests; the fake
apt-get records its arguments and "installs" a stand-in browser where the script looks.
"""

import os
import shutil
import subprocess

import pytest

from course_utils import REPO_DIR

SCRIPT = REPO_DIR / "tools" / "ensure_chromium.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def run_script(tmp_path, **env) -> tuple[str, list[str]]:
    """Run the script as root with a fake apt-get; return what it printed and each apt-get call's arguments."""
    bin_dir, browser, calls = tmp_path / "bin", tmp_path / "chromium", tmp_path / "apt-calls.txt"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'case "$*" in *install*) printf "#!/bin/sh\\necho Chromium 1.0\\n" > {browser}; chmod +x {browser};; esac\n')
    for fake in ("id", "apt-get"):
        (bin_dir / fake).chmod(0o755)
    result = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CHROMIUM": str(browser), **env},
    )  # fmt: skip
    return result.stdout + result.stderr, calls.read_text().splitlines() if calls.exists() else []


def test_chromium_is_installed_without_the_packages_it_only_recommends(tmp_path):
    # Issue 31: without --no-install-recommends apt installed 115 packages (avahi-daemon, cups,
    # samba-libs...) and upgraded 15 (systemd, udev, perl).
    printed, calls = run_script(tmp_path)
    assert calls == ["update -qq", "install -y -qq --no-install-recommends chromium"]
    assert "Installed Chromium 1.0." in printed and "SKIP_BROWSER_INSTALL=1" in printed


def test_skip_browser_install_installs_nothing_and_says_how_to_install_it(tmp_path):
    printed, calls = run_script(tmp_path, SKIP_BROWSER_INSTALL="1")
    assert calls == []
    assert printed.startswith("SKIP_BROWSER_INSTALL=1: Chromium not installed, the browser test will be skipped.")
    assert "apt-get install -y -qq --no-install-recommends chromium" in printed


def test_a_chromium_already_there_is_left_alone(tmp_path):
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    assert run_script(tmp_path) == ("", [])


def test_the_readme_says_what_make_test_installs_and_how_to_skip_it():
    readme = (REPO_DIR / "README.md").read_text()
    assert "--no-install-recommends" in readme and "SKIP_BROWSER_INSTALL=1" in readme
