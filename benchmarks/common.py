"""What every benchmark script shares: interleaved timing, ratios against a named baseline measured in
the same run, the goal beside each ratio, and one JSON record per measured case.

A benchmark script ``benchmarks/bench_<stage>.py`` measures one stage. For each case it times the
candidate and its baseline alternately (``interleaved``), so a neighbour's burst of load lands on both;
the ratio of the i-th candidate time to the i-th baseline time is one observation, and the script
reports the best and the median of those ratios. Every goal is judged on the MEDIAN of the pairs
(``Case.judge``, ``JUDGED_ON``): one undisturbed baseline beside a disturbed candidate (or the reverse)
moves the best pair a long way and the median little; ``best`` is kept as an informative column.

Each side of a pair does the same work: the baseline computes the same numbers from the same input
as the candidate (the scripts' docstrings say how), with the same thread count (``apply_threads`` in
every process that times anything), and where the two sides could disturb each other inside one
process (a library's thread pool, a garbage collector, a JIT), each is timed in a process of its own
while the other waits idle (``bench_emulation``'s two persistent workers, ``bench_reads``' fresh
processes).

Each script accepts the harness's common options (``parser``): ``--json PATH`` (write its cases there),
``--quick`` (smaller sizes), ``--smoke`` (the smallest sizes: a run of the harness in seconds, not a
measurement) and ``--threads N`` (default 1: the thread count of every library that times with threads,
the same for candidate and baseline; ``apply_threads``). ``benchmarks/run_all.py`` (``make bench``) runs
every script in a subprocess and collects them into ``benchmarks/results.json`` with the machine, the
versions, the thread count and the load average around each script; a stage run on a loaded machine
is marked not comparable there (``comparability``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Case", "JUDGED_ON", "interleaved", "emit", "parser", "machine", "peak_rss_of", "load_average", "apply_threads",
           "pick", "tier", "default_max_load", "own_load", "comparability", "THREAD_ENV",
           "running_tasks", "OthersLoad"]

REPO = Path(__file__).resolve().parents[1]

#: The environment variables that fix the thread pools of OpenMP (torch, pyarrow), MKL, OpenBLAS and numba
#: in a process started with them (run_all sets them for every script; ``apply_threads`` for children).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
#: The thread count ``apply_threads`` set in this process (None: never called); recorded in every case.
THREADS: int | None = None
#: The 1-minute load average is an exponentially damped mean of the runnable tasks, time constant 60 s.
LOAD_TIME_CONSTANT_S = 60.0
#: The default load threshold, per core: above it a stage is not comparable (``default_max_load``).
MAX_LOAD_PER_CORE = 0.75
#: What every goal is judged on, in words (printed by ``emit``, ``run_all.py``'s summary, ``--show``
#: and ``--markdown``).
JUDGED_ON = "judged on the median of the paired ratios (best: informative)"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def running_tasks(root: int) -> tuple[int, int]:
    """What the kernel counts in its load average right now, ``(ours, all)``: the threads in state R
    (runnable) or D (uninterruptible) of ``root`` and its descendants, and of every process (Linux
    ``/proc``; a process or thread that exits while it is read is skipped)."""
    parents: dict[int, int] = {}
    counts: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                parents[pid] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            n = 0
            for task in os.scandir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{task.name}/stat", "rb") as fh:
                        n += fh.read().rsplit(b")", 1)[1].split()[0] in (b"R", b"D")
                except (OSError, IndexError):
                    continue
            counts[pid] = n
        except (OSError, IndexError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = 0, [root]
    while todo:
        pid = todo.pop()
        ours += counts.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return ours, sum(counts.values())


class OthersLoad:
    """The 1-minute load average of every process but ours (``root`` and its descendants), computed as
    the kernel computes the load: every ``interval`` seconds (the kernel's 5) the runnable and
    uninterruptible tasks not ours are counted (:func:`running_tasks`) and folded into an exponentially
    damped mean, time constant 60 s, started from the load average at :meth:`start` (when nothing of
    ours runs yet). A background thread samples; :attr:`peak` is the largest value since :meth:`reset_peak`.

    This sees every process a stage starts, however long it lives and whoever reaps it (Ray's raylet,
    GCS and workers), where a CPU-time estimate of our share (:func:`own_load`) sees only the processes
    reaped by the end of the stage, spread evenly over it."""

    def __init__(self, root: int | None = None, interval: float = 5.0) -> None:
        import threading

        self.root = root if root is not None else os.getpid()
        self.interval = interval
        self.value = load_average()[0]
        self.peak = self.value
        self.samples = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="others-load", daemon=True)

    def start(self) -> OthersLoad:
        self.value = self.peak = load_average()[0]
        self._at = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> float:
        """Count the others' tasks now and fold them in; the new value."""
        ours, every = running_tasks(self.root)
        return self.fold(every - ours, time.monotonic())

    def fold(self, others: int, now: float) -> float:
        """Fold ``others`` running tasks seen at ``now`` (monotonic seconds) into the damped mean."""
        with self._lock:
            decay = math.exp(-(now - self._at) / LOAD_TIME_CONSTANT_S)
            self.value = self.value * decay + max(others, 0) * (1.0 - decay)
            self._at = now
            self.peak = max(self.peak, self.value)
            self.samples += 1
            return self.value

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.value

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)


