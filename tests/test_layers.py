"""The package's layers: every module of ``little_es`` imports only modules of its own layer or
below, and no group of modules imports itself round a cycle.

The order, bottom to top, is the one the README's "Layout" section states. Every import
counts, wherever it stands (a function body, ``if TYPE_CHECKING:``): an import moved into a
function to dodge a cycle is still the same dependency. A module this table does not place
fails the test, so a new module is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "little_es"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("values", "_frozen", "_compact", "_threads"),
    ("errors",),
    ("ids", "logging", "workflow", "workflow.paths"),
    ("events", "_strict", "faults", "aggregates", "waits", "workflow.ir", "workflow.context"),
    ("chain", "codec", "materialize", "pricing"),
    ("domain",),
    ("backends", "backends.*"),
    ("world",),
    ("durability", "totals", "fork"),
    ("harness", "harness.*"),
    ("workflow.authoring",),
    ("engine", "engine.*"),
    ("orchestrator", "outer_loop"),
    ("replay", "projections", "verify", "diff", "transfer"),
    ("render",),
    ("ui", "ui.*"),
    ("cli", "cli.*"),
    ("testing", "testing.*", "contrib", "contrib.*"),
)
"""Bottom first. ``name.*`` places every submodule of a package; the package root
``little_es`` (the re-exported public API) stands above all of them."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int | None:
    if module == "":
        return len(LAYERS)
    for rank, names in enumerate(LAYERS):
        for name in names:
            if module == name or (name.endswith(".*") and module.startswith(name[:-1])):
                return rank
    return None


def _imports(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every little_es module ``path`` imports (names relative to
    the package, ``""`` for the package root)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from little_es.x import y`` may name a submodule y as well as a name in x.
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for target in targets:
            if target == "little_es":
                found.append((node.lineno, ""))
            elif target.startswith("little_es."):
                name = target.removeprefix("little_es.")
                if name in known:
                    found.append((node.lineno, name))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: {t for _, t in _imports(p, known) if t != m} for m, p in modules.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in _modules() if _layer(m) is None)
    assert not unplaced, (
        f"modules with no layer: {unplaced}; add each to LAYERS in {Path(__file__).name}"
        " (and to the README's layer order)"
    )


def test_no_module_imports_a_layer_above_it() -> None:
    modules = _modules()
    known = set(modules)
    upward = []
    for module, path in modules.items():
        rank = _layer(module)
        if rank is None:
            continue
        for line, target in _imports(path, known):
            target_rank = _layer(target)
            if target_rank is not None and target_rank > rank:
                upward.append(
                    f"little_es/{path.relative_to(PACKAGE)}:{line} ({module}, layer {rank})"
                    f" imports {target or 'little_es'} (layer {target_rank})"
                )
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_core_never_imports_an_adapter() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for n in names
                if n.split(".")[0] == "little_es_temporal"
            ]
    assert not offenders, (
        "the core imports the Temporal adapter (adapters sit on top; register through the"
        f" `little_es.cli` entry point group instead): {offenders}"
    )


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # The checker itself: a low module importing a high one is reported.
    module = tmp_path / "probe.py"
    module.write_text("from little_es.engine.local import run_workflow\nimport little_es\n")
    found = _imports(module, {"engine.local", "engine"})
    assert (1, "engine.local") in found and (2, "") in found
    assert _layer("values") < _layer("engine.local") < _layer("")  # type: ignore[operator]
