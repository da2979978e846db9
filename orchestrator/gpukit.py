"""The GPU lease kit: the field's core claims measured on a short borrowed GPU, with only torch and Triton.

``infra/gpu-kit/run.sh OUT`` (a thin wrapper) runs ``python -m orchestrator.gpukit OUT``: on a machine with
one NVIDIA GPU, the stock Python of that machine (torch, Triton, numpy, pyarrow; no Ray, no vLLM, no
network) and what the working tree carries (``make gpu-kit-wheels``: pydantic and DuckDB as wheels).

1. The sweep ``infra/gpu-kit/gpu-kit.toml`` (``--cpu``: ``gpu-kit-cpu.toml``, the same experiments on small
   shapes with every kernel's ``device = "cpu"``: its CPU counterpart; Triton under its interpreter) loses
   the implementations whose kernel is not available here, and a replay's pairs with such a kernel (and
   their kernels' ``algorithms``/``ulps``), each named with its reason (an experiment left without kernels
   is dropped, and a replay where transformers is not importable); the rest is written as the spec that runs.
2. It runs **in this process** (``orchestrator.runner.launch(in_process=True)``, no Ray): the same tables,
   ledger and commits as any sweep, within ``--budget-s`` (no unit starts after it; a relaunch with the
   same ``--work`` runs the rest).
3. ``sweep verify`` runs on the tree; then the CPU side's own reports (certificates per kernel pair, the
   checks' verdicts, batch invariance) make ``summary.txt``, one page, when DuckDB is importable; without
   it the summary says so and lists the units.
4. ``OUT`` receives at most 8 files: ``results.tar.gz`` (the results tree), ``summary.txt``, ``kit.log``
   (everything printed), ``device.json`` (the device's identity) and ``spec.toml`` (what ran).

On the CPU side: ``tar xzf OUT/results.tar.gz -C kit-results`` then ``swapcheck report all --results
kit-results`` (or ``swapcheck sweep verify --results kit-results``). docs/gpu.md says what each pair shows.

Exit codes: 0 when the sweep ran (failed units are findings, recorded as rows with their error, and
counted in the summary), 1 when the kit itself failed (nothing to read), 2 for bad input (``OUT`` not
empty, a spec problem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import io
import json
import os
import platform
import sys
import tarfile
import time
import tomllib
import traceback
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
KIT = REPO / "infra" / "gpu-kit"
SPECS = {"gpu": KIT / "gpu-kit.toml", "cpu": KIT / "gpu-kit-cpu.toml"}
#: What comes back from a borrowed machine (infra README): at most 8 files of 16 MiB each.
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
#: Default time budget for the units (s): the kit must finish in 8 minutes on one H200.
BUDGET_S = 360.0
OUT_FILES = ("results.tar.gz", "summary.txt", "kit.log", "device.json", "spec.toml")


class _Tee(io.TextIOBase):
    """Writes to the terminal and the kit's log."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def _say(line: str = "") -> None:
    print(line, flush=True)


# -- the spec that runs here ------------------------------------------------------------------------

_KERNEL_LISTS = {"kdepth": ("implementations",), "exact_match": ("kernels",), "bounds": ("kernels",),
                 "batch_invariance": ("kernels", "attention_kernels"), "attention_replay": ("pairs",)}
#: Fields whose entries are attention kernels (the rest name GEMM kernels), by kind; every field of those kinds.
_ATTENTION_FIELDS = {"batch_invariance": ("attention_kernels",), "attention_replay": ("pairs",)}
#: Per-kernel tables of a kind that its kernel lists name the keys of (the kind refuses a key no entry names).
_KEYED_BY_KERNEL = {"attention_replay": ("algorithms", "ulps")}
#: A module an experiment's kind needs beyond the kit's own (the replay builds the tiny model with transformers).
_KIND_NEEDS = {"attention_replay": "transformers"}


def _impl(entry: Any) -> tuple[str, dict[str, Any], str]:
    """(kernel, params, label) of a spec's kernel entry (a name or a table)."""
    if isinstance(entry, str):
        return entry, {}, entry
    return entry["kernel"], dict(entry.get("params", {})), entry.get("label") or entry["kernel"]


