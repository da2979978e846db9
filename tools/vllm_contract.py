"""The contract with vLLM, checked against the wheels themselves (`make vllm-contract`; issue #37).

Every vLLM symbol, keyword argument, environment variable, kernel class name, attention backend and log
format that swapcheck's vLLM path relies on is a :class:`Term` below, each naming the call site in
swapcheck that relies on it. For each vLLM version asked for, the wheel is fetched from the package index
with ``pip download --no-deps`` (no dependencies, no GPU; cached under ``$SWAPCHECK_VLLM_WHEELS``, else
``~/.cache/swapcheck/vllm-wheels``), its Python files are extracted, and each term is checked in that
source by reading it (``ast`` and exact text; nothing of vLLM is imported). The table says, per term:
the call site, the vLLM symbol, and whether it was found and is compatible. Exit 0 when every term holds
for every version of the allowed range, 1 when any breaks (naming the call site), 2 for bad input (a
version pip cannot fetch).

``--newer`` also checks the releases beyond the range the extra allows (``swapcheck[vllm]``: 0.29-0.32)
and reports what each would break, without failing on them: moving the range is then a measured
decision. ``--source DIR`` checks an extracted source tree instead (a copy with an argument renamed on
purpose shows the check naming the call site: tests/test_vllm_contract.py).

Usage::

    python tools/vllm_contract.py                       # 0.29.0 0.30.0 0.31.0 0.32.0
    python tools/vllm_contract.py --versions 0.32.0 --newer
    python tools/vllm_contract.py --source /tmp/vllm-src --format json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: The versions the ``vllm`` extra allows (pyproject: vllm>=0.29,<0.33).
ALLOWED = ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
#: Releases beyond the range, reported with ``--newer`` (what each breaks).
NEWER = ("0.33.0", "0.34.0")
WHEELS_ENV = "SWAPCHECK_VLLM_WHEELS"


# -- reading a source tree ------------------------------------------------------------------------

class Source:
    """An extracted vLLM source tree (``<root>/vllm/...``), each file parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}

    def text(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            text = self.text(rel)
            try:
                self._trees[rel] = None if text is None else ast.parse(text)
            except SyntaxError:
                self._trees[rel] = None
        return self._trees[rel]

    def top(self, rel: str, name: str) -> ast.AST | None:
        """A module-level def, class or assignment named ``name`` in ``rel``."""
        tree = self.tree(rel)
        for node in tree.body if tree is not None else []:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return node
        return None

    def class_fields(self, rel: str, cls: str) -> set[str]:
        """The annotated fields and method names of a class (a dataclass's fields)."""
        node = self.top(rel, cls)
        out: set[str] = set()
        for item in node.body if isinstance(node, ast.ClassDef) else []:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                out.add(item.target.id)
            elif isinstance(item, ast.Assign):
                out.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(item.name)
        return out

    def grep(self, pattern: str, under: str = "vllm") -> list[str]:
        """Files under ``under`` whose text contains ``pattern`` (exact), relative to the root."""
        hits = []
        for path in sorted((self.root / under).rglob("*.py")):
            if pattern in path.read_text(encoding="utf-8", errors="replace"):
                hits.append(str(path.relative_to(self.root)))
        return hits

    def classes_named(self, names: set[str]) -> set[str]:
        """Which of ``names`` are defined as classes anywhere in the tree."""
        found: set[str] = set()
        pattern = re.compile(r"^class\s+(\w+)\b", re.MULTILINE)
        for path in (self.root / "vllm").rglob("*.py"):
            found.update(set(pattern.findall(path.read_text(encoding="utf-8", errors="replace"))) & names)
        return found


# -- the terms ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One thing swapcheck relies on: where (``site``), what of vLLM (``symbol``), and the check
    (``check(src)`` -> None when it holds, else what is wrong)."""

    site: str
    symbol: str
    check: Callable[[Source], str | None]


def _defined(rel: str, name: str) -> Callable[[Source], str | None]:
    def check(src: Source) -> str | None:
        if src.tree(rel) is None:
            return f"{rel} not found"
        return None if src.top(rel, name) is not None else f"{name} not defined in {rel}"
    return check


def _fields(rel: str, cls: str, names: list[str], noun: str = "field") -> Callable[[Source], str | None]:
    """Each of ``names`` is a field, method or (``noun="member"``) enum member of class ``cls``."""
    def check(src: Source) -> str | None:
        have = src.class_fields(rel, cls)
        if not have:
            return f"class {cls} not found in {rel}"
        missing = [n for n in names if n not in have]
        return f"{cls} has no {noun} {', '.join(missing)}" if missing else None
    return check


def _text(rel: str, needle: str) -> Callable[[Source], str | None]:
    def check(src: Source) -> str | None:
        text = src.text(rel)
        if text is None:
            return f"{rel} not found"
        return None if needle in text else f"{needle!r} not in {rel}"
    return check


def _anywhere(needle: str) -> Callable[[Source], str | None]:
    def check(src: Source) -> str | None:
        return None if src.grep(needle) else f"{needle!r} appears nowhere in the package"
    return check


def _env(names: list[str]) -> Callable[[Source], str | None]:
    """Each variable is one vLLM reads (``vllm/envs.py``'s table)."""
    def check(src: Source) -> str | None:
        text = src.text("vllm/envs.py")
        if text is None:
            return "vllm/envs.py not found"
        missing = [n for n in names if f'"{n}"' not in text]
        return f"vLLM reads no {', '.join(missing)}" if missing else None
    return check


def _classes(names: list[str]) -> Callable[[Source], str | None]:
    def check(src: Source) -> str | None:
        missing = sorted(set(names) - src.classes_named(set(names)))
        return f"no class {', '.join(missing)}" if missing else None
    return check


def _literal(rel: str, name: str, value: str) -> Callable[[Source], str | None]:
    """``value`` appears in the definition of ``name`` (a Literal type, a tuple of modes)."""
    def check(src: Source) -> str | None:
        node = src.top(rel, name)
        if node is None:
            return f"{name} not defined in {rel}"
        return None if f"'{value}'" in ast.unparse(node) or f'"{value}"' in ast.unparse(node) \
            else f"{name} does not include {value!r}"
    return check


def _logging_configured(src: Source) -> str | None:
    """When vLLM's ``dictConfig`` (which drops the ``vllm`` logger's handlers) can run, against where
    swapcheck attaches its log collector (after ``import vllm``, after ``configure_vllm_logging``): only
    in ``vllm/logger.py``; there either at import (module-level ``_configure_vllm_root_logger()``,
    0.29-0.30) or inside ``configure_logging_if_needed`` with a ``LoggingConfig`` (0.31+), which
    ``LLM.__init__`` calls with ``engine_args.create_logging_config()``."""
    elsewhere = [f for f in src.grep("dictConfig(") if f != "vllm/logger.py"]
    if elsewhere:
        return f"dictConfig is called outside vllm/logger.py too: {', '.join(elsewhere)}"
    tree = src.tree("vllm/logger.py")
    if tree is None:
        return "vllm/logger.py not found"
    at_import = any(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                    and getattr(n.value.func, "id", None) == "_configure_vllm_root_logger" for n in tree.body)
    if at_import:
        return None
    if src.top("vllm/logger.py", "configure_logging_if_needed") is None:
        return "logging is neither configured at import nor by configure_logging_if_needed"
    if src.top("vllm/config/logging.py", "LoggingConfig") is None:
        return "configure_logging_if_needed exists but vllm.config.logging.LoggingConfig does not"
    llm = src.text("vllm/entrypoints/llm.py") or ""
    if "configure_logging_if_needed(engine_args.create_logging_config())" not in llm:
        return "LLM.__init__ no longer calls configure_logging_if_needed(engine_args.create_logging_config())"
    return None


def _engine_kwargs() -> list[str]:
    """The ``LLM`` keyword arguments ``VllmEngine`` passes (tasks/models/vllm_engine.py), read from its
    source so that a new one enters the contract by itself."""
    text = (REPO / "tasks" / "models" / "vllm_engine.py").read_text()
    block = text[text.index('kwargs: dict[str, Any] = {'):text.index("**self.forced")]
    names = re.findall(r'"(\w+)":', block) + re.findall(r'kwargs\["(\w+)"\]', text) \
        + re.findall(r'kwargs\.setdefault\("(\w+)"', text)
    return sorted({n for n in names if n != "model"} | {"attention_backend", "linear_backend"})


def terms() -> list[Term]:
    from tasks.attention.vllm import BACKENDS
    from tasks.models.vllm_selection import kernel_classes

    classes = sorted(set(kernel_classes("0.32.0").values()))
    engine = "tasks/models/vllm_engine.py"
    kwargs = _engine_kwargs()
    return [
        Term(f"{engine}:configure_vllm_logging", "vLLM's dictConfig runs at import, or in "
             "configure_logging_if_needed(LoggingConfig), which LLM.__init__ calls and swapcheck calls first",
             _logging_configured),
        Term(f"{engine}:VllmEngine.__init__", "vllm.LLM", _defined("vllm/entrypoints/llm.py", "LLM")),
        Term(f"{engine}:VllmEngine.__init__", f"EngineArgs fields {', '.join(kwargs)}",
             _fields("vllm/engine/arg_utils.py", "EngineArgs", kwargs)),
        Term("tasks/models/vllm_rows.py:score_from_prompt_logprobs (prompt_values)",
             "prompt scores follow logprobs_mode (raw logits under raw_logits), V2 runner",
             _text("vllm/v1/worker/gpu/sample/prompt_logprob.py",
                   'logits_mode = logprobs_mode in ("raw_logits", "processed_logits")')),
        Term("tasks/models/vllm_rows.py:assemble_logits (chunks)", "V2 runner: prompt logits in chunks of 1024 rows",
             _text("vllm/v1/worker/gpu/sample/prompt_logprob.py", "CHUNK_SIZE = 1024")),
        Term("tasks/models/vllm_rows.py:score_from_prompt_logprobs (prompt_values)",
             "prompt scores follow logprobs_mode, V1 runner",
             _text("vllm/v1/worker/gpu_model_runner.py",
                   'if self.model_config.logprobs_mode in ("raw_logits", "processed_logits"):')),
        Term(f"{engine}:VllmEngine.__init__ (vocab_size)", "ModelConfig.get_vocab_size",
             _fields("vllm/config/model.py", "ModelConfig", ["get_vocab_size"])),
        Term(f"{engine}:VllmEngine.__init__ (vocab_size)", "LLMEngine.model_config",
             _text("vllm/v1/engine/llm_engine.py", "self.model_config = vllm_config.model_config")),
        Term(f"{engine}:VllmEngine.__init__ (logprobs_mode)", "LogprobsMode includes 'raw_logits'",
             _literal("vllm/config/model.py", "LogprobsMode", "raw_logits")),
        Term("tasks/models/vllm_selection.py:forcing", "VLLM_DISABLED_KERNELS, VLLM_ENABLE_V1_MULTIPROCESSING, "
             "VLLM_LOGGING_LEVEL (vllm/envs.py)",
             _env(["VLLM_DISABLED_KERNELS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"])),
        Term("tasks/models/vllm_selection.py:kernel_classes", f"kernel classes {', '.join(classes)}",
             _classes(classes)),
        Term("tasks/models/vllm_selection.py:parse_selection_log", "log 'Selected %s for %s'",
             _anywhere('"Selected %s for %s')),
        Term("tasks/attention/vllm.py:BACKENDS", f"AttentionBackendEnum members {', '.join(BACKENDS.values())}",
             _fields("vllm/v1/attention/backends/registry.py", "AttentionBackendEnum", list(BACKENDS.values()), "member")),
        Term("tasks/models/vllm_selection.py:parse_attention_log",
             "log 'Using %s attention backend out of potential backends' (platforms/cuda.py)",
             _text("vllm/platforms/cuda.py", "Using %s attention backend out of potential backends")),
        Term("tasks/models/vllm_selection.py:parse_attention_log", "log 'Using %s backend.' (platforms/cuda.py)",
             _text("vllm/platforms/cuda.py", '"Using %s backend."')),
        Term("tasks/kernels/cuda.py:TRITON_SCALED_MM_MODULE", "triton_scaled_mm",
             _anywhere("def triton_scaled_mm(")),
        Term("tasks/models/vllm_engine.py (ops)", "cutlass_scaled_mm custom op",
             _anywhere("def cutlass_scaled_mm(")),
    ]


# -- fetching -------------------------------------------------------------------------------------

def cache_dir() -> Path:
    return Path(os.environ.get(WHEELS_ENV) or Path.home() / ".cache" / "swapcheck" / "vllm-wheels")


def fetch(version: str) -> Path:
    """The extracted Python source of vLLM ``version`` (``<cache>/<version>/src``), fetched once."""
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", version):
        raise SystemExit(f"error: {version!r} is not a vLLM release version (e.g. 0.32.0)")
    base = cache_dir() / version
    src = base / "src"
    if (src / "vllm" / "__init__.py").is_file():
        return src
    wheels = base / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("vllm-*.whl")):
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-d", str(wheels), f"vllm=={version}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: cannot fetch the vLLM {version} wheel: {done.stderr.strip().splitlines()[-1:]}")
    wheel = sorted(wheels.glob("vllm-*.whl"))[-1]
    staging = base / "src.partial"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                z.extract(name, staging)
    shutil.rmtree(src, ignore_errors=True)
    staging.rename(src)
    return src


#: What importing ``vllm.logger`` and ``vllm.config.logging`` from a wheel's source needs besides this
#: environment (their module-level imports; vLLM's other dependencies are not needed for those two).
IMPORT_DEPS = ("cbor2", "psutil", "pyzmq", "openai-harmony", "openai")


def import_path(version: str) -> str:
    """A ``PYTHONPATH`` under which vLLM ``version``'s own ``vllm.logger`` imports on a CPU machine:
    its extracted source, and :data:`IMPORT_DEPS` installed once into ``<cache>/<version>/deps``."""
    src = fetch(version)
    deps = cache_dir() / version / "deps"
    if not (deps / ".complete").is_file():
        shutil.rmtree(deps, ignore_errors=True)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(deps), *IMPORT_DEPS],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: cannot install {', '.join(IMPORT_DEPS)}: {done.stderr.strip()[-500:]}")
        (deps / ".complete").write_text("")
    return os.pathsep.join([str(src), str(deps)])