def default_max_load(cores: int | None = None) -> float:
    """The stated default threshold: 0.75 per core (1.5 on 2 cores, the figure docs/performance.md
    has used since the first runs)."""
    return round(MAX_LOAD_PER_CORE * (cores or os.cpu_count() or 1), 2)


def own_load(previous: float, cores_busy: float, seconds: float) -> float:
    """This run's own share of the 1-minute load average after ``seconds`` during which its processes
    kept ``cores_busy`` cores busy on average, starting from ``previous`` (the kernel's update rule,
    load = load * e + n * (1 - e) with e = exp(-dt / 60 s), applied to our part with n constant)."""
    decay = math.exp(-max(seconds, 0.0) / LOAD_TIME_CONSTANT_S)
    return previous * decay + cores_busy * (1.0 - decay)


def comparability(load_before: Sequence[float], load_after: Sequence[float], max_load: float,
                  own_before: float = 0.0, own_after: float = 0.0,
                  others_peak: float | None = None) -> tuple[bool, str | None]:
    """Is a stage comparable with a quiet run? No when the 1-minute load average, less this run's own
    share of it (the stage's and the previous stages' own processes: :class:`OthersLoad`, or the
    CPU-time estimate ``own_load``), exceeds ``max_load`` before or after the stage, or when the load
    of the other processes (``others_peak``, sampled) exceeded it at any time during the stage.
    Returns (comparable, why not)."""
    why = []
    for when, load, own in (("before", load_before, own_before), ("after", load_after, own_after)):
        other = load[0] - own
        if other > max_load:
            share = f" ({load[0]:.2f} less {own:.2f} of this run's own)" if own >= 0.005 else ""
            why.append(f"load {when} {other:.2f}{share} > {max_load:g}")
    if others_peak is not None and others_peak > max_load and not why:
        why.append(f"other processes' load peaked at {others_peak:.2f} during the stage > {max_load:g}")
    return (not why, "; ".join(why) or None)


