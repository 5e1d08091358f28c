"""Stop `make venv` at once, saying why, when the Python it was given cannot install the tested versions.

    python3.X -m tools.check_python   # the first step of `make venv`; any Python 3 runs it

constraints.txt pins the versions the course is tested with, and some of them
exist only for Python 3.11 and newer (IPython 9, filelock 4.3, contourpy 1.3.3,
coverage 7.17...): on Python 3.10 pip would fail after minutes, with a message
about one package. Tried on Python 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (issue 22).
"""

import sys

OLDEST = (3, 11)
NEWEST = (3, 13)
SOME_NEEDING_3_11 = "IPython 9, filelock 4.3, contourpy 1.3.3, coverage 7.17"


def problem(version=sys.version_info[:2]):
    """Return why Python ``version`` (major, minor) cannot set up the course, or None when it can."""
    shown = "%d.%d" % tuple(version)
    supported = "%d.%d to %d.%d" % (OLDEST + NEWEST)
    if tuple(version) < OLDEST:
        return ("make stopped: this is Python %s; the versions the course is tested with (constraints.txt: %s, ...) "
                "need Python %s. Install one of those and run, for example, make PYTHON=python3.11 ..."
                % (shown, SOME_NEEDING_3_11, supported))
    if tuple(version) > NEWEST:
        return ("make stopped: this is Python %s; the course is tested with Python %s (torch and other pinned "
                "packages may have no release for %s yet). Run, for example, make PYTHON=python3.11 ..."
                % (shown, supported, shown))
    return None


if __name__ == "__main__":
    message = problem()
    if message:
        print(message)
        sys.exit(1)
