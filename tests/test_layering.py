"""The library stays below the wiring: importing every `tokenmill` module leaves Dagster unloaded, no `tokenmill`
module imports Dagster or the wiring layer (definitions, automation, resources, assets) even inside a function, and
the first-party modules import each other without a cycle. Imports are read from the source (ast), function-level
ones included: a cycle through one is still a cycle."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# first-party top-level modules and packages, and where their source is
FIRST_PARTY = {
    "tokenmill": REPO / "tokenmill",
    "assets": REPO / "assets",
    "resources": REPO / "resources",
    "definitions": REPO / "definitions.py",
    "automation": REPO / "automation.py",
    "runs": REPO / "runs.py",
    "cli": REPO / "cli.py",
    "tokenmill_loader": REPO / "loaders" / "tokenmill_loader",
}
# what the library must not import
WIRING = ("dagster", "definitions", "automation", "resources", "assets", "runs", "cli")


def first_party_modules() -> dict[str, Path]:
    """Module name -> source file of every first-party module (a package is its __init__.py)."""
    modules = {}
    for top, path in FIRST_PARTY.items():
        if path.suffix == ".py":
            modules[top] = path
            continue
        for file in sorted(path.rglob("*.py")):
            parts = (top, *file.relative_to(path).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return modules


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def imported_names(module: str, file: Path) -> dict[str, int]:
    """Every module `module` imports, at its top or in a function (not under `if TYPE_CHECKING:`), with the line;
    `from a import b` names a.b when that is a module."""
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def visit(node: ast.AST) -> None:
        if is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.setdefault(f"{base}.{alias.name}", node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(file.read_text(encoding="utf-8"), str(file)))
    return found


def resolve(name: str, modules: dict[str, Path]) -> str:
    """The innermost known module a dotted import name lands in (a.b.c -> a.b when c is a name in a.b)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """First-party module -> {first-party module it imports: line}."""
    modules = first_party_modules()
    graph = {}
    for module, file in modules.items():
        edges = {}
        for name, line in imported_names(module, file).items():
            target = resolve(name, modules)
            if target in modules and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph, modules


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    """A component's import edges as file:line -> module, one per line."""
    members = set(component)
    return "\n".join(
        f"  {modules[m].relative_to(REPO)}:{line} imports {target}"
        for m in component
        for target, line in sorted(graph[m].items())
        if target in members
    )


def test_cycle_finder_names_a_cycle_and_ignores_a_chain():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_relative_and_function_level_imports_are_read(tmp_path):
    (tmp_path / "m.py").write_text(
        "from . import x\nfrom .y import z\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import hidden\ndef f():\n    import dagster\n"
    )
    names = imported_names("pkg.sub.m", tmp_path / "m.py")
    assert {"pkg.sub.x", "pkg.sub.y.z", "dagster"} <= set(names) and "hidden" not in names
    assert names["dagster"] == 7


def test_importing_every_tokenmill_module_leaves_dagster_unloaded():
    script = """
import importlib, json, pkgutil, sys
import tokenmill
names = sorted(m.name for m in pkgutil.walk_packages(tokenmill.__path__, "tokenmill."))
culprit = None
for name in names:
    importlib.import_module(name)
    if culprit is None and "dagster" in sys.modules:
        culprit = name
print(json.dumps({"modules": len(names), "culprit": culprit}))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    imported = json.loads(out.stdout)
    assert imported["modules"] > 30  # the walk found the stage packages
    assert imported["culprit"] is None, f"importing {imported['culprit']} loads dagster"


def test_no_tokenmill_module_imports_dagster_or_the_wiring():
    modules = first_party_modules()
    offending = [
        f"{file.relative_to(REPO)}:{line} imports {name}"
        for module, file in modules.items()
        if module.split(".")[0] == "tokenmill"
        for name, line in sorted(imported_names(module, file).items(), key=lambda item: item[1])
        if name.split(".")[0] in WIRING
    ]
    assert offending == [], "\n".join(offending)


def test_first_party_modules_import_without_a_cycle():
    graph, modules = import_graph()
    assert len(graph) > 50 and "tokenmill.stages.dedup.stage" in graph  # the walk found the packages
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(describe(c, graph, modules) for c in found)


def test_the_stage_registry_imports_no_stage_package():
    """Every layer reads the stage registry (tokenmill.common.disk; tokenmill.explain, which tokenmill.stages.dedup
    imports): it names the stages' types as `module:Class` and imports none of their packages."""
    names = imported_names("tokenmill.stages.registry", FIRST_PARTY["tokenmill"] / "stages" / "registry.py")
    assert [name for name in names if name.startswith("tokenmill.stages.")] == []


STAGE_PACKAGES = ("raw", "clean", "dedup", "tokenize")


def test_no_stage_package_imports_another():
    """A stage reads another's output from disk, never its code: what two stages share (the text keys dedup and
    decontamination compare by, the transformers config beside tokenizer.json) lives in tokenmill.common or in the
    stage that writes it."""
    modules = first_party_modules()
    offending = [
        f"{file.relative_to(REPO)}:{line} imports {name}"
        for module, file in modules.items()
        if module.split(".")[:2] == ["tokenmill", "stages"] and len(module.split(".")) > 2
        for name, line in imported_names(module, file).items()
        if (parts := name.split("."))[:2] == ["tokenmill", "stages"]
        and len(parts) > 2
        and parts[2] in STAGE_PACKAGES
        and parts[2] != module.split(".")[2]
    ]
    assert offending == [], "\n".join(offending)


def test_no_stage_imports_the_exports():
    """The exports come after the stages and read their outputs; a stage that needed one would run it backwards."""
    modules = first_party_modules()
    offending = [
        f"{file.relative_to(REPO)}:{line} imports {name}"
        for module, file in modules.items()
        if module.startswith("tokenmill.stages.")
        for name, line in imported_names(module, file).items()
        if name.startswith("tokenmill.exports")
    ]
    assert offending == [], "\n".join(offending)


def test_the_wheel_installs_the_library_only(tmp_path):
    """`pip install .` puts `tokenmill` in site-packages and nothing under a generic top-level name: the wiring
    (definitions, cli, assets, resources, ...) loads from the project folder. Built from a copy of the project, as
    setuptools writes its build folder where it builds."""
    project = tmp_path / "project"
    shutil.copytree(REPO, project, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "data*", "build"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path, project],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("tokenmill-*.whl")
    with zipfile.ZipFile(wheel) as z:
        top_level = {name.split("/")[0] for name in z.namelist()}
        entry_points = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"tokenmill"}
    assert "tokenmill = tokenmill.launch:main" in entry_points


def test_the_console_script_runs_the_project_cli_from_any_folder(tmp_path):
    script = Path(sys.executable).with_name("tokenmill")
    ran = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "train-quality" in ran.stdout, ran.stderr
    lost = subprocess.run(
        [str(script), "--help"],
        cwd=tmp_path,
        env={**os.environ, "TOKENMILL_PROJECT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lost.returncode == 1 and lost.stderr.strip() == (
        f"tokenmill: TOKENMILL_PROJECT={tmp_path.resolve()} holds no definitions.py, cli.py, workspace.yaml"
    )


def test_the_instance_loads_its_run_launcher_outside_the_project_folder(tmp_path):
    """dagster.yaml names the launcher as tokenmill.launch: a Dagster process started anywhere (the daemon, `dagster
    instance migrate`) loads resources/run_launcher.py's class from the project folder."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"DAGSTER_HOME": str(home)}
    code = "import dagster as dg; launcher = type(dg.DagsterInstance.get().run_launcher); print(launcher.__module__)"
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["resources.run_launcher"]
