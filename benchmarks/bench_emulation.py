"""Speed of the exact emulations of the matmul algorithms (``tasks.numerics.products``) relative to
``torch.matmul`` in fp32 on the same shape, each side timed in a process of its own (issue #14, #25).

Each row is one algorithm x accumulation format x input dtype x fma.  The candidate is ``alg.run(A, B)``;
the baseline is ``torch.matmul`` of the same ``A [M, K]`` and ``B [K, N]`` in fp32 (randn data, the
same seeded generator in both processes).

**Each side in its own process.** Two persistent worker processes (this script with ``--worker
candidate`` and ``--worker baseline``) are driven over a pipe, one JSON line per command: the
driver asks one to time while the other waits idle on its pipe, alternately, with an untimed pause
before each timing (``PAUSE_S``: a thread pool that spins after its last call settles before the
other side starts). In one process, torch's allocator and thread pool stalled the numba kernels by
10-12 ms at random (pair ratios 1.1-42x on a loaded machine); apart, neither side sees the other's
state. Both workers call ``common.apply_threads`` with ``--threads`` (default 1) before anything is
timed (the candidate's also sizes numba's pool), recorded per row as ``threads`` and
``numba_threads``.

**One timing** of either side runs its call repeatedly until at least ``--window`` seconds (default
0.1) have passed, at least once, and returns the mean seconds per call: the same rule for both
sides (a 1.6 ms matmul is one scheduler tick, so it is averaged over many calls; an emulation that
takes longer than the window is one call). A pair is one candidate timing and the baseline timing
that follows it; the ratio is candidate over baseline, per pair, judged on the median of
``--repeat`` pairs (default 5; ``best`` is informative), after one untimed warm-up pair.  Goals: 10x
for fp32 accumulators, 30x for 16-bit (bf16, fp16) accumulators.

    python benchmarks/bench_emulation.py [--m 256] [--k 4096] [--repeat 5] [--window 0.1] [--quick | --smoke]
                                         [--threads N] [--json PATH]

The ``path`` column says which exact method each row takes (docs/numerics.md, "Speed"): the rows call
the public ``alg.run``, which dispatches to a compiled numba kernel (tasks/numerics/compiled.py)
where one covers the configuration.  The first call of a row in the candidate's process (not in
the ratio) loads the kernel from numba's cache or compiles it; its time is printed and recorded as
``first_call_s``.  ``--smoke`` runs four rows at M = N = 16, K = 128, one pair: a check of the harness.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


def _path(alg: Any, a: Any, b: Any) -> str:
    """In words, the exact method ``alg.run(a, b)`` takes (kept in step with tasks/numerics/products.py
    and compiled.py): the public entry point dispatches to a compiled kernel where one covers it."""
    from tasks.numerics import compiled

    acc = alg.format.name
    name = alg.name
    if name == "matmul_exact_accumulation":
        if compiled.available():
            return ("numba: fp64 BLAS over 16 K-blocks + certified bound per output; undecided outputs "
                    "re-summed by compiled TwoSum, then in digits")
        return "torch: one fp64 BLAS matmul + certified bound; undecided outputs re-summed, then in digits"
    if name == "matmul_slots16":
        return "torch: per-output int32 sort, runs interleaved with +0 padding, numpy row-by-row fp32 adds"
    x, y = compiled.operands32(a), compiled.operands32(b)
    assert x is not None and y is not None
    which = compiled.path(alg.format, alg.rounding, x[1], y[1], x[0], y[0])
    tree = name == "matmul_pairwise"
    if which == "f32" and acc == "fp32":
        if alg.fma:
            how = "fp32 llvm.fma per step" + ("; leaf pairs: fp64 sum rounded to odd" if tree else "")
        else:
            how = "fp32 multiply, fp32 tree" if tree else "fp32 multiply + fp32 add per step"
        return f"numba f32 kernel: {how}"
    if which == "f32":
        how = "fp32 TwoSum rounded to odd" if alg.fma else f"products and fp32 sums rounded to {acc}"
        return f"numba f32 kernel: {how}, rounded to {acc} (fp16: hardware conversion where the CPU has one)"
    if which == "gen":
        return "numba fp64 kernel: TwoSum + bit rounding to the format per addition"
    return "torch engines (numba not available)"


#: The rows a --smoke run keeps (one per kind of path: fp32 kernel, exact, 16-bit accumulator).
SMOKE_ROWS = ("sequential acc=fp32 in=fp32 fma=False", "sequential acc=fp32 in=bf16 fma=True",
              "exact_accumulation acc=fp32 in=fp32 fma=True", "sequential acc=bf16 in=bf16 fma=False")


def _rows(quick: bool) -> list[tuple[Any, str, bool, float]]:
    """(algorithm, inputs dtype, fma, goal)."""
    from tasks.numerics import products as P

    rows: list[tuple[Any, str, bool, float]] = []
    for fma in (False, True):
        for alg in (P.matmul_sequential("float32", fma=fma), P.matmul_pairwise("float32", fma=fma),
                    P.matmul_blocked("float32", 128, fma=fma)):  # fmt: skip
            rows.append((alg, "fp32", fma, 10.0))
    for fma in (False, True):
        for alg in (P.matmul_sequential("float32", fma=fma), P.matmul_pairwise("float32", fma=fma),
                    P.matmul_blocked("float32", 128, fma=fma)):  # fmt: skip
            rows.append((alg, "bf16", fma, 10.0))
    rows.append((P.matmul_exact_accumulation("float32"), "fp32", True, 10.0))
    rows.append((P.matmul_exact_accumulation("float32"), "bf16", True, 10.0))
    rows.append((P.matmul_slots16("float32"), "fp32", False, 10.0))
    for fmt, inputs in (("bfloat16", "bf16"), ("float16", "fp16")):
        for fma in (False, True):
            algs = [P.matmul_sequential(fmt, fma=fma), P.matmul_pairwise(fmt, fma=fma),
                    P.matmul_blocked(fmt, 128, fma=fma)]  # fmt: skip
            if quick:
                algs = algs[:1]
            for alg in algs:
                rows.append((alg, inputs, fma, 30.0))
    return rows


def _label(alg: Any, inputs: str, fma: bool) -> str:
    name = alg.name.removeprefix("matmul_")
    if hasattr(alg, "block_size"):
        name += f"({alg.block_size})"
    return f"{name} acc={alg.format.name} in={inputs} fma={fma}"


#: Untimed pause before every timing, so that the side that just ran is idle when the other starts.
PAUSE_S = 0.05


def _timed(fn: Callable[[], Any], window: float) -> float:
    """Mean seconds per call of ``fn`` over at least ``window`` seconds (at least one call)."""
    calls = 0
    t0 = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= window:
            return elapsed / calls


def worker(role: str) -> None:
    """A timing process: reads one JSON command per line on stdin, answers one JSON line on stdout.

    ``{"op": "setup", "m", "k", "threads", "quick"}`` (both roles): the seeded inputs, the thread
    count; the candidate answers its rows (label, goal). ``{"op": "prepare", "label"}`` (candidate):
    the row's first call, timed, and its path. ``{"op": "time", "label", "window"}``: mean seconds per
    call (the baseline ignores the label: always the fp32 ``torch.matmul``). ``{"op": "exit"}``."""
    import json

    out = sys.stdout
    sys.stdout = sys.stderr  # only the answers go to the pipe
    state: dict[str, Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        answer: dict[str, Any] = {}
        if op == "setup":
            import torch

            # numba (the candidate's compiled paths) is imported here, after the environment has the count
            answer["threads"] = common.apply_threads(cmd["threads"], numba=role == "candidate")
            answer["torch_threads"] = torch.get_num_threads()
            g = torch.Generator().manual_seed(0)
            a32 = torch.randn(cmd["m"], cmd["k"], generator=g)
            b32 = torch.randn(cmd["k"], cmd["m"], generator=g)
            state["inputs"] = {"fp32": (a32, b32), "bf16": (a32.bfloat16(), b32.bfloat16()),
                               "fp16": (a32.half(), b32.half())}  # fmt: skip
            if role == "candidate":
                state["rows"] = {_label(alg, kind, fma): (alg, kind) for alg, kind, fma, _ in _rows(cmd["quick"])}
                answer["rows"] = [{"label": _label(alg, kind, fma), "goal": goal}
                                  for alg, kind, fma, goal in _rows(cmd["quick"])]
        elif op == "prepare":
            alg, kind = state["rows"][cmd["label"]]
            a, b = state["inputs"][kind]
            t0 = time.perf_counter()
            alg.run(a, b)  # first call: kernel load or JIT compile, reported, not in the ratio
            answer = {"first_call_s": time.perf_counter() - t0, "path": _path(alg, a, b)}
        elif op == "time":
            if role == "candidate":
                alg, kind = state["rows"][cmd["label"]]
                a, b = state["inputs"][kind]
                answer["seconds"] = _timed(partial(alg.run, a, b), cmd["window"])
            else:
                import torch

                a32, b32 = state["inputs"]["fp32"]
                answer["seconds"] = _timed(partial(torch.matmul, a32, b32), cmd["window"])
        elif op == "exit":
            return
        out.write(json.dumps(answer) + "\n")
        out.flush()


class Worker:
    """The driver's end of one timing process (``worker``): ``ask`` sends a command, waits for the answer."""

    def __init__(self, role: str) -> None:
        import subprocess

        self.role = role
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", role],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=common.REPO)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.role} worker ended (exit {self.proc.wait()}); its stderr is above")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a worker that does not exit is ended
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__.splitlines()[0] if __doc__ else "bench_emulation")
    ap.add_argument("--m", type=int, default=None, help="M = N (default 256; --quick: 64; --smoke: 16)")
    ap.add_argument("--k", type=int, default=None, help="K (default 4096; --quick: 1024; --smoke: 128)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="timed pairs per row (default 5; --quick: 3; --smoke: 1), after one warm-up pair")
    ap.add_argument("--window", type=float, default=None,
                    help="seconds each timing runs its call for, at least once (default 0.1; --smoke: 0.01)")
    ap.add_argument("--only", default="", help="run only rows whose label contains this text")
    ap.add_argument("--worker", choices=("candidate", "baseline"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    smoke = common.tier(args) == "smoke"
    m = args.m or common.pick(args, 256, 64, 16)
    k = args.k or common.pick(args, 4096, 1024, 128)
    repeat = args.repeat or common.pick(args, 5, 3, 1)
    window = args.window if args.window is not None else common.pick(args, 0.1, 0.1, 0.01)
    # The driver times nothing; it sets the count in the environment the workers inherit.
    threads = common.apply_threads(args.threads)
    cand, base = Worker("candidate"), Worker("baseline")
    cases: list[common.Case] = []
    try:
        setup = {"op": "setup", "m": m, "k": k, "threads": args.threads, "quick": args.quick or smoke}
        c_setup, b_setup = cand.ask(**setup), base.ask(**setup)
        print(f"M = N = {m}, K = {k}, pairs per row {repeat} (+1 warm-up), window {window:g} s; threads: driver "
              f"{threads}, candidate {c_setup['threads']}, baseline {b_setup['threads']}", flush=True)
        for row in c_setup["rows"]:
            label, goal = row["label"], row["goal"]
            if args.only and args.only not in label:
                continue
            if smoke and label not in SMOKE_ROWS:
                continue
            t0 = time.perf_counter()
            prep = cand.ask(op="prepare", label=label)
            seconds: list[float] = []
            base_seconds: list[float] = []
            for round_ in range(1 + repeat):  # the first pair warms both processes up
                time.sleep(PAUSE_S)
                s = cand.ask(op="time", label=label, window=window)["seconds"]
                time.sleep(PAUSE_S)
                b = base.ask(op="time", label=label, window=window)["seconds"]
                if round_:
                    seconds.append(s)
                    base_seconds.append(b)
            path, first = prep["path"], prep["first_call_s"]
            case = common.Case(stage="emulation", case=label, baseline=f"torch.matmul fp32 ({m}x{k}x{m}), own process",
                               seconds=seconds, baseline_seconds=base_seconds, goal=goal,
                               notes=f"{path}; first call {first:.2f} s (not in the ratio)",
                               extra={"m": m, "n": m, "k": k, "threads": c_setup["torch_threads"],
                                      "baseline_threads": b_setup["torch_threads"],
                                      "numba_threads": c_setup["threads"].get("numba"), "path": path,
                                      "first_call_s": first, "window_s": window, "processes": "one per side",
                                      "load_average": common.load_average()})  # fmt: skip
            case.extra["pair_ratios"] = case.pair_ratios()
            cases.append(case)
            print(f"  {label:48} median {case.ratio_median:7.2f}x (best {case.ratio_min:.2f}x; pairs "
                  f"{', '.join(f'{r:.2f}' for r in case.pair_ratios())}; {statistics.median(seconds) * 1e3:.1f} ms vs "
                  f"{statistics.median(base_seconds) * 1e3:.2f} ms; first call {first:.2f} s; row took "
                  f"{time.perf_counter() - t0:.1f} s)  [{path}]", flush=True)  # fmt: skip
    finally:
        cand.close()
        base.close()
    common.emit(cases, args.json, title=f"bench_emulation: exact emulation vs torch.matmul fp32, each in its own "
                                        f"process, M = N = {m}, K = {k}")  # fmt: skip


if __name__ == "__main__":
    main()
