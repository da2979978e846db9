"""What every benchmark script shares: interleaved timing, ratios against a named baseline measured in
the same run, the goal beside each ratio, and one JSON record per measured case.

A benchmark script ``benchmarks/bench_<stage>.py`` measures one stage. For each case it times the
candidate and its baseline alternately (``interleaved``), so a neighbour's burst of load lands on both;
the ratio of the i-th candidate time to the i-th baseline time is one observation, and the script
reports the minimum and the median of those ratios. ``Case.ratio`` picks which of the two the goal is
judged on (the minimum by default: on a shared machine the least disturbed pair is the truest).

Each script accepts ``--json PATH`` and writes its cases there; ``benchmarks/run_all.py`` (``make bench``)
runs every script in a subprocess and collects them into ``benchmarks/results.json`` with the machine,
the versions and the load average around each script.
"""

from __future__ import annotations

import argparse
import json
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

__all__ = ["Case", "interleaved", "emit", "parser", "machine", "peak_rss_of", "load_average"]

REPO = Path(__file__).resolve().parents[1]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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
    judge: str = "min"  # which ratio the goal is judged on: "min" or "median"
    unit: str = "x"
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

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
                 repetitions=len(self.pair_ratios()))
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


def peak_rss_of(cmd: Sequence[str], **kwargs: Any) -> tuple[float, int, subprocess.CompletedProcess[str]]:
    """Run a command from a fresh Python parent: (wall seconds, peak RSS in bytes, the completed process).

    The peak is ``ru_maxrss`` of the parent's waited-for children, which (in a fresh parent) is this
    command's largest process; Linux reports it in KiB."""
    code = ("import json, resource, subprocess, sys, time; cmd = json.loads(sys.argv[1]); t0 = time.perf_counter(); "
            "p = subprocess.run(cmd, capture_output=True, text=True); s = time.perf_counter() - t0; "
            "print(json.dumps({'s': s, 'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "
            "'rc': p.returncode, 'out': p.stdout[-20000:], 'err': p.stderr[-20000:]}))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(cmd))], capture_output=True, text=True, **kwargs)
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
            "load_average": load_average()}


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", type=Path, default=None, help="write the cases as JSON records here")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes (a smoke run)")
    return ap


def _fmt_goal(c: Case) -> str:
    if c.goal is None:
        return "-"
    return f"{c.direction} {c.goal:g}{c.unit}"


def emit(cases: list[Case], json_path: Path | None, *, title: str = "") -> None:
    """Print the cases as a table (ratio min and median, goal, met) and write them as JSON if asked."""
    if title:
        print(title)
    print(f"load average {', '.join(map(str, load_average()))}")
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
