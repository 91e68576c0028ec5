"""The house's rule (chapters/97-architecture.md, Three tiers): imports point down, never up, and never round.

Every import of src/pagedlab is read from the source, those inside functions included (a lazy import is still
a dependency: it runs when the function does); only imports under `if TYPE_CHECKING:` are left out, since they
never run. Then:

    core  the root modules, engine/ sched/ kv/ worker/ attention/ model/ data/   (the engine and its parts)
    lab   viz/ lessons/                                                            (drawings, scenarios)
    apps  serve/ course/ bench/ tools/, and __main__                              (what a user runs)

a module may import its own tier or a lower one, and the graph of modules has no cycle.
"""

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pagedlab"
CORE, LAB, APPS = 0, 1, 2
TIERS = {
    "": CORE, "engine": CORE, "sched": CORE, "kv": CORE, "worker": CORE, "attention": CORE, "model": CORE,
    "data": CORE, "viz": LAB, "lessons": LAB, "serve": APPS, "course": APPS, "bench": APPS, "tools": APPS,
}  # fmt: skip
TIER_NAMES = ("core", "lab", "apps")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def tier(module: str) -> int:
    if module == "pagedlab.__main__":
        return APPS  # `python -m pagedlab` is the command line
    folder = module.split(".")[1] if module.count(".") and (SRC / module.split(".")[1]).is_dir() else ""
    return TIERS[folder]


def imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (`from a import b` names a.b when b is a module, else a)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def import_nodes(node: ast.AST):
    """Every import statement, at any depth, except under `if TYPE_CHECKING:` (those never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for branch in child.orelse for n in import_nodes(ast.Module([branch], [])))
        else:
            yield from import_nodes(child)


def graph() -> dict[str, set[str]]:
    """module -> the pagedlab modules it imports."""
    edges = {}
    for module, path in MODULES.items():
        targets = set()
        for node in import_nodes(ast.parse(path.read_text(), str(path))):
            for name in imported(module, node):
                while name not in MODULES and "." in name:  # from pagedlab.kv.prefix import X: X is no module
                    name = name.rsplit(".", 1)[0]
                if name in MODULES and name != module:
                    targets.add(name)
        edges[module] = targets
    return edges


EDGES = graph()


def test_the_walk_sees_lazy_imports_and_skips_type_checking_ones():
    assert "pagedlab.course.grading" in EDGES["pagedlab.course.cli"]  # imported inside the command's function
    assert "pagedlab.model.chat_template" in EDGES["pagedlab.model.tokenizer"]  # inside a method
    assert "pagedlab.kv.prefix" in EDGES["pagedlab.stages"]  # from pagedlab.kv.prefix import a class
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pagedlab import llm\n")
    assert [type(n).__name__ for n in import_nodes(tree)] == ["ImportFrom"]  # only the typing import
    assert len(MODULES) > 100 and sum(map(len, EDGES.values())) > 300


def test_every_folder_is_a_package_with_a_tier():
    """A folder without __init__.py is a namespace package: it has no __file__, and the grader counts it as
    loaded from outside the grading tree. A folder without a tier here has no place in the rule."""
    for folder in sorted(p for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if any(folder.rglob("*.py")):
            assert (folder / "__init__.py").is_file(), f"{folder.name}/ has no __init__.py"
            assert folder.name in TIERS, f"{folder.name}/: add it to a tier (and to chapters/97-architecture.md)"


def test_no_import_points_up_a_tier():
    up = [
        f"{a} ({TIER_NAMES[tier(a)]}) -> {b} ({TIER_NAMES[tier(b)]})"
        for a, targets in sorted(EDGES.items())
        for b in sorted(targets)
        if tier(a) < tier(b)
    ]
    assert not up, "imports that point up a tier:\n" + "\n".join(up)


def test_no_import_cycle():
    try:
        tuple(graphlib.TopologicalSorter(EDGES).static_order())
    except graphlib.CycleError as e:
        pytest.fail("an import cycle: " + " -> ".join(e.args[1]))


def test_config_is_a_leaf():
    """Everything reads the config; it reads nothing of pagedlab (a stage's facts live in stages.py)."""
    assert EDGES["pagedlab.config"] == set()


@pytest.mark.parametrize("folder", ["kv", "sched"])
def test_the_bookkeeping_imports_no_torch(folder):
    """Block tables and schedules are plain Python: a learner can run and read them without torch."""
    for module, path in MODULES.items():
        if module.startswith(f"pagedlab.{folder}"):
            names = {n for node in import_nodes(ast.parse(path.read_text())) for n in imported(module, node)}
            assert not {n for n in names if n.split(".")[0] in ("torch", "triton", "numpy")}, module


def test_no_maintainer_script_ships_in_the_package():
    """The book builder, the vLLM-reference check and the chapter tables live in scripts/, outside the wheel;
    nothing in the package imports them."""
    for module, path in MODULES.items():
        names = {n for node in import_nodes(ast.parse(path.read_text())) for n in imported(module, node)}
        assert not {n for n in names if n.split(".")[0] == "scripts"}, module
    assert not {"book", "check_vllm_refs", "chapter_tables"} & {m.rsplit(".", 1)[-1] for m in MODULES}