@dataclass
class Case:
    """One measured comparison: ``seconds`` (candidate) against ``baseline_seconds`` (the named baseline),
    paired repetition by repetition. ``goal`` with ``direction`` "<=" (a cost ratio: candidate time over
    baseline time must not exceed it) or ">=" (a throughput ratio: baseline time over candidate time must
    reach it; set ``throughput=True``)."""

    stage: str
    case: str
    baseline: str
    seconds: list[float]
    baseline_seconds: list[float]
    goal: float | None
    direction: str = "<="
    throughput: bool = False
    #: Which ratio the goal is judged on: "median" (every goal of the harness) or "min" (the best pair;
    #: kept for reading results files written before the median rule).
    judge: str = "median"
    unit: str = "x"
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: What ``seconds`` and ``baseline_seconds`` hold: wall seconds unless a script says otherwise.
    quantity: str = "seconds"
    #: The load average when the case was recorded (scripts make a Case right after timing its pairs).
    load_after: list[float] = field(default_factory=load_average)

    def pair_ratios(self) -> list[float]:
        pairs = zip(self.seconds, self.baseline_seconds, strict=False)
        if self.throughput:
            return [b / s for s, b in pairs if s > 0]
        return [s / b for s, b in pairs if b > 0]

    @property
    def ratio_min(self) -> float:
        r = self.pair_ratios()
        # for a throughput ratio the best observation is the largest
        return (max(r) if self.throughput else min(r)) if r else float("nan")

    @property
    def ratio_median(self) -> float:
        r = self.pair_ratios()
        return statistics.median(r) if r else float("nan")

    @property
    def judged(self) -> float:
        return self.ratio_min if self.judge == "min" else self.ratio_median

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.judged <= self.goal if self.direction == "<=" else self.judged >= self.goal

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ratio_best=self.ratio_min, ratio_median=self.ratio_median, judged=self.judged, met=self.met,
                 repetitions=len(self.pair_ratios()), threads=THREADS)
        return d


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int, warmup: int = 1,
                pause_s: float = 0.0) -> dict[str, list[float]]:
    """Run each function ``warmup`` times, then ``repeat`` rounds of each in turn; the seconds per round.
    ``pause_s``: an untimed pause before every call (to let background work of the previous call settle)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + repeat):
        for name, fn in fns.items():
            time.sleep(pause_s)
            t0 = time.perf_counter()
            fn()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def peak_rss_of(cmd: Sequence[str], stdout_path: Path | None = None,
                **kwargs: Any) -> tuple[float, int, subprocess.CompletedProcess[str]]:
    """Run a command from a fresh Python parent: (wall seconds, peak RSS in bytes, the completed process).

    The peak is ``ru_maxrss`` of the parent's waited-for children, which (in a fresh parent) is this
    command's largest process; Linux reports it in KiB. ``stdout_path``: the command's standard output
    goes to this file (as ``cmd > file`` would; the completed process's ``stdout`` is then empty),
    else it is captured through a pipe (its last 20,000 characters are returned)."""
    code = ("import json, resource, subprocess, sys, time; cmd = json.loads(sys.argv[1]); path = sys.argv[2]; "
            "fh = open(path, 'w') if path else None; t0 = time.perf_counter(); "
            "p = subprocess.run(cmd, stdout=fh or subprocess.PIPE, stderr=subprocess.PIPE, text=True); "
            "s = time.perf_counter() - t0; fh and fh.close(); "
            "print(json.dumps({'s': s, 'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "
            "'rc': p.returncode, 'out': (p.stdout or '')[-20000:], 'err': p.stderr[-20000:]}))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(cmd)), str(stdout_path or "")],
                          capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    d = json.loads(done.stdout)
    return d["s"], d["rss"], subprocess.CompletedProcess(list(cmd), d["rc"], d["out"], d["err"])


def machine() -> dict[str, Any]:
    """Where and with what the figures were measured."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for pkg in ("swapcheck", "torch", "numpy", "pyarrow", "duckdb", "ray", "transformers", "scipy", "scikit-learn"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    mem = None
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"hostname": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions,
            "load_average": load_average(), **cpu_paths()}


def cpu_paths() -> dict[str, Any]:
    """The CPU's ISA level and the code paths it selects (issue #35): torch's CPU capability, oneDNN's
    int8 implementation and whether it is exact, the INT8 accumulator's path and what torch._int_mm
    does here. Figures from two machines compare only where these agree."""
    try:
        import torch

        from tasks.devices import cpu_flags, isa_level
        from tasks.kernels.accumulator import accumulator_path
        from tasks.kernels.onednn import onednn_path

        acc = accumulator_path()
        return {"isa_level": isa_level(torch_capability=torch.backends.cpu.get_cpu_capability()),
                "isa_flags": cpu_flags(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
                "onednn_int8": onednn_path().describe(), "int8_accumulator": acc.describe(timings=True),
                "int_mm_note": acc.native_note()}
    except Exception as exc:  # noqa: BLE001 - the machine record must not cost the run
        return {"isa_level": None, "cpu_paths_error": f"{type(exc).__name__}: {exc}"}


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark script (and run_all.py) accepts."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None, help="write the cases as JSON records here")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes (make bench-quick)")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest sizes, one repetition: checks the harness in seconds, measures nothing")
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="threads for torch, numba, OpenMP/BLAS pools and pyarrow, candidate and baseline alike "
                         "(default 1)")
    return ap


