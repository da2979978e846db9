"""Joining an existing Ray cluster: ``--address`` > ``RAY_ADDRESS`` > the embedded instance.

The slow tests start a real head with ``ray start`` (loopback, token auth, its own temp dir) and run
``swapcheck sweep launch`` against it through Ray Client (``ray://``), through ``RAY_ADDRESS`` (what
``ray job submit`` sets), through ``auto`` and through ``ray job submit`` itself where the job server
can run. The fast ones pin address resolution, the status line, and and which lock each install uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cluster import Connection, _hostport, _reachable, resolve_address
from tests.conftest import REPO, tiny_spec_text

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")
SWAPCHECK = str(BIN / "swapcheck")
JOINED = re.compile(r"joined Ray cluster at 127\.0\.0\.1:(\d+).*: 1 alive node, 2 CPUs, 0 GPUs")


# --- fast: address resolution, the status line -------------------------------------------------


def test_address_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) == (None, "embedded")
    monkeypatch.setenv("RAY_ADDRESS", "")
    assert resolve_address(None) == (None, "embedded")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_address(None) == ("10.0.0.1:6379", "RAY_ADDRESS")
    assert resolve_address("ray://head:10001") == ("ray://head:10001", "--address")
    assert resolve_address("auto") == ("auto", "--address")


@pytest.mark.parametrize("address,expected", [
    ("auto", None),
    ("localhost", None),
    ("127.0.0.1:6379", ("127.0.0.1", 6379)),
    ("ray://head:10001", ("head", 10001)),
    ("ray://head:10001/", ("head", 10001)),
    ("[::1]:6379", ("::1", 6379)),
    ("ray://[::1]:10001", ("::1", 10001)),
    ("::1", None),
])
def test_hostport_forms(address: str, expected: tuple[str, int] | None) -> None:
    assert _hostport(address) == expected


def test_reachable_leaves_auto_to_ray() -> None:
    _reachable("auto", 0.01)  # no TCP pre-check: nothing raised, nothing resolved


def test_connection_line() -> None:
    joined = Connection(False, "10.0.0.1:6379", 96.0, 8.0, 3, "--address", "ray://head:10001")
    assert joined.describe() == ("joined Ray cluster at 10.0.0.1:6379 (--address=ray://head:10001): "
                                 "3 alive nodes, 96 CPUs, 8 GPUs")
    env = Connection(False, "10.0.0.1:6379", 1.0, 0.0, 1, "RAY_ADDRESS", "10.0.0.1:6379")
    assert env.describe() == "joined Ray cluster at 10.0.0.1:6379 (from RAY_ADDRESS): 1 alive node, 1 CPU, 0 GPUs"
    assert Connection(True, "127.0.0.1:1", 2).info()["embedded"] is True


def test_cli_prints_the_joined_cluster_only(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.progress import UnitProgress

    progress = UnitProgress("sweep x", enabled=False)
    progress("cluster", Connection(True, "127.0.0.1:1", 2, nodes=1).info())
    progress("cluster", Connection(False, "10.0.0.1:6379", 4, 0, 2, "--address", "auto").info())
    err = capsys.readouterr().err
    assert "embedded" not in err
    assert "joined Ray cluster at 10.0.0.1:6379 (--address=auto): 2 alive nodes, 4 CPUs, 0 GPUs" in err


# --- fast: requirements/cpu.lock is the CPU install's, requirements/gpu.lock the GPU nodes' -------

LOCKS = REPO / "requirements"


def _pins(path: Path) -> dict[str, str]:
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines() if not ln.startswith((" ", "\t"))]
    return {re.split(r"[=<>!~ ]", ln, maxsplit=1)[0].lower(): ln.rstrip(" \\") for ln in lines if ln}


def test_cpu_lock_pins_the_cpu_torch_and_only_the_cpu_install_uses_it() -> None:
    assert _pins(LOCKS / "cpu.lock")["torch"] == "torch==2.13.0+cpu"
    assert "torch==2.13.0" in _pins(LOCKS / "cpu-constraints.txt")["torch"].replace(" ", "")
    # The only install from the CPU lock is the Makefile's; GPU paths (infra, workflows) must not use it.
    users = []
    for path in [REPO / "Makefile", *sorted((REPO / "infra").rglob("*")), *sorted((REPO / ".github").rglob("*"))]:
        if path.is_file() and path.suffix not in {".md", ".png"}:
            lines = path.read_text(errors="replace").splitlines()
            text = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#"))  # comments may warn
            if re.search(r"cpu\.lock|cpu-constraints\.txt", text):
                users.append(path.relative_to(REPO).as_posix())
    assert users == ["Makefile"], users
    assert re.search(r"^LOCK\s*:=\s*requirements/cpu\.lock$", (REPO / "Makefile").read_text(), re.M)


def test_gpu_lock_holds_a_cuda_torch_and_vllm() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    gpu = _pins(LOCKS / "gpu-constraints.txt")
    torch_spec = SpecifierSet(gpu["torch"].split("torch", 1)[1])
    assert not torch_spec.contains("2.13.0+cpu")
    assert torch_spec.contains("2.13.0") and torch_spec.contains("2.13.0+cu128")
    lock = _pins(LOCKS / "gpu.lock")
    assert lock["torch"] == "torch==2.13.0"  # PyPI's Linux x86_64 build: CUDA
    assert any(name.startswith("nvidia-") for name in lock), "a CUDA torch brings its nvidia-* wheels"
    vllm = Version(lock["vllm"].split("==", 1)[1])
    assert SpecifierSet(">=0.29,<0.33").contains(vllm)
    # Where GPU nodes are set up, the docs name the GPU lock.
    for doc in ("docs/cluster.md", "infra/README.md", "infra/docker/Dockerfile"):
        assert "requirements/gpu.lock" in (REPO / doc).read_text(), doc


def _local_cpu_torch_wheel() -> Path | None:
    for d in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split():
        hits = sorted(Path(d).glob("torch-2.13.0+cpu-*.whl")) if Path(d).is_dir() else []
        if hits:
            return hits[0]
    return None


def _dry_run(constraints: str, links: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--no-index", "--no-deps",
           "--find-links", str(links), "-c", constraints, "torch"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_pip_resolution_offline_cpu_vs_gpu_constraints() -> None:
    """The locks' inputs, offline: with only the CPU wheel reachable, the CPU constraints take it and
    the GPU constraints refuse it (the GPU lock cannot hold a CPU torch under vLLM)."""
    wheel = _local_cpu_torch_wheel()
    if wheel is None:
        pytest.skip("no local torch-2.13.0+cpu wheel to resolve against offline (PIP_FIND_LINKS, /opt/wheels)")
    cpu = _dry_run("requirements/cpu-constraints.txt", wheel.parent)
    assert cpu.returncode == 0 and "torch-2.13.0+cpu" in cpu.stdout, cpu.stdout + cpu.stderr
    gpu = _dry_run("requirements/gpu-constraints.txt", wheel.parent)
    assert gpu.returncode != 0 and "Would install" not in gpu.stdout, gpu.stdout


# --- slow: a real head started with `ray start` --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _agent_ports() -> list[str]:
    """Free ports for the head's agents. Their defaults are fixed numbers (the dashboard agent's HTTP
    port is 52365): a second Ray instance on the machine (an embedded one, another test's head) holds
    them, and the agent then runs without its HTTP service, so `ray job submit` is refused for ever
    ("No available agent to submit job")."""
    return [f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
            f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}"]


@dataclass
class Head:
    base: Path  # RAY_TMPDIR for drivers: Ray's temp dir is base/ray (where `auto` looks)
    gcs: int
    client: int
    env: dict[str, str]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO))
    return env


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    # A short temp dir of its own (Unix socket paths are limited to ~107 bytes): `ray stop` never
    # touches another cluster, and nothing of this one outlives the module.
    base = Path(tempfile.mkdtemp(prefix="sc-join-", dir="/tmp"))
    token = secrets.token_hex(32)
    # The Ray Client proxy waits 30 s by default for each per-client server to take connections; on a
    # loaded 2-core machine starting that process can take longer.
    env = {**_base_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_TMPDIR": str(base),
           "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "120"}
    gcs, client, dash = _free_port(), _free_port(), _free_port()
    cmd = [RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
           f"--ray-client-server-port={client}", "--num-cpus=2", "--include-dashboard=false",
           f"--dashboard-port={dash}",  # the minimal dashboard process still binds one: not 8265
           f"--temp-dir={base / 'ray'}", "--disable-usage-stats", *_agent_ports()]
    started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield Head(base, gcs, client, env)
    finally:
        _stop(base, gcs)


def _stop(base: Path, gcs: int) -> None:
    """Stop exactly this head. ``ray stop`` would kill every Ray process on the machine (other
    people's clusters and embedded instances included), so the processes are found by what is on
    their command line: this head's temp dir, or its GCS address (the Ray Client server)."""
    marks = (str(base), f"--address=127.0.0.1:{gcs}")
    pids = [p for p in _pids() if any(m in _cmdline(p) for m in marks)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        t0 = time.monotonic()
        while pids and time.monotonic() - t0 < 10:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.2)
    shutil.rmtree(base, ignore_errors=True)


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and int(d.name) != os.getpid()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _launch(head: Head, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec_text())
    cmd = [SWAPCHECK, "sweep", "launch", str(spec), "--results", str(tmp_path / "results"), "--no-progress", *args]
    return subprocess.run(cmd, cwd=REPO, env=env or head.env, capture_output=True, text=True, timeout=300)


def _launch_row(results: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    (path,) = (results / "table=launches" / "sweep=tiny").glob("*.parquet")
    (row,) = pq.read_table(path).to_pylist()
    return row


def _server_logs(head: Head) -> str:
    """The tails of the head's Ray Client server logs (the proxy and each per-client server), so a
    failed join says why the server did not start rather than only that it did not."""
    logs = sorted((head.base / "ray").glob("session_latest/logs/ray_client_server*"))
    return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)


def _check_joined(out: subprocess.CompletedProcess[str], head: Head, tmp_path: Path) -> str:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:] + _server_logs(head)
    match = JOINED.search(out.stderr)
    assert match and int(match.group(1)) == head.gcs, out.stderr[-2000:]
    # The line comes before anything runs.
    assert out.stderr.index(match.group(0)) < out.stderr.index("to run")
    assert "12 ok, 0 failed" in out.stderr
    row = _launch_row(tmp_path / "results")
    assert row["embedded"] is False and row["address"] == f"127.0.0.1:{head.gcs}"
    return match.group(0)


#: How a Ray Client join fails when the machine is too loaded, not because of swapcheck: the proxy
#: starts a Ray Client server process per client, which under load takes longer than the driver waits.
#: "Starting Ray client server failed" is the proxy giving up on that process (seen with an empty error
#: log while the other test worker kept both cores busy).
CLIENT_JOIN_TRANSIENT = re.compile(r"could not reach|ray client connection timeout|Timed out|DEADLINE_EXCEEDED|"
                                   r"Starting Ray client server failed", re.I)


@pytest.mark.slow
def test_launch_joins_through_ray_client(head: Head, tmp_path: Path) -> None:
    # The test is about joining, not about how fast a loaded machine starts the Ray Client server:
    # a generous --connect-timeout, and one bounded retry (with a warning saying why) when the join
    # still timed out. Any other failure, or a second timeout, fails the test.
    args = ("--address", f"ray://127.0.0.1:{head.client}", "--connect-timeout", "120")
    out = _launch(head, tmp_path, *args)
    if out.returncode != 0 and CLIENT_JOIN_TRANSIENT.search(out.stderr):
        warnings.warn(f"Ray Client join timed out under load (load average {os.getloadavg()[0]:.1f}); "
                      f"retrying once: {out.stderr.strip().splitlines()[-1][:300]}", stacklevel=1)
        shutil.rmtree(tmp_path / "results", ignore_errors=True)
        out = _launch(head, tmp_path, *args)
    line = _check_joined(out, head, tmp_path)
    assert f"(--address=ray://127.0.0.1:{head.client})" in line


@pytest.mark.slow
def test_no_address_starts_an_embedded_instance_even_beside_a_running_head(head: Head, tmp_path: Path) -> None:
    """Without --address and RAY_ADDRESS the launch runs on an embedded instance of its own, even where
    `ray start` left a cluster on the machine (its address in RAY_TMPDIR/ray/ray_current_cluster): a
    plain ray.init() joins that cluster, someone else's, and then refuses num_cpus."""
    env = {k: v for k, v in head.env.items() if k != "RAY_ADDRESS"}  # RAY_TMPDIR stays: the head is findable
    out = _launch(head, tmp_path, "--num-cpus", "2", env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "12 ok, 0 failed" in out.stderr, out.stderr[-2000:]
    row = _launch_row(tmp_path / "results")
    assert row["embedded"] is True and str(head.gcs) not in str(row["address"]), row["address"]


@pytest.mark.slow
def test_launch_honours_ray_address(head: Head, tmp_path: Path) -> None:
    """What `ray job submit` gives its entrypoint: RAY_ADDRESS, no --address. No num_cpus is passed."""
    out = _launch(head, tmp_path, env={**head.env, "RAY_ADDRESS": f"127.0.0.1:{head.gcs}"})
    assert "(from RAY_ADDRESS)" in _check_joined(out, head, tmp_path)


@pytest.mark.slow
def test_explicit_address_beats_ray_address_and_auto_finds_the_node(head: Head, tmp_path: Path) -> None:
    bogus = {**head.env, "RAY_ADDRESS": f"127.0.0.1:{_free_port()}"}  # nothing listens there
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _check_joined(_launch(head, tmp_path / "a", "--address", f"127.0.0.1:{head.gcs}", env=bogus), head, tmp_path / "a")
    # `auto` on a cluster node: Ray reads the head's address from its temp dir (RAY_TMPDIR here).
    out = _launch(head, tmp_path / "b", "--address", "auto")
    assert "(--address=auto)" in _check_joined(out, head, tmp_path / "b")


def _job_server_missing() -> list[str]:
    """What `ray job submit` needs beyond ray[client]: the dashboard's job server (ray[default])."""
    return [m for m in ("aiohttp", "aiohttp_cors", "opencensus", "prometheus_client", "smart_open", "colorful")
            if importlib.util.find_spec(m) is None]


@pytest.mark.slow
@pytest.mark.skipif(bool(_job_server_missing()),
                    reason="`ray job submit` needs a head with the dashboard's job server, which needs the "
                           "`ray[default]` extra (pip install 'swapcheck[cluster]'); missing here: "
                           + ", ".join(_job_server_missing()))
def test_ray_job_submit_runs_a_sweep(tmp_path: Path) -> None:  # pragma: no cover - needs ray[default]
    base = Path(tempfile.mkdtemp(prefix="sc-job-", dir="/tmp"))
    env = {**_base_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_TMPDIR": str(base)}
    gcs, dash = _free_port(), _free_port()
    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={base / 'ray'}",
                        "--disable-usage-stats", *_agent_ports()], env=env, check=True, capture_output=True, timeout=180)
        (tmp_path / "tiny.toml").write_text(tiny_spec_text())
        submit = [RAY, "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--working-dir", str(tmp_path),
                  "--", SWAPCHECK, "sweep", "launch", "tiny.toml", "--results", str(tmp_path / "results"),
                  "--no-progress"]
        # `ray start` returns before the head's dashboard agent has registered with the job server; a
        # submission in between is refused ("No available agent to submit job") before any job exists,
        # so it is safe to submit again until the agent is there.
        deadline = time.monotonic() + 180
        while True:
            out = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=600)
            not_ready = out.returncode != 0 and "No available agent" in out.stdout + out.stderr
            if not not_ready or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        assert "(from RAY_ADDRESS)" in out.stdout and "12 ok, 0 failed" in out.stdout
    finally:
        _stop(base, gcs)
