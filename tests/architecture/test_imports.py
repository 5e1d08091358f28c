"""The rules of ARCHITECTURE.md, read from every module's imports (top-level and inside functions)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "course_utils"


def module_name(path: Path) -> str:
    """Return the dotted name of a module file of the repository (a package is its __init__)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, str | None]]:
    """Return (module, name) for each import in a file; name is None for `import module`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import; the package imports itself by absolute names")
    return found


def imported_modules(path: Path) -> set[str]:
    """Return every module a file imports, `from a import b` counted as `a.b` when `a.b` is a module."""
    modules = set()
    for module, name in imports_of(path):
        candidate = f"{module}.{name}" if name else module
        is_module = (REPO / Path(*candidate.split("."))).with_suffix(".py").exists() or (
            REPO / Path(*candidate.split(".")) / "__init__.py").exists()
        modules.add(candidate if is_module else module)
    return modules


def part_of(module: str) -> str:
    """Return the part of course_utils a module belongs to: `memory`, `plots`, `exercises`, or the module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def is_private(name: str) -> bool:
    """Return whether a name is private: one leading underscore (not a dunder, not the ``____`` placeholder)."""
    return name.startswith("_") and not name.endswith("__") and name.strip("_") != ""


PACKAGE_FILES = sorted(PACKAGE.rglob("*.py"))
REPO_FILES = sorted(p for folder in ("course_utils", "tools", "tests", "benchmarks", "data", "lessons")
                    for p in (REPO / folder).rglob("*.py"))  # fmt: skip


def test_the_rules_read_the_whole_package():
    assert len(PACKAGE_FILES) > 50
    assert {"memory", "plots", "exercises", "levers", "data"} <= {part_of(module_name(p)) for p in PACKAGE_FILES}


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: module_name(p))
def test_computation_never_draws(path):
    if part_of(module_name(path)) == "plots":
        return
    drawn = {m for m in imported_modules(path) if m.startswith(("course_utils.plots", "matplotlib"))}
    assert not drawn, f"{module_name(path)} imports {sorted(drawn)}: only course_utils.plots draws"


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: module_name(p))
def test_loops_never_grade(path):
    if part_of(module_name(path)) == "exercises":
        return
    graded = {m for m in imported_modules(path) if m.startswith("course_utils.exercises")}
    assert not graded, f"{module_name(path)} imports {sorted(graded)}: only the exercises grade"


def test_data_never_trains():
    training = ("course_utils.loops", "course_utils.feature_loops", "course_utils.train", "course_utils.memory",
                "course_utils.optimizers", "course_utils.launcher", "course_utils.parallel", "course_utils.levers")
    assert not {m for m in imported_modules(PACKAGE / "data.py") if m.startswith(training)}


def test_memory_imports_only_the_floors_below_it():
    allowed = {"course_utils", "course_utils.optimizers", "course_utils.validation", "course_utils.units",
               "course_utils.layouts"}
    for path in (PACKAGE / "memory").rglob("*.py"):
        outside = {m for m in imported_modules(path) if m.startswith("course_utils") and part_of(m) != "memory"}
        assert outside <= allowed, f"{module_name(path)} imports {sorted(outside - allowed)}"


# What lays a model out over processes: only course_utils.layouts calls it (the exercises' reference answers excepted:
# a learner's own fully_shard calls are what exercise 2 grades).
LAYOUT_CALLS = {"fully_shard", "DistributedDataParallel", "ZeroRedundancyOptimizer"}


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: module_name(p))
def test_a_layout_is_applied_to_a_model_in_one_place(path):
    if module_name(path) == "course_utils.layouts" or part_of(module_name(path)) == "exercises":
        return
    imported = {name for _, name in imports_of(path)} & LAYOUT_CALLS
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
              for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
              if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in LAYOUT_CALLS}
    assert not imported | called, (
        f"{module_name(path)} uses {sorted(imported | called)}: lay a model out with layouts.apply_layout "
        "(and its optimizer with layouts.layout_optimizer), the one place the real runs and the planner share")


@pytest.mark.parametrize("path", REPO_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_underscore_name_crosses_a_package_border(path):
    here = module_name(path)
    for module, name in imports_of(path):
        if not module.startswith("course_utils"):
            continue
        private = [part for part in [*module.split("."), name or ""] if is_private(part)]
        same_package = module.split(".")[:2] == here.split(".")[:2]  # a subpackage, its modules and its face
        assert not private or same_package, f"{here} imports {name} from {module}"


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: module_name(p))
def test_the_package_stands_alone(path):
    outside = {m for m in imported_modules(path) if m.split(".")[0] in {"tools", "tests", "benchmarks", "data"}}
    assert not outside, f"{module_name(path)} imports {sorted(outside)}"


# The one file that edits sys.path, and why (ARCHITECTURE.md says the same).
EDITS_THE_PATH = {
    # The course kernel starts with -P, so that nothing in the notebook's folder is imported
    # while it starts; it then puts that folder back, where IPython puts it, for the learner.
    "tools/course_kernel.py",
}


@pytest.mark.parametrize("path", REPO_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_edits_the_path_or_imports_a_file_by_its_path(path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name):
            if path.relative_to(REPO).as_posix() not in EDITS_THE_PATH:
                assert node.value.id != "sys", f"{path.relative_to(REPO)}:{node.lineno} uses sys.path"
        if isinstance(node, ast.Attribute):
            assert node.attr != "spec_from_file_location", f"{path.relative_to(REPO)}:{node.lineno} imports by path"


@pytest.mark.parametrize("path", REPO_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_private_name_is_read_across_a_package_border(path):
    """`module._name` on a course_utils module imported from elsewhere is the same crossing as importing it."""
    here = module_name(path) if path.is_relative_to(PACKAGE) else ""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = {}  # local name -> course_utils module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("course_utils"):
            modules.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
        elif isinstance(node, ast.Import):
            modules.update({alias.asname: alias.name for alias in node.names if alias.asname and alias.name.startswith("course_utils")})
    crossings = [
        f"{path.relative_to(REPO)}:{node.lineno} reads {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
        and is_private(node.attr) and modules[node.value.id].split(".")[:2] != here.split(".")[:2]
    ]
    assert not crossings
