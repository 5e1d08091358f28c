"""The three descriptions of the environment agree: pyproject.toml, environment.yml, constraints.txt."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


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


def test_torch_is_pinned_to_the_cpu_release_the_course_is_tested_with():
    assert constraint_pins()["torch"] == Version("2.13.0")


# ----------------------------------------------------------------------------- setting up .venv

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

import install_torch  # noqa: E402  (scripts/, on the path through conftest.py)


def test_torch_install_uses_the_wheel_on_this_machine_when_there_is_one():
    assert install_torch.pip_arguments("2.13.0", None, local_wheel="2.13.0+cpu", gpu=False)[-1] == "torch"


def test_without_a_local_wheel_or_a_gpu_torch_comes_from_the_cpu_index():
    arguments = install_torch.pip_arguments("2.13.0", None, local_wheel=None, gpu=False)
    assert arguments[-2:] == ["--extra-index-url", install_torch.CPU_INDEX]
    assert install_torch.CPU_INDEX.endswith("/whl/cpu")


def test_with_a_gpu_torch_comes_from_the_usual_index():
    assert "--extra-index-url" not in install_torch.pip_arguments("2.13.0", None, local_wheel=None, gpu=True)


def test_an_installed_pinned_torch_is_left_alone_whatever_its_build_label():
    assert install_torch.pip_arguments("2.13.0", "2.13.0+cpu", local_wheel=None, gpu=False) is None
    assert install_torch.pip_arguments("2.13.0", "2.12.0+cpu", local_wheel=None, gpu=False) is not None


def test_the_torch_pin_is_read_from_constraints():
    assert install_torch.pinned_version() == "2.13.0"


def test_the_makefile_installs_torch_first_through_the_script_and_documents_other_pythons():
    makefile = (REPO / "Makefile").read_text()
    assert makefile.index("scripts/install_torch.py") < makefile.index('-e ".[test]"')
    assert "make PYTHON=python3.12" in makefile
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
