"""The three descriptions of the environment agree: pyproject.toml, environment.yml, constraints.txt."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def pyproject_requirements():
    project = pyproject()["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["test"]
    return {Requirement(line).name.lower(): Requirement(line) for line in listed}


def conda_pip_lines():
    environment = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    return environment, pip_section


def constraint_pins():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = Version(version)
    return pins


def test_environment_yml_lists_the_same_packages_as_pyproject():
    _, pip_lines = conda_pip_lines()
    conda_names = {line.lower() for line in pip_lines if not line.startswith("-")}
    assert conda_names == set(pyproject_requirements())


def test_environment_yml_uses_the_constraints_file_and_installs_the_package():
    _, pip_lines = conda_pip_lines()
    assert "-c constraints.txt" in pip_lines
    assert "-e ." in pip_lines


def test_conda_python_satisfies_requires_python():
    environment, _ = conda_pip_lines()
    python = next(item for item in environment["dependencies"] if isinstance(item, str) and item.startswith("python="))
    assert Version(python.split("=")[1]) in SpecifierSet(pyproject()["project"]["requires-python"])


def test_every_tested_version_is_inside_the_pyproject_range():
    pins = constraint_pins()
    for name, requirement in pyproject_requirements().items():
        assert name in pins, f"{name} has no tested version in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )


# ----------------------------------------------------------------------------- setting up .venv

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from tools import install_torch  # noqa: E402


CPU, CUDA = install_torch.Build("2.13.0+cpu", cuda=False), install_torch.Build("2.13.0", cuda=True)
NVIDIA_REQUIRES = ["filelock", "nvidia-cublas==13.1.0.3; platform_system == 'Linux'", "sympy>=1.13.3"]


def wanted_torch(arguments):
    return next(argument for argument in arguments if argument.startswith("torch"))


def test_a_cuda_build_is_told_by_its_label_or_its_nvidia_requirements():
    assert install_torch.build_of("2.13.0", NVIDIA_REQUIRES).cuda
    assert install_torch.build_of("2.13.0+cu130", []).cuda
    assert not install_torch.build_of("2.13.0+cpu", ["filelock", "sympy>=1.13.3"]).cuda
    assert not install_torch.build_of("2.13.0", None).cuda  # macOS and Windows: the registry's build


def test_torch_install_uses_the_cpu_wheel_on_this_machine_when_there_is_one():
    assert wanted_torch(install_torch.pip_arguments("2.13.0", None, local_wheel=CPU, gpu=False)) == "torch==2.13.0+cpu"


@pytest.mark.parametrize("local_wheel", [None, CUDA, install_torch.Build("2.12.0+cpu", cuda=False)])
def test_on_linux_without_a_gpu_only_the_cpu_build_can_match(local_wheel):
    # Issue 22: with Python 3.12 (no local wheel) and the CPU index unreachable, pip took the
    # registry's CUDA build. `==2.13.0+cpu` matches no CUDA build: pip stops instead.
    arguments = install_torch.pip_arguments("2.13.0", None, local_wheel=local_wheel, gpu=False, platform="linux")
    assert wanted_torch(arguments) == "torch==2.13.0+cpu"
    assert arguments[-2:] == ["--extra-index-url", install_torch.CPU_INDEX]
    assert install_torch.CPU_INDEX.endswith("/whl/cpu")


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_on_macos_and_windows_the_registrys_cpu_build_is_taken(platform):
    arguments = install_torch.pip_arguments("2.13.0", None, local_wheel=None, gpu=False, platform=platform)
    assert wanted_torch(arguments) == "torch==2.13.0" and "--extra-index-url" not in arguments


def test_with_a_gpu_torch_comes_from_the_usual_index():
    arguments = install_torch.pip_arguments("2.13.0", None, local_wheel=None, gpu=True, platform="linux")
    assert wanted_torch(arguments) == "torch" and "--extra-index-url" not in arguments


def test_an_installed_pinned_cpu_torch_is_left_alone_and_a_cuda_one_replaced_without_a_gpu():
    assert install_torch.pip_arguments("2.13.0", CPU, local_wheel=None, gpu=False) is None
    assert install_torch.pip_arguments("2.13.0", CUDA, local_wheel=None, gpu=True) is None
    assert wanted_torch(install_torch.pip_arguments("2.13.0", CUDA, local_wheel=None, gpu=False, platform="linux")) \
        == "torch==2.13.0+cpu"
    older = install_torch.Build("2.12.0+cpu", cuda=False)
    assert install_torch.pip_arguments("2.13.0", older, local_wheel=None, gpu=False) is not None


def test_when_the_cpu_build_cannot_be_had_the_message_says_why_and_what_to_do():
    arguments = install_torch.pip_arguments("2.13.0", None, local_wheel=None, gpu=False, platform="linux")
    message = install_torch.failure_message("2.13.0", arguments)
    assert message.startswith("make venv stopped: torch 2.13.0's CPU build for Python ")
    for needed in (install_torch.CPU_INDEX, "CUDA build", "not taken", "make clean-venv", "PIP_FIND_LINKS", "make PYTHON="):
        assert needed in message, needed


def test_the_torch_pin_is_read_from_constraints(tmp_path):
    assert Version(install_torch.pinned_version()) == constraint_pins()["torch"]
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# a comment naming torch==0.1\ntorchvision==0.28.0\ntorch==2.99.1  # the tested one\n")
    assert install_torch.pinned_version(constraints) == "2.99.1"
    constraints.write_text("numpy==2.3.5\n")
    with pytest.raises(ValueError, match="pins no torch version"):
        install_torch.pinned_version(constraints)


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_venv_commands(tmp_path, **variables) -> list[str]:
    """Return the commands `make venv` runs for a .venv not made yet, as `make -n` prints them (none is run)."""
    settings = [f"{name}={value}" for name, value in {"VENV": tmp_path / "venv", **variables}.items()]
    result = subprocess.run(["make", "-n", "--no-print-directory", *settings, "venv"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return [line for line in result.stdout.splitlines() if not line.lstrip().startswith("#")]  # the recipe's comments


def first_command_with(commands: list[str], text: str) -> int:
    """Return the index of the first command that contains ``text``."""
    return next(index for index, command in enumerate(commands) if text in command)


@needs_make
def test_make_venv_installs_torch_first_through_the_script_with_the_python_asked_for(tmp_path):
    commands = make_venv_commands(tmp_path, PYTHON="python3.12")
    assert first_command_with(commands, "install_torch") < first_command_with(commands, '-e ".[test]"')
    assert "python3.12 -m venv" in commands[first_command_with(commands, "-m venv")]
    assert "make PYTHON=" in (REPO / "README.md").read_text()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_venv_without_pip_is_detected_with_what_to_do(tmp_path):
    # What `python -m venv` leaves when Debian's python3.X-venv is missing: a python, no pip.
    half_made = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(half_made)], check=True)
    result = subprocess.run(
        ["make", "--no-print-directory", f"VENV={half_made}", f"PYTHON={sys.executable}", "venv"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"{half_made} has no pip" in result.stdout
    assert f"python{version}-venv" in result.stdout and "make clean-venv" in result.stdout
    assert not (half_made / ".installed").exists()


from tools import pip_install  # noqa: E402


def test_offline_make_venv_says_in_one_line_that_no_package_index_answers():
    # Issue 22: offline, pip retried, then reported "conflicting dependencies" for torch.
    urls = ["https://pypi.org/simple", "file:///opt/pypi/simple"]
    line = pip_install.no_index_line(urls, {urls[0]: "[Errno -3] Temporary failure in name resolution", urls[1]: None})
    assert line.startswith("make venv stopped: no package index reachable (https://pypi.org/simple: [Errno -3]")
    assert "\n" not in line and "internet" in line and "PIP_INDEX_URL" in line


def test_a_failure_with_an_index_answering_is_left_to_pips_own_output():
    urls = ["https://pypi.org/simple", "https://mirror.example/simple"]
    assert pip_install.no_index_line(urls, {urls[0]: "timed out", urls[1]: None}) is None
    assert pip_install.no_index_line(["file:///opt/pypi/simple"], {"file:///opt/pypi/simple": "no such folder"}) is None


def test_a_package_index_that_does_not_answer_is_named_with_the_reason(tmp_path):
    assert pip_install.why_unreachable(tmp_path.as_uri()) is None
    assert pip_install.why_unreachable((tmp_path / "absent").as_uri()) == "no such folder"
    assert pip_install.why_unreachable("http://127.0.0.1:9/simple") is not None  # the discard port: refused


@needs_make
def test_every_pip_install_of_make_venv_goes_through_the_script_that_explains_failures(tmp_path):
    commands = make_venv_commands(tmp_path)
    assert not [command for command in commands if "-m pip install" in command]
    installs = [command for command in commands if "pip_install" in command and " install " in command]
    assert [("--upgrade pip" in command, '-e ".[test]"' in command) for command in installs] == [(True, False), (False, True)]


from tools import check_python  # noqa: E402


@pytest.mark.parametrize("version", [(3, 11), (3, 12), (3, 13)])
def test_the_pythons_the_readme_names_pass_the_check(version):
    assert check_python.problem(version) is None
    assert f"3.{version[1]}" in (REPO / "README.md").read_text()


def test_python_3_10_is_stopped_at_once_saying_why_and_what_to_do():
    # Issue 22: the pins include versions that need 3.11 (IPython 9.18, filelock 4.3.1, ...).
    message = check_python.problem((3, 10))
    assert message.startswith("make stopped: this is Python 3.10;")
    assert "constraints.txt" in message and "3.11 to 3.13" in message and "make PYTHON=python3.11" in message
    assert "3.14" in check_python.problem((3, 14))


@needs_make
def test_the_makefile_checks_the_python_before_making_the_venv(tmp_path):
    commands = make_venv_commands(tmp_path)
    assert first_command_with(commands, "check_python") < first_command_with(commands, "-m venv")


def fake_python(path, body: str):
    """Write an executable script at ``path`` (a stand-in for a Python command) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def make_venv(tmp_path, python) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", f"VENV={tmp_path / 'venv'}", f"PYTHON={python}", "venv"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip


