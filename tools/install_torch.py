"""Install the pinned torch into this Python, as the CPU build unless the machine has an NVIDIA GPU.

    .venv/bin/python -m tools.install_torch   # what `make venv` runs, before everything else

The pin (constraints.txt) says ``torch==2.13.0``. Which build pip picks for it
depends on where it looks, and on Linux the package registry's torch is the
multi-GB CUDA build (``2.13.0``, with its ``nvidia-*`` packages), useless
without an NVIDIA GPU. So, without a GPU:

- a CPU wheel already on this machine (pip's ``find-links``, as on the course
  machines; it holds a wheel for some Pythons only) is used as it is;
- otherwise, on Linux, exactly ``torch==2.13.0+cpu`` is asked for, with
  PyPI's sibling index of CPU wheels (``CPU_INDEX``) added: no CUDA build can
  match that version, so when the CPU wheel cannot be had (index unreachable,
  no wheel for this Python) pip stops, and so does this script, saying why
  and what to do; it never falls back to the CUDA build (issue 22: with
  Python 3.12 and the CPU index unreachable, pip quietly took it);
- on macOS and Windows the registry's torch is the CPU build.

Installed first and alone, so no later install can bring another build; and
checked afterwards: a CUDA build without a GPU is an error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tools import pip_install
from tools.pip_install import why_unreachable

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


@dataclass(frozen=True)
class Build:
    """A torch build: its version as pip reports it (``2.13.0+cpu``) and whether it needs CUDA."""

    version: str
    cuda: bool

    def is_version(self, pin: str) -> bool:
        """Return True if this build is release ``pin`` (``2.13.0``), whatever its build label."""
        return self.version.split("+")[0] == pin


def build_of(version: str, requires: list[str] | None) -> Build:
    """Return the build of a torch ``version`` whose dependencies are ``requires`` (its ``Requires-Dist`` lines).

    A CUDA build says so in its label (``+cu130``) or, as the registry's Linux
    wheel does, depends on NVIDIA's ``nvidia-*`` packages.
    """
    label = version.partition("+")[2]
    cuda = label.startswith(("cu", "rocm")) or any(line.strip().lower().startswith("nvidia-") for line in requires or ())
    return Build(version, cuda)


def installed_build() -> Build | None:
    """Return the torch build installed in this Python, or None."""
    try:
        return build_of(metadata.version("torch"), metadata.requires("torch"))
    except metadata.PackageNotFoundError:
        return None


def local_wheel_build() -> Build | None:
    """Return the build of the pinned torch that pip finds without any index (find-links only), or None."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
         "--ignore-installed", "--report", "-", "-c", str(CONSTRAINTS), "torch"],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    try:
        found = json.loads(result.stdout)["install"][0]["metadata"]
        return build_of(found["version"], found.get("requires_dist"))
    except (ValueError, KeyError, IndexError):
        return None


def has_nvidia_gpu() -> bool:
    """Return True if an NVIDIA driver is installed (its ``nvidia-smi`` is on the PATH)."""
    return shutil.which("nvidia-smi") is not None


def pip_arguments(pin: str, installed: Build | None, local_wheel: Build | None, gpu: bool,
                  platform: str = sys.platform) -> list[str] | None:
    """Return the arguments after ``pip`` that install torch ``pin``, or None when nothing needs installing.

    Without ``gpu``, what they install is never a CUDA build (module docstring);
    ``platform`` is ``sys.platform``'s value.
    """
    if installed is not None and installed.is_version(pin) and (gpu or not installed.cuda):
        return None
    command = ["install", "--quiet", "-c", str(CONSTRAINTS)]
    if gpu:
        return command + ["torch"]  # the wheel on this machine, or the registry's CUDA build
    if local_wheel is not None and local_wheel.is_version(pin) and not local_wheel.cuda:
        return command + [f"torch=={local_wheel.version}"]
    if platform.startswith("linux"):
        return command + [f"torch=={pin}+cpu", "--extra-index-url", CPU_INDEX]
    return command + [f"torch=={pin}"]  # macOS, Windows: the registry's build is the CPU one


def python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def failure_message(pin: str, arguments: list[str], why: str | None = None) -> str:
    """Return what to tell the learner when pip could not install ``arguments`` (the CPU build); ``why``: the cause, if known."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    where = why or f"{CPU_INDEX} has none (unreachable, or no wheel for this Python there: see pip's lines above)"
    return "\n".join([
        f"make venv stopped: torch {pin}'s CPU build for Python {python_version()} could not be installed.",
        f"  It is not on this machine (pip's find-links), and {where}.",
        "  The package registry's Linux torch is the CUDA build (several GB, useless without an NVIDIA GPU),",
        "  so it was not taken. What to do, then `make clean-venv` and make again:",
        f"  - connect to the internet (pip must reach {CPU_INDEX}), or",
        "  - use a Python this machine has a torch CPU wheel for (make PYTHON=python3.X ...), or",
        f"  - download torch-{pin}+cpu-{tag}-*.whl from {CPU_INDEX}/torch/ into a folder and",
        "    add it to pip's find-links (PIP_FIND_LINKS=/that/folder).",
    ])  # fmt: skip


def main() -> int:
    pin, gpu = pinned_version(), has_nvidia_gpu()
    arguments = pip_arguments(pin, installed_build(), local_wheel_build(), gpu)
    if arguments is None:
        return 0
    if "--extra-index-url" in arguments:
        unreachable = why_unreachable(CPU_INDEX)
        if unreachable is not None:  # pip would retry for a minute, then speak of "conflicting dependencies"
            print(failure_message(pin, arguments, f"{CPU_INDEX} cannot be reached ({unreachable})"), file=sys.stderr)
            return 1
        print(f"installing torch's CPU build from {CPU_INDEX} (no GPU here, no local torch CPU wheel)")
    if pip_install.main(arguments) != 0:  # offline: one line says so
        if "--extra-index-url" in arguments:
            print(failure_message(pin, arguments), file=sys.stderr)
        return 1
    built = installed_build()
    if not gpu and (built is None or built.cuda):
        print(f"make venv stopped: pip installed torch {built.version if built else '(nothing)'}, a CUDA build, "
              f"on a machine without an NVIDIA GPU; run `make clean-venv` and report this.", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
