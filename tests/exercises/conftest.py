"""What the exercise tests share: a launch-ready process for the ones that launch workers (marker ``forks``)."""

import sys

import pytest


@pytest.fixture(autouse=True)
def launchable(request, monkeypatch):
    """No bitsandbytes in sys.modules for a `forks` test (other tests import it; the launcher refuses to fork with it)."""
    if request.node.get_closest_marker("forks") is not None:
        monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)
