"""The package's layers point one way: no import cycle, no import from a lower layer upward.

The layers, lowest first (docs/architecture.md, "How the code is organised"):

0. ``validation``, ``devices``, ``trace``, ``data``, ``models``, ``losses``, ``conf`` (the
   configs' folder), ``source_tree`` (mounts it from a tree): no other part of grab_exp;
1. ``grads``: a batch's per-sample gradients;
2. ``balance`` (the orderings), ``sampler``, ``per_sample``, ``optim``, ``logging``;
3. ``distributed``: orderings and collectives over workers;
4. ``runner.config``: what a job's config may say (``runner`` itself imports nothing);
5. ``runner.rundir``: a job's run directory;
6. ``runner.training``: one job's training, its path in ``runner.training.job``;
7. ``runner.launch``: jobs from the command line (checks, the sweeper, the launcher);
8. ``report``, ``bench``: read or time jobs;
9. the entry points (``grab_exp``, ``grab_exp.__main__``, ``grab_exp.logging.__main__``).

Every ``import`` and ``from ... import`` of a module (also inside functions) counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grab_exp"
LAYERS = {
    "validation": 0,
    "devices": 0,
    "trace": 0,
    "tracebacks": 0,
    "data": 0,
    "models": 0,
    "conf": 0,
    "source_tree": 0,
    "losses": 0,
    "grads": 1,
    "balance": 2,
    "sampler": 2,
    "per_sample": 2,
    "optim": 2,
    "logging": 2,
    "logging.__main__": 9,  # python -m grab_exp.logging: its command lives in report/
    "distributed": 3,
    "runner": 4,  # grab_exp/runner/__init__.py
    "runner.config": 4,
    "runner.rundir": 5,
    "runner.training": 6,
    "runner.launch": 7,
    "report": 8,
    "bench": 8,
    "__main__": 9,
    "": 9,  # grab_exp/__init__.py
}


def module_name(path: Path) -> str:
    parts = ["grab_exp", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The grab_exp modules ``path`` imports (``from pkg import name`` of a submodule counts
    as that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names} & modules
    return {name for name in found if name in modules}


def graph() -> tuple[dict[str, set[str]], dict[str, Path]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(p, set(paths)) - {m} for m, p in paths.items()}, paths


def layer(module: str) -> int:
    """The layer of ``module``: its sub-package's (``runner.training``), else its package's."""
    parts = module.split(".")[1:]
    for package in (".".join(parts[:2]), parts[0] if parts else ""):
        if package in LAYERS:
            return LAYERS[package]
    raise AssertionError(f"{module}: its package {parts[:2]} has no layer in LAYERS")


def test_no_import_points_up():
    edges, paths = graph()
    upward = [
        f"{paths[a].relative_to(PACKAGE.parent)} (layer {layer(a)}) imports "
        f"{paths[b].relative_to(PACKAGE.parent)} (layer {layer(b)})"
        for a, targets in sorted(edges.items())
        for b in sorted(targets)
        if layer(b) > layer(a)
    ]
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or ``None``.

    A package's ``__init__`` importing its own submodules is not a cycle when the submodule
    imports a sibling rather than the package, so package -> submodule edges are left out.
    """
    kept = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in edges.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(kept.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(kept):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle():
    edges, paths = graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(
        str(paths[m].relative_to(PACKAGE.parent)) for m in cycle
    )


def test_the_check_sees_a_cycle_and_an_upward_import():
    """The two checks fail where they should (so a passing run means something)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a.x"}, "a.x": {"b"}, "b": set()}) is None
    assert layer("grab_exp.runner.training.step") > layer("grab_exp.balance.base")