def tier(args: argparse.Namespace) -> str:
    """Which size tier the options ask for: smoke, quick or default (--smoke wins over --quick)."""
    return "smoke" if getattr(args, "smoke", False) else "quick" if getattr(args, "quick", False) else "default"


def pick(args: argparse.Namespace, default: Any, quick: Any, smoke: Any = None) -> Any:
    """The value of a size for the tier the options ask for (``smoke`` falls back to ``quick``)."""
    t = tier(args)
    if t == "smoke":
        return quick if smoke is None else smoke
    return quick if t == "quick" else default


def apply_threads(n: int, *, numba: bool = False) -> dict[str, Any]:
    """Fix this process's thread count at ``n`` for whatever times with threads, before any timing, so
    that candidate and baseline run with the same count: the environment (``THREAD_ENV``, inherited by
    the processes a script starts, read by OpenMP, MKL, OpenBLAS, numba and Arrow when they load),
    ``torch.set_num_threads``, ``numba.set_num_threads`` and ``pyarrow.set_cpu_count`` where those are
    imported already (call this after the script's imports; ``numba=True`` imports numba here, after
    the environment is set), and threadpoolctl's limit on the BLAS and OpenMP libraries loaded so far.
    Returns what was set (printed and recorded by the scripts)."""
    global THREADS
    if n < 1:
        raise ValueError(f"--threads must be at least 1, got {n}")
    THREADS = n
    for var in THREAD_ENV:
        # numba re-reads its environment at every compile and refuses a NUMBA_NUM_THREADS other than
        # the one its pool started with: once imported, its count is set by set_num_threads only.
        if var == "NUMBA_NUM_THREADS" and "numba" in sys.modules:
            continue
        os.environ[var] = str(n)
    done: dict[str, Any] = {"threads": n}
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
        done["torch"] = torch.get_num_threads()
    if numba:
        try:
            import numba as _numba  # noqa: F401
        except ImportError:
            pass
    nb = sys.modules.get("numba")
    if nb is not None:
        # numba's pool has NUMBA_NUM_THREADS threads (read at import); it cannot grow past them.
        nb.set_num_threads(min(n, int(nb.config.NUMBA_NUM_THREADS)))
        done["numba"] = nb.get_num_threads()
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.set_cpu_count(n)
        done["pyarrow"] = pa.cpu_count()
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        done["threadpoolctl"] = None
    else:
        threadpool_limits(limits=n)  # kept for the life of the process
        done["threadpoolctl"] = sorted({f"{i['internal_api']}={i['num_threads']}" for i in threadpool_info()})
    return done


def _fmt_goal(c: Case) -> str:
    if c.goal is None:
        return "-"
    return f"{c.direction} {c.goal:g}{c.unit}"


def emit(cases: list[Case], json_path: Path | None, *, title: str = "") -> None:
    """Print the cases as a table (ratio best and median, goal, met: judged on the median) and write
    them as JSON if asked."""
    if title:
        print(title)
    print(f"load average {', '.join(map(str, load_average()))}; threads {THREADS if THREADS is not None else 'not set'}; "
          f"goals {JUDGED_ON}")
    width = max([len(c.case) for c in cases] + [20])
    print(f"{'case':{width}}  {'best':>8} {'median':>8}  {'goal':>9}  {'met':4}  baseline")
    for c in cases:
        met = {True: "yes", False: "NO", None: "-"}[c.met]
        unit = "x" if c.unit == "x" else c.unit
        print(f"{c.case:{width}}  {c.ratio_min:7.2f}{unit} {c.ratio_median:7.2f}{unit}  {_fmt_goal(c):>9}  {met:4}  "
              f"{c.baseline}" + (f"  ({c.notes})" if c.notes else ""))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([c.record() for c in cases], indent=1, default=str))
