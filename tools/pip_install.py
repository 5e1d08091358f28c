"""Run pip for `make venv`, and when it fails because no package index can be reached, say so in one line.

    .venv/bin/python -m tools.pip_install install --quiet -c constraints.txt -e ".[test]"

Offline, pip does not say "no network": it retries each index five times for
every package (minutes), then reports the packages it could not find as
"conflicting dependencies" (issue 22). So this first asks each package index
pip is configured with for one small page; when none of the network ones
answers, pip runs without retries (what this machine holds may still be
enough: pip's find-links, ``file://`` indexes). pip's output is kept in
``.venv/pip-install.log``. When pip fails with no index reachable, one line
says so, naming the index and why, instead of pip's lines; any other failure
shows pip's own output. On success it prints nothing: even with ``--quiet``
pip passes on what the build backend says (setuptools' "!!" block about
editable installs, in a learner's first ``make lab``); it stays in the log.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_INDEX = "https://pypi.org/simple"
LOG = Path(sys.prefix) / "pip-install.log"
PROBE_TIMEOUT_S = 10


def configured_indexes() -> list[str]:
    """Return the package indexes this Python's pip reads (``index-url`` and ``extra-index-url``, any scope)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    main, extra = DEFAULT_INDEX, []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        urls = " ".join(shlex.split(value)).split()  # pip prints a list as one quoted, space-separated value
        if key.endswith(".index-url") and urls:
            main = urls[0]
        elif key.endswith(".extra-index-url"):
            extra += urls
    return [main, *extra]


def why_unreachable(url: str) -> str | None:
    """Return why ``url`` (a package index) cannot be read now, or None when it answers."""
    if url.startswith("file://"):
        return None if Path(url.removeprefix("file://")).is_dir() else "no such folder"
    probe = urllib.request.Request(url.rstrip("/") + "/pip/", method="HEAD")  # one small page
    try:
        with urllib.request.urlopen(probe, timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # it answered (an index may refuse a bare listing)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return str(reason) or type(reason).__name__


def no_index_line(urls: list[str], why: dict[str, str | None]) -> str | None:
    """Return the one line to print when no network index in ``urls`` answers (``why[url]``), else None."""
    remote = [url for url in urls if not url.startswith("file://")]
    if not remote or any(why[url] is None for url in remote):
        return None
    first = remote[0]
    return (f"make venv stopped: no package index reachable ({first}: {why[first]}); pip needs the internet, "
            f"or a mirror in PIP_INDEX_URL, to install the pinned packages: connect and run make again "
            f"(pip's own output: {LOG})")  # fmt: skip


def main(argv: list[str]) -> int:
    urls = configured_indexes()
    line = no_index_line(urls, {url: why_unreachable(url) for url in urls})
    retries = ["--retries", "0", "--timeout", str(PROBE_TIMEOUT_S)] if line and argv[:1] == ["install"] else []
    result = subprocess.run([sys.executable, "-m", "pip", *argv, *retries], capture_output=True, text=True)
    LOG.write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode == 0:
        return 0  # what pip printed (setuptools' "!!" block on editable installs, ...) stays in the log
    if line is None:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        print(f"make venv stopped: `pip {shlex.join(argv)}` failed (its output above)", file=sys.stderr)
    else:
        print(line, file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