# -- the report -----------------------------------------------------------------------------------

def check(src: Source) -> list[dict[str, str | None]]:
    return [{"site": t.site, "symbol": t.symbol, "problem": t.check(src)} for t in terms()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", nargs="+", default=list(ALLOWED), help="vLLM versions the extra allows")
    ap.add_argument("--newer", action="store_true", help=f"also report {', '.join(NEWER)} (never fails)")
    ap.add_argument("--source", type=Path, help="check an extracted source tree (a directory holding vllm/)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    if args.source is not None and not (args.source / "vllm").is_dir():
        print(f"error: --source {args.source}: no vllm/ directory in it", file=sys.stderr)
        return 2
    runs: list[tuple[str, bool, Path]] = (
        [(str(args.source), True, args.source)] if args.source is not None
        else [(v, True, fetch(v)) for v in args.versions] + ([(v, False, fetch(v)) for v in NEWER] if args.newer else []))
    report = []
    broken = 0
    for label, gating, root in runs:
        rows = check(Source(root))
        report.append({"vllm": label, "allowed": gating, "terms": rows})
        if gating:
            broken += sum(1 for r in rows if r["problem"])
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        for run in report:
            bad = [r for r in run["terms"] if r["problem"]]
            scope = "allowed" if run["allowed"] else "beyond the allowed range: reported, not failed"
            print(f"vLLM {run['vllm']} ({scope}): {len(run['terms']) - len(bad)} of {len(run['terms'])} terms hold")
            for r in run["terms"]:
                mark = "ok   " if not r["problem"] else "BREAK"
                print(f"  {mark} {r['site']}  ->  {r['symbol']}" + (f"\n         {r['problem']}" if r["problem"] else ""))
    if broken:
        print(f"error: {broken} term(s) of the contract break in the allowed range (the call sites are named above)",
              file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