def _label(entry: Any) -> str:
    """How a dropped entry is named: its label, or ``a~b`` for a pair of kernels."""
    if isinstance(entry, list):
        return "~".join(_label(e) for e in entry)
    return _impl(entry)[2]


def _names(entry: Any) -> list[str]:
    """The kernel names of an entry: one, or both of a pair."""
    if isinstance(entry, list):
        return [n for e in entry for n in _names(e)]
    return [_impl(entry)[0]]


def _short(why: str) -> str:
    """A reason's first clause (an unknown name's error lists every valid name)."""
    first = why.split("; did you mean")[0].split("; allowed:")[0]
    return first if len(first) <= 200 else first[:197] + "..."


def _unavailable(kind: str, field: str, entry: Any) -> str | None:
    """Why the kernel of ``entry`` cannot run here, or None; for a pair (``attention_replay``), that the
    first of its kernels that cannot run here is not available, and why."""
    if isinstance(entry, list):
        for one in entry:
            why = _unavailable(kind, field, one)
            if why is not None:
                return f"{_label(one)} not available here: {why}"
        return None
    if field in _ATTENTION_FIELDS.get(kind, ()):
        from tasks.attention import get_attention

        try:
            ok, why = get_attention(entry if isinstance(entry, str) else entry["kernel"]).available()
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot even load is unavailable, with its error
            return f"{type(exc).__name__}: {exc}"
        return None if ok else str(why)
    from tasks.kernels import get_kernel

    name, params, _ = _impl(entry)
    try:
        ok, why = get_kernel(name, **params).available()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None if ok else str(why)


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def runnable_spec(text: str) -> tuple[dict[str, Any], list[str]]:
    """The kit's spec without what cannot run here: (spec data, one line per thing dropped and why)."""
    data = tomllib.loads(text)
    dropped: list[str] = []
    for name, exp in list(data.get("experiments", {}).items()):
        kind = exp.get("kind", "")
        for field in _KERNEL_LISTS.get(kind, ()):
            kept = []
            for entry in exp.get(field, []):
                why = _unavailable(kind, field, entry)
                if why is None:
                    kept.append(entry)
                elif isinstance(entry, list):  # a pair goes with either of its kernels
                    dropped.append(f"experiments.{name}.{field}: pair {_label(entry)} dropped, {_short(why)}")
                else:
                    dropped.append(f"experiments.{name}.{field}: {_label(entry)} not available here: {_short(why)}")
            if field in exp:
                exp[field] = kept
        lists = [exp.get(f, []) for f in _KERNEL_LISTS.get(kind, ()) if f in exp]
        # A kdepth needs one implementation besides its reference, checks one kernel, a replay one pair.
        if lists and not any(lists):
            del data["experiments"][name]
            what = "pairs can run" if kind == "attention_replay" else "kernels is available"
            dropped.append(f"experiments.{name}: dropped, none of its {what} here")
            continue
        # A replay's algorithms and ulps name kernels of its pairs: those of dropped pairs go with them.
        named = {n for f in _KERNEL_LISTS.get(kind, ()) for e in exp.get(f, []) for n in _names(e)}
        for field in _KEYED_BY_KERNEL.get(kind, ()):
            if isinstance(exp.get(field), dict):
                exp[field] = {k: v for k, v in exp[field].items() if k in named}
        module = _KIND_NEEDS.get(kind)
        if module is not None and not _importable(module):
            del data["experiments"][name]
            dropped.append(f"experiments.{name}: dropped, its kind ({kind}) needs {module}, which is not importable here")
    if data.get("preregistration") and not _importable("duckdb"):
        # A launch checks each prediction's SQL with DuckDB before it registers it.
        dropped.append(f"preregistration {data.pop('preregistration')}: not registered, DuckDB is not importable "
                       "here (make gpu-kit-wheels carries it)")
    return data, dropped


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def spec_text(data: dict[str, Any], header: str) -> str:
    """``data`` (a spec of top-level values and one ``[experiments.<name>]`` table each) as TOML."""
    lines = [header.rstrip(), ""]
    for key, value in data.items():
        if key != "experiments":
            lines.append(f"{key} = {_toml_value(value)}")
    for name, exp in data.get("experiments", {}).items():
        lines += ["", f"[experiments.{json.dumps(name)}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in exp.items()]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != data:  # written as read, or not at all
        raise AssertionError("the kit's spec did not survive its TOML round trip")
    return text


def _for_sweep(prereg_text: str, sweep: str, mode: str) -> str:
    """A prediction file's text with its ``sweep = ...`` line naming ``sweep``; in ``cpu`` mode without the
    predictions whose id ends in ``-on-gpu`` (what only a GPU can show)."""
    import re

    text = re.sub(r'(?m)^sweep = "[^"]*"', f"sweep = {json.dumps(sweep)}", prereg_text, count=1)
    if mode == "cpu":
        head, *blocks = text.split("[[predictions]]")
        text = head + "".join(f"[[predictions]]{b}" for b in blocks if not re.search(r'(?m)^id = "[^"]*-on-gpu"', b))
    return text


def headline_pairs(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The pairs the kit is about, by label: each GPU kernel and its CPU emulation (``Kernel.emulation()``,
    matched to the experiment's entry of the same kernel and params), the GPU kernels of one
    experiment with each other (cuBLAS vs Triton, fast vs precise), and each attention pair a replay
    names (the SDPA backends with each other)."""
    from tasks.kernels import get_kernel

    def built(name: str, params: dict[str, Any]) -> Any:
        try:
            return get_kernel(name, **params)
        except Exception:  # noqa: BLE001 - listed as dropped already
            return None

    pairs: list[tuple[str, str]] = []
    for exp in data.get("experiments", {}).values():
        if exp.get("kind") == "attention_replay":
            pairs += [(a, b) for a, b in exp.get("pairs", [])]
            continue
        if exp.get("kind") != "kdepth":
            continue
        kernels = {label: built(name, params) for name, params, label in map(_impl, exp.get("implementations", []))}
        identity = {label: (k.name, k.params) for label, k in kernels.items() if k is not None}
        gpu = []
        for label, kernel in kernels.items():
            emulation = getattr(kernel, "emulation", None)
            if kernel is None or (emulation is None and "device" not in kernel.params):
                continue
            gpu.append(label)
            if emulation is None:
                continue
            emu = emulation(exp.get("dtype", "int8"))
            target = built(emu["kernel"], emu.get("params", {})) if emu else None
            match = [lb for lb, ident in identity.items() if target is not None and ident == (target.name, target.params)]
            if match:
                pairs.append((label, match[0]))
        pairs += [(a, b) for i, a in enumerate(gpu) for b in gpu[i + 1:]]
    seen: set[frozenset[str]] = set()
    out = []
    for p in pairs:
        if frozenset(p) not in seen:
            seen.add(frozenset(p))
            out.append(p)
    return out


# -- the device -------------------------------------------------------------------------------------

def device_identity(mode: str) -> dict[str, Any]:
    """The machine the kit ran on: GPU, driver, CUDA, torch, Triton, cuBLAS, cuDNN (provenance.collect)."""
    from orchestrator import provenance

    info = provenance.collect()
    ident = info.get("identity", {})
    lib = ident.get("libraries", {})
    return {"mode": mode, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "host": info.get("host"), "cpu": info.get("cpu"),
            "cpu_count": info.get("cpu_count"), "torch": lib.get("torch"), "cuda": lib.get("cuda"),
            "driver": lib.get("driver"), "cublas": lib.get("cublas"), "cublaslt_runtime": lib.get("cublaslt_runtime"),
            "cudnn": lib.get("cudnn"), "triton": lib.get("triton") or _triton_version(),
            "gpu": ident.get("gpu"), "identity_sha256": info.get("identity_sha256"),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("TRITON_", "CUBLAS", "NVIDIA_TF32"))}}


def _triton_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def device_line(d: dict[str, Any]) -> str:
    gpu = d.get("gpu")
    if isinstance(gpu, dict):
        where = (f"{', '.join(gpu.get('devices') or [])} (capability {'.'.join(map(str, gpu.get('capability') or []))}, "
                 f"{gpu.get('multiprocessors')} SMs, {gpu.get('memory_gib')} GiB), driver {d.get('driver')}, "
                 f"CUDA {d.get('cuda')}, cuBLAS {d.get('cublas')} (cuBLASLt runtime {d.get('cublaslt_runtime')}), "
                 f"cuDNN {d.get('cudnn')}")
    else:
        where = f"no GPU ({gpu or 'no CUDA device'}): CPU counterparts on {d.get('cpu')}"
    return f"{where}; torch {d.get('torch')}, Triton {d.get('triton')}, Python {d.get('python')}"


# -- what the CPU side reads ------------------------------------------------------------------------

def dropped_lines(dropped: list[str]) -> list[str]:
    """What was dropped, one line per kernel and reason (spec.toml's header keeps every place)."""
    import re

    by_kernel: dict[tuple[str, str], int] = {}
    rest = []
    for d in dropped:
        m = re.search(r"(\S+) not available here: (.*)$", d)
        if m:
            key = (m.group(1), _short(m.group(2)))
            by_kernel[key] = by_kernel.get(key, 0) + 1
        elif not re.match(r"experiments\.[^:]+: dropped, none of its", d):  # implied by the kernels' lines
            rest.append(f"dropped: {d}")
    return [f"dropped: {k} ({n} place{'s' if n > 1 else ''} in the spec): {why}" for (k, why), n in by_kernel.items()] + rest


def run_lines(run: dict[str, Any]) -> list[str]:
    """The summary's head: mode, device, units, verify, what was dropped, failed units."""
    lines = [f"swapcheck GPU kit, {run['mode']} mode, {run['date']}",
             f"device: {run['device_line']}",
             f"units: {run['n_units']} planned, {run['n_ok']} ok, {run['n_failed']} failed, "
             f"{run['n_not_run']} not run ({run['status']}), {run['seconds']:.0f} s; sweep verify: {run['verify']}"]
    lines += dropped_lines(run["dropped"])
    lines += [f"FAILED {uid}: {err}" for uid, err in run["failures"][:10]]
    if len(run["failures"]) > 10:
        lines.append(f"... and {len(run['failures']) - 10} more failed units (kit.log, report units)")
    return lines


def summary_lines(results: Path, sweep: str, run: dict[str, Any]) -> list[str]:
    """The one-page summary: :func:`run_lines`, then each kernel pair's verdict and answer, the checks,
    batch invariance: the CPU side's own reports, through DuckDB (carried as a wheel)."""
    lines = run_lines(run)
    if not _importable("duckdb"):
        return lines + ["", "DuckDB is not importable here (make gpu-kit-wheels carries it): no verdict table; "
                        "read results.tar.gz on the CPU side with `swapcheck report all`."]
    from reports import certificate, noise_floor, predictions
    from storage.catalog import open_catalog

    with open_catalog(results) as cat:
        certs = certificate.certificates(cat, sweep)
        checks = certificate.check_verdicts(cat, sweep)
        nf = noise_floor.noise_floor(cat, sweep)
        scored = predictions.score(cat, sweep)
    wanted = {frozenset(p): i for i, p in enumerate(run.get("pairs", []))}
    head = sorted((c for c in certs if frozenset((c["kernel_a"], c["kernel_b"])) in wanted),
                  key=lambda c: wanted[frozenset((c["kernel_a"], c["kernel_b"]))])
    lines += ["", "GPU kernel vs its emulation, and GPU kernel vs GPU kernel (certificates over K-depth; "
                  "attention pairs over the replayed layers):"]
    for c in head:
        by = "; ".join(f"{s['scale_mode']}: {s['verdict']}" for s in c["scale_modes"])
        lines.append(f"  {c['kernel_a']} vs {c['kernel_b']}: {c['verdict']} ({by})")
        if c["verdict"] != "IDENTICAL":  # "bit-identical under ..." says nothing the verdict does not
            lines.append(f"      {c['answer']}")
    if len(certs) > len(head):
        lines.append(f"  ({len(certs) - len(head)} more pairs of the same experiments: swapcheck report certificate)")
    if scored:
        lines += ["", "pre-registered predictions (infra/gpu-kit/predictions.toml):"]
        for r in scored:
            support = f"{r['support']} {r['noun'] or ''}".strip()
            bad = f"; e.g. {r['counterexample']}" if r.get("counterexample") else ""
            status = r["status"].upper() if r.get("matched") else "NO ROWS"  # its kernels did not run here
            lines.append(f"  {status:9s} {r['prediction']}: {support}{bad}")
    if checks:
        lines += ["", "checks (worst verdict per kernel):"]
        lines += [f"  {r['check']:12s} {r['kernel']} ({r['dtype']}): {r['verdict']}" for r in checks]
    rows = list(nf.get("kernels") or []) + list(nf.get("attention_kernels") or [])
    if rows:
        lines += ["", "batch invariance (probe row in batches of M vs alone):"]
        for r in rows:
            name = r.get("kernel") or r.get("attention") or "?"
            dtype = r.get("out_dtype") or r.get("dtype") or r.get("attention_dtype")
            extra = f" ({dtype})" if dtype else ""
            lines.append(f"  {name}{extra}: {r.get('verdict')}")
    lines += ["", "read it all: tar xzf results.tar.gz -C kit-results && swapcheck report all --results kit-results"]
    return lines


def pack(results: Path, out: Path) -> Path:
    """The results tree as ``OUT/results.tar.gz`` (paths relative to the tree's root)."""
    target = out / "results.tar.gz"
    with tarfile.open(target, "w:gz", compresslevel=6) as tar:
        for path in sorted(results.rglob("*")):
            rel = path.relative_to(results)
            if path.is_file() and not rel.parts[0].startswith(".") and "_state" not in rel.parts[:1]:
                tar.add(path, arcname=str(rel), recursive=False)
    return target


# -- the run ----------------------------------------------------------------------------------------

def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="infra/gpu-kit/run.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the kit's files (at most 8): empty or new")
    p.add_argument("--cpu", action="store_true",
                   help="every device call replaced by its CPU counterpart, Triton under its interpreter, small shapes")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help=f"no unit starts after this many seconds (default {BUDGET_S:g})")
    p.add_argument("--work", type=Path, default=None,
                   help="where the results tree is built (default: a new folder under $TMPDIR); the same "
                        "--work again resumes a run that ran out of budget")
    p.add_argument("--spec", type=Path, default=None, help="another kit spec (default infra/gpu-kit/gpu-kit[-cpu].toml)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    mode = "cpu" if args.cpu else "gpu"
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: OUT {out} must be a new or empty folder (the kit writes at most {MAX_FILES} files there)",
              file=sys.stderr)
        return 2
    if not args.budget_s > 0:
        print(f"error: --budget-s must be positive, got {args.budget_s}", file=sys.stderr)
        return 2
    if args.spec is not None and not args.spec.is_file():
        print(f"error: --spec {args.spec}: no such file", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if mode == "cpu":
        # Read when a Triton function is decorated: before any kernel module imports triton.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    log = (out / "kit.log").open("w", encoding="utf-8")
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout = _Tee(stdout, log)
    sys.stderr = _Tee(stderr, log)
    from orchestrator.errors import exit_code_for

    try:
        return _run(args, mode, out)
    except Exception as exc:  # noqa: BLE001 - the kit's own failure: its traceback is the log's last lines
        code = exit_code_for(exc)
        if code is not None:  # what the CLI shows as a message (a spec or prediction file refused: exit 2)
            print(f"error: {exc}", file=sys.stderr)
            return code
        traceback.print_exc()
        _say("the kit failed (above); what it had written is in OUT")
        return 1
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        log.close()


def _run(args: argparse.Namespace, mode: str, out: Path) -> int:
    import tempfile

    t0 = time.monotonic()
    spec_path = args.spec or SPECS[mode]
    _say(f"swapcheck GPU kit ({mode} mode): {spec_path}")
    device = device_identity(mode)
    (out / "device.json").write_text(json.dumps(device, indent=2, sort_keys=True, default=str) + "\n")
    _say(f"device: {device_line(device)}")
    if mode == "gpu" and not isinstance(device.get("gpu"), dict):
        print("error: no CUDA device here; run with --cpu for the CPU counterparts", file=sys.stderr)
        return 2

    text = spec_path.read_text(encoding="utf-8")
    data, dropped = runnable_spec(text)
    for line in dropped:
        _say(f"dropped: {line}")
    header = (f"# The GPU kit's spec as it ran here ({mode} mode): {spec_path.name} without what is not available\n"
              + "".join(f"# dropped: {d}\n" for d in dropped))
    ran = spec_text(data, header)
    (out / "spec.toml").write_text(ran, encoding="utf-8")
    work = args.work or Path(tempfile.mkdtemp(prefix="swapcheck-kit-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.toml").write_text(ran, encoding="utf-8")
    for name in data.get("preregistration", []):
        # The predictions, registered for the sweep that runs (gpu-kit, or gpu-kit-cpu in --cpu mode).
        source = (spec_path.parent / name).read_text(encoding="utf-8")
        (work / name).write_text(_for_sweep(source, data["name"], mode), encoding="utf-8")
    results = work / "results"
    _say(f"results tree: {results}")

    from orchestrator.errors import SpecError
    from orchestrator.runner import launch
    from orchestrator.spec import load_spec
    from storage import verify
    from storage.store import open_store

    try:
        spec = load_spec(work / "spec.toml")
    except SpecError as exc:  # named by the user's file: the one in the work folder is derived from it
        raise SpecError(str(spec_path), exc.problems) from None
    done = [0]

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if kind == "cluster":
            _say(f"running {info['line']}")
        elif kind == "start":
            _say(f"{info['pending']} of {info['total']} unit(s) to run ({info['skipped']} done before)")
        elif kind == "message":
            _say(f"{info['level']}: {info['line']}")
        elif kind == "unit":
            done[0] += 1
            res = info["result"]
            err = f": {(res.get('error') or '').splitlines()[0]}" if res["status"] != "ok" else ""
            _say(f"[{done[0]:4d}] {res['status']:6s} {res.get('duration_s') or 0:7.2f} s  "
                 f"{info['unit'].describe()}{err}")

    summary = launch(spec, results, on_event=on_event, in_process=True, budget_s=args.budget_s)
    store = open_store(results)
    problems = verify.verify(store, spec.sweep.name)
    verified = "clean" if not problems else f"{len(problems)} problem(s): " + "; ".join(str(p) for p in problems[:3])
    n_not_run = summary.n_units - summary.n_skipped - summary.n_ok - summary.n_failed
    status = "budget reached: a relaunch with the same --work runs the rest" if summary.budget_reached else "finished"
    run = {"mode": mode, "date": device["date"], "device_line": device_line(device), "n_units": summary.n_units,
           "n_ok": summary.n_ok + summary.n_skipped, "n_failed": summary.n_failed, "n_not_run": n_not_run,
           "status": status, "seconds": time.monotonic() - t0, "verify": verified, "dropped": dropped,
           "failures": summary.failures, "pairs": headline_pairs(data)}
    packed = pack(results, out)
    try:
        lines = summary_lines(results, spec.sweep.name, run)
    except Exception as exc:  # noqa: BLE001 - the tree is packed: the summary's failure is said, not fatal
        traceback.print_exc()
        lines = run_lines(run) + [f"the summary's reports failed ({type(exc).__name__}: {exc}); the results tree "
                                  "is packed: read it on the CPU side with `swapcheck report all`"]
    (out / "summary.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _say("")
    for line in lines:
        _say(line)
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    big = [f"{n} ({s / 2**20:.1f} MiB)" for n, s in sizes.items() if s > MAX_FILE_BYTES]
    _say(f"\nOUT: {len(sizes)} file(s), {sum(sizes.values()) / 2**20:.2f} MiB ({packed.name} "
         f"{sizes[packed.name] / 2**20:.2f} MiB); the tree itself stays at {results}")
    if big or len(sizes) > MAX_FILES:
        _say(f"WARNING: a borrowed machine returns at most {MAX_FILES} files of 16 MiB: {', '.join(big) or len(sizes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
