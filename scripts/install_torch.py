"""Install the pinned torch into this Python, as the CPU build unless the machine has an NVIDIA GPU.

    .venv/bin/python scripts/install_torch.py   # what `make venv` runs, before everything else

The pin (constraints.txt) says ``torch==2.13.0``. Which build pip picks for it
depends on where it looks:

- a wheel already on this machine (pip's ``find-links``, as on the course
  machines): used as it is, no network;
- otherwise, on Linux the package registry's torch is the multi-GB CUDA build.
  Without a GPU this script adds PyTorch's CPU wheel index as an extra index:
  its ``2.13.0+cpu`` satisfies ``==2.13.0`` and sorts above ``2.13.0``, so pip
  takes it, and the other packages still come from the usual index.

Installed first and alone, so no later install can bring another build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO_DIR / "constraints.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pinned_version(constraints: Path = CONSTRAINTS) -> str:
    """Return the version constraints.txt pins torch to, e.g. ``"2.13.0"``."""
    for line in constraints.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("torch=="):
            return line.removeprefix("torch==")
    raise ValueError(f"{constraints} pins no torch version")


def installed_version() -> str | None:
    """Return the version of torch installed in this Python (``"2.13.0+cpu"``), or None."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def local_wheel_version() -> str | None:
    """Return the version of the pinned torch that pip finds without any index (find-links only), or None."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
         "--ignore-installed", "--report", "-", "-c", str(CONSTRAINTS), "torch"],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    try:
        return json.loads(result.stdout)["install"][0]["metadata"]["version"]
    except (ValueError, KeyError, IndexError):
        return None


def has_nvidia_gpu() -> bool:
    """Return True if an NVIDIA driver is installed (its ``nvidia-smi`` is on the PATH)."""
    return shutil.which("nvidia-smi") is not None


def pip_arguments(pin: str, installed: str | None, local_wheel: str | None, gpu: bool) -> list[str] | None:
    """Return the arguments after ``pip`` that install torch ``pin``, or None when nothing needs installing.

    ``installed`` and ``local_wheel`` are versions as pip reports them (``2.13.0+cpu``).
    """
    if installed is not None and installed.split("+")[0] == pin:
        return None
    command = ["install", "--quiet", "-c", str(CONSTRAINTS), "torch"]
    if local_wheel is not None or gpu:
        return command  # the wheel on this machine, or the registry's CUDA build for a GPU
    return command + ["--extra-index-url", CPU_INDEX]


def main() -> int:
    arguments = pip_arguments(pinned_version(), installed_version(), local_wheel_version(), has_nvidia_gpu())
    if arguments is None:
        return 0
    if "--extra-index-url" in arguments:
        print(f"installing torch's CPU build from {CPU_INDEX} (no GPU here, no local torch wheel)")
    return subprocess.run([sys.executable, "-m", "pip", *arguments]).returncode


if __name__ == "__main__":
    sys.exit(main())
