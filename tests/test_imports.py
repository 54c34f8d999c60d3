"""The package's import graph (issue 9, "Must hold"), read from the source with ``ast``:
every ``import`` counts, at module level or inside a function (a lazy import is still a
dependency, and a cycle through one is still a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "adaptcq"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the adaptcq modules it imports (a package import counts as its
    ``__init__``; ``from pkg import sub`` as the submodule when there is one)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t in mods and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module reachable from ``start``, with the module it was reached from."""
    seen: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        m = todo.pop()
        for d in sorted(graph.get(m, ())):
            if d not in seen:
                seen[d] = m
                todo.append(d)
    return seen


def _path(seen: dict[str, str | None], end: str) -> str:
    chain = [end]
    while seen[chain[-1]] is not None:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


def test_cli_and_explain_import_no_cycle():
    graph = _graph()
    assert "adaptcq.explain" in graph["adaptcq.cli"]  # the direction that stays
    back = _reachable(graph, "adaptcq.explain")
    assert "adaptcq.cli" not in back, (
        "cli imports explain, so explain must not import cli, even indirectly: "
        + _path(back, "adaptcq.cli") + " (shared argument helpers live in adaptcq.cliargs)")
    assert not {"adaptcq.cli", "adaptcq.explain"} & set(_reachable(graph, "adaptcq.cliargs"))


def test_the_spark_runtime_does_not_depend_on_the_cli():
    graph = _graph()
    seen = _reachable(graph, "adaptcq.runtime.spark")
    for cli in ("adaptcq.cli", "adaptcq.cliargs", "adaptcq.explain", "adaptcq.runtime.spark_cli"):
        assert cli not in seen, ("runtime/spark.py is the Spark runtime only; its CLI driver "
                                 f"is runtime/spark_cli.py: {_path(seen, cli)}")
    import adaptcq.runtime.spark as rs
    assert not hasattr(rs, "run_cli")


def test_engine_does_not_import_adapt_runtime_or_optimizer():
    graph = _graph()
    bad = sorted(f"{m} imports {d}" for m, deps in graph.items()
                 if m.startswith("adaptcq.engine.") or m == "adaptcq.engine"
                 for d in deps
                 if d.split(".")[1] in ("adapt", "runtime", "optimizer"))
    assert not bad, ("issue 9, Must hold: no module in src/adaptcq/engine/ imports "
                     "adaptcq.adapt, adaptcq.runtime or adaptcq.optimizer (the engine is "
                     "mechanism; policies and runtimes depend on it, not the reverse); "
                     "found: " + "; ".join(bad))
