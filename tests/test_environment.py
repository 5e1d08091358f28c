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
