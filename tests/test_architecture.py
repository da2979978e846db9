"""The layers of docs/architecture.md, checked over the real import graph.

The contracts themselves live in pyproject.toml (``[tool.importlinter]``) and ``make lint`` runs
them too; here they run with the tests, together with what import-linter does not check: no two
files import each other (directly or around a longer loop) and the size limits of the entry modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("swapcheck", "swapcheck_common", "orchestrator", "tasks", "storage", "reports")


def _graph():
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(REPO))
    try:
        # Imports under `if TYPE_CHECKING:` never run, so they cannot close a cycle.
        return grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(REPO))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    res = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_no_import_cycle_between_files() -> None:
    graph = _graph()
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_module_sizes() -> None:
    spec = REPO / "orchestrator" / "spec.py"
    assert len(spec.read_text().splitlines()) < 300, "orchestrator/spec.py is the envelope only"
    too_long = {p.name: n for p in (REPO / "orchestrator" / "cli").glob("*.py")
                if (n := len(p.read_text().splitlines())) > 200}
    assert too_long == {}, "CLI modules parse, call and render only (<= 200 lines each)"


def test_cli_help_imports_nothing_heavy() -> None:
    code = ("import sys; from orchestrator.cli.main import app; "
            "heavy = [m for m in ('torch', 'ray', 'transformers', 'vllm', 'duckdb', 'matplotlib') if m in sys.modules]; "
            "print(','.join(heavy))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""