@needs_make
def test_a_pyenv_shim_for_a_python_pyenv_has_not_selected_is_stopped_saying_what_to_do(tmp_path):
    # Issue 31: the shim passed the Makefile's `command -v` check, then make stopped on
    # pyenv's own "command not found" (exit 127). This one does what a pyenv shim does then.
    shim = fake_python(tmp_path / "pyenv" / "shims" / "python3.12", (
        'program="${0##*/}"\n'
        'export PYENV_ROOT="$HOME/.pyenv"\n'
        '# exec "$PYENV_ROOT/libexec/pyenv" exec "$program" "$@", with no version selected that has it:\n'
        'echo "pyenv: $program: command not found" >&2\n'
        'exit 127\n'))  # fmt: skip

    result = make_venv(tmp_path, shim)

    assert result.returncode != 0 and not (tmp_path / "venv").exists()
    assert result.stdout.startswith(f"make stopped: {shim} is a pyenv shim ({shim}) for a Python pyenv has not selected")
    assert "pyenv install 3.12, then pyenv global 3.12" in result.stdout and "make PYTHON=" in result.stdout


@needs_make
def test_a_python_that_does_not_run_is_stopped_saying_so(tmp_path):
    broken = fake_python(tmp_path / "bin" / "python3.12", "exit 126\n")
    result = make_venv(tmp_path, broken)
    assert result.returncode != 0
    assert result.stdout.startswith(f"make stopped: {broken} ({broken}) is on the PATH but does not run (it exits 126)")


@needs_make
def test_make_venv_prints_short_progress_lines_not_its_commands_or_comments(tmp_path):
    # Issue 31: make echoed 7 comment lines and the long compileall command. This Python
    # succeeds at everything and does nothing, so what make prints is the recipe's own.
    python = fake_python(tmp_path / "bin" / "python3.11", (
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi\n'
        'if [ "$1" = "-c" ]; then case "$2" in *sys.version_info*) echo 3.11;; *purelib*) echo /nowhere;; esac; fi\n'
        'exit 0\n'))  # fmt: skip

    result = make_venv(tmp_path, python)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"creating {tmp_path / 'venv'} with {python}",
        "installing pip, then torch, then the course and its tested versions (constraints.txt)",
        "byte-compiling the installed packages",
        f"{tmp_path / 'venv'} is ready",
    ]
    assert (tmp_path / "venv" / ".installed").exists()
