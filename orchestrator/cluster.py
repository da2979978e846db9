"""Starting or joining Ray.

The embedded default is a local Ray instance that listens on loopback only
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray bind to 127.0.0.1), with token authentication on
(``RAY_AUTH_MODE=token``: ``ray.init`` generates the token) and no dashboard.

Which Ray: ``--address`` (``address``) first, then the ``RAY_ADDRESS`` environment variable (what
``ray job submit`` sets for its entrypoint), then the embedded instance. A joined cluster is never
given ``num_cpus``: its nodes say what they have. ``auto``, ``host:port`` (the GCS, on a cluster
node) and ``ray://host:port`` (Ray Client, from outside) all work. A cluster with token auth needs
``RAY_AUTH_MODE=token`` and its token (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``) in the
driver's environment (docs/cluster.md).

Joining is bounded by ``--connect-timeout``: before ``ray.init`` the address is checked with Ray's own
protocol (:func:`_probe`: a TCP connection, then one gRPC call that only a Ray GCS -- or, for
``ray://``, a Ray Client server -- answers), so an open port that is not Ray (an HTTP server, the
dashboard) or a socket that accepts and says nothing exits 2 naming the address and what answered,
instead of ``ray.init`` waiting on a handshake that never comes. ``ray.init`` itself then runs under
a timer of the same bound (plus a grace) in the main thread.

The embedded instance keeps its session (logs, sockets, spilled objects) in a directory of its own,
``<RAY_TMPDIR or the temp dir>/sc-ray-<8 random characters>`` (mode 0700, never Ray's shared ``/tmp/ray``), removed
when the process ends after a clean run and kept -- with a line saying where -- after a failure
(:func:`keep_session`).

Starting the embedded instance is tried up to ``SWAPCHECK_RAY_START_ATTEMPTS`` times (default 3), each
try bounded by ``SWAPCHECK_RAY_START_TIMEOUT_S`` (default 120 s), with a pause of 2 s, 4 s, ... between
tries. A failed try is shut down and every process it left is ended (found by its session directory,
which is in each Ray process's command line: nobody else's Ray is touched) before the next one; failing
every time is :class:`RayStartFailure`, exit 3, naming the cause and both knobs. While Ray starts (or
a join waits), a line every 10 s goes to the callback :func:`report_waits` installed (the CLI's
progress); the library prints nothing by itself.

``python -m orchestrator.cluster add-node ADDRESS`` starts a second raylet on 127.0.0.1 joined to a
loopback head (``ray start --head --node-ip-address=127.0.0.1``), which ``ray start --address``
cannot do here: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it refuses a worker node, and without it
Ray rewrites 127.0.0.1 to the machine's external address (docs/cluster.md, "Two nodes on one machine").
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InfrastructureError, RayStartFailure, UsageError

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
EMBEDDED_ENV = {**LOOPBACK_ENV, "RAY_AUTH_MODE": "token"}
ADDRESS_ENV = "RAY_ADDRESS"
#: The address and source of an in-process launch (no Ray: :func:`in_process_connection`).
IN_PROCESS = "in-process"
#: Unix socket paths are limited to 107 bytes; Ray's longest under its temp dir is about
#: ``/session_<date>_<time>_<us>_<pid>/sockets/plasma_store`` (at most 64 bytes).
_SOCKET_TAIL = 64
#: Seconds ``ray.init`` may run past ``--connect-timeout`` after the address answered as Ray.
JOIN_GRACE_S = 15.0
#: How many times the embedded instance is started before a launch gives up (a busy machine can time
#: out Ray's own start: 4 of 5 launches in 10 minutes at load 20+), and the first pause between tries
#: (doubled each time).
START_ATTEMPTS_ENV = "SWAPCHECK_RAY_START_ATTEMPTS"
START_ATTEMPTS = 3
START_BACKOFF_S = 2.0
#: How long one attempt may take before it is stopped and counted as failed. Ray's own wait for the
#: GCS's port (``RAY_gcs_server_port_wait_time_s``, 30 s) is raised to it unless set; Ray's wait for
#: the raylet to register (30 s) is fixed inside Ray 2.60, so a busy machine is helped by the retries.
START_TIMEOUT_ENV = "SWAPCHECK_RAY_START_TIMEOUT_S"
START_TIMEOUT_S = 120.0
#: While Ray starts or a join waits, a line every this many seconds (through :func:`report_waits`).
WAIT_LINE_S = 10.0


@dataclass(frozen=True)
class Connection:
    embedded: bool
    address: str
    num_cpus: float
    num_gpus: float = 0.0
    nodes: int = 0
    source: str = "embedded"  # "embedded", "--address" or "RAY_ADDRESS"
    requested: str | None = None  # the address as given (``ray://head:10001``, ``auto``); None if embedded

    def describe(self) -> str:
        """One line: which Ray this is and what it has (the CLI prints it before submitting)."""
        what = f"{_n(self.nodes, 'alive node')}, {_n(self.num_cpus, 'CPU')}, {_n(self.num_gpus, 'GPU')}"
        if self.source == IN_PROCESS:
            return f"in this process, no Ray: {_n(self.num_cpus, 'CPU')}, {_n(self.num_gpus, 'GPU')}"
        if self.embedded:
            return f"embedded Ray instance at {self.address}: {what}"
        if self.requested and self.requested != self.address:
            given = f" ({self.source}={self.requested})"
        else:
            given = f" (from {self.source})"
        return f"joined Ray cluster at {self.address}{given}: {what}"

    def info(self) -> dict[str, object]:
        return {"embedded": self.embedded, "address": self.address, "requested": self.requested,
                "source": self.source, "nodes": self.nodes, "num_cpus": self.num_cpus,
                "num_gpus": self.num_gpus, "line": self.describe()}


def _n(x: float, word: str) -> str:
    v = int(x) if float(x).is_integer() else x
    return f"{v:g} {word}" if v == 1 else f"{v:g} {word}s"


def in_process_connection() -> Connection:
    """What an in-process launch (``runner.launch(in_process=True)``) runs on: this process, no Ray."""
    gpus = 0
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Connection(False, IN_PROCESS, float(os.cpu_count() or 1), float(gpus), 1, source=IN_PROCESS)


def resolve_address(address: str | None) -> tuple[str | None, str]:
    """``(address, source)``: ``--address`` > ``RAY_ADDRESS`` > ``(None, "embedded")``."""
    if address:
        return address, "--address"
    env = os.environ.get(ADDRESS_ENV, "").strip()
    if env:
        return env, ADDRESS_ENV
    return None, "embedded"


def _verbose() -> bool:
    """``swapcheck -v``: workers' output reaches the terminal (otherwise it stays in Ray's logs)."""
    return os.environ.get("SWAPCHECK_VERBOSITY") == "verbose"


def set_safe_env(embedded: bool) -> None:
    """Loopback binding is the safe default for users too; an explicit environment wins."""
    for key, value in (EMBEDDED_ENV if embedded else LOOPBACK_ENV).items():
        os.environ.setdefault(key, value)


def _hostport(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``, ``[v6]:port`` or ``scheme://host:port``; None for ``auto``
    and other forms Ray resolves itself."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or (":" in host and not host.startswith("[")):
        return None
    return host.strip("[]"), int(port)


class _JoinTimeout(BaseException):
    """Raised in the main thread by the timer that bounds ``ray.init`` (:func:`_bounded`). A
    ``BaseException``, like ``KeyboardInterrupt``: Ray's start catches and logs ``Exception`` in places
    (starting the dashboard), which swallowed the timer and let a bounded start run on."""


def _unreachable(address: str, timeout_s: float, what: str) -> InfrastructureError:
    return InfrastructureError(
        f"cannot reach the Ray cluster at {address!r} within {timeout_s:g} s: {what}. Check the address "
        "(ray://head:10001 for Ray Client, head:6379 on a cluster node) or raise --connect-timeout.")


def _not_ray(address: str, timeout_s: float, what: str) -> InfrastructureError:
    return InfrastructureError(
        f"{address!r} is not a Ray cluster: {what} (checked within --connect-timeout {timeout_s:g} s). Give the "
        "GCS address of the head (head:6379, from a cluster node) or its Ray Client address (ray://head:10001); "
        "the dashboard's port (8265) is neither.")


def _sniff(host: str, port: int, timeout_s: float) -> str:
    """What a server that does not speak gRPC answers to an HTTP request (for the message)."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=max(0.2, timeout_s)) as sock:
            sock.settimeout(max(0.2, timeout_s))
            sock.sendall(b"HEAD / HTTP/1.0\r\nHost: " + host.encode("ascii", "replace") + b"\r\n\r\n")
            data = sock.recv(1024)
    except OSError:
        data = b""
    if data.startswith(b"HTTP/"):
        lines = data.decode("latin-1").split("\r\n")
        server = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("server:")), "")
        return f"an HTTP server answered ({lines[0][:60]}{', Server: ' + server[:60] if server else ''})"
    if data:
        return f"a server answered that does not speak Ray's protocol (its first bytes: {data[:24]!r})"
    return "a server accepted the connection but does not speak Ray's protocol (gRPC)"


def _probe(address: str, timeout_s: float) -> None:
    """Within ``timeout_s``: a TCP connection to the address, then one gRPC call only Ray answers
    (the GCS's ``GetClusterId`` for ``host:port``; Ray Client's ``ClusterInfo`` for ``ray://``).

    Any gRPC status from the service (OK, or UNAUTHENTICATED from a cluster with token auth) proves
    it is Ray. No answer in time, a server that is not HTTP/2, or a gRPC server without the service
    raises :class:`InfrastructureError` (exit 2) naming the address and what answered. Forms Ray
    resolves itself (``auto``) are resolved first and checked the same way when they can be.
    """
    import socket

    target = _hostport(address)
    if target is None:
        return  # a form Ray resolves itself: ray.init's own checks (under the timer) apply
    deadline = time.monotonic() + timeout_s
    host, port = target
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        raise _unreachable(address, timeout_s, str(exc)) from None
    import grpc

    client = address.startswith("ray://")
    channel = grpc.insecure_channel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                    options=[("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)])
    try:
        left = max(0.1, deadline - time.monotonic())
        # Generated protobuf modules (no type stubs): their messages are looked up as attributes.
        if client:
            from ray.core.generated import ray_client_pb2 as msg
            from ray.core.generated import ray_client_pb2_grpc

            request: Any = msg.ClusterInfoRequest(type=msg.ClusterInfoType.PING)  # type: ignore[attr-defined]
            ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(request, timeout=left)
        else:
            from ray.core.generated import gcs_service_pb2 as gcs
            from ray.core.generated import gcs_service_pb2_grpc

            request = gcs.GetClusterIdRequest()  # type: ignore[attr-defined]
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(request, timeout=left)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise _not_ray(address, timeout_s, "it accepted the connection but gave no answer in Ray's protocol "
                           f"within {timeout_s:g} s") from None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            service = "Ray Client" if client else "Ray's GCS"
            raise _not_ray(address, timeout_s, f"a gRPC server answered, but it has no {service} service") from None
        if code == grpc.StatusCode.UNAVAILABLE:
            details = exc.details() if hasattr(exc, "details") else ""
            if "refused" in (details or "").lower():
                raise _unreachable(address, timeout_s, details or "connection refused") from None
            raise _not_ray(address, timeout_s, _sniff(host, port, max(0.2, deadline - time.monotonic()))) from None
        # Any other status came from the service itself (UNAUTHENTICATED: token auth): it is Ray.
    finally:
        channel.close()


@contextmanager
def _address_env(address: str) -> Iterator[None]:
    """Ray's GCS path prefers ``RAY_ADDRESS`` over an explicit address: make ``--address`` win.
    ``auto`` keeps Ray's meaning (``RAY_ADDRESS`` first, then the cluster started on this node)."""
    if address == "auto":
        yield
        return
    before = os.environ.get(ADDRESS_ENV)
    os.environ[ADDRESS_ENV] = address
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ADDRESS_ENV, None)
        else:
            os.environ[ADDRESS_ENV] = before


def _connection(embedded: bool, source: str, requested: str | None) -> Connection:
    import ray

    ctx = ray.get_runtime_context()
    total = ray.cluster_resources()
    try:
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    except Exception:  # noqa: BLE001 - a count for a status line must not fail a launch
        nodes = 0
    return Connection(embedded, str(ctx.gcs_address), float(total.get("CPU", 0)), float(total.get("GPU", 0)),
                      nodes, source, requested)


def connect(address: str | None = None, num_cpus: int | None = None, timeout_s: float = 30.0) -> Connection:
    """Join ``address`` (else ``RAY_ADDRESS``) within ``timeout_s``, or start the embedded instance.

    The returned ``Connection`` says which (``embedded``, ``source``) and what the cluster has;
    ``Connection.describe()`` is the line to show before submitting. Nothing is printed here.
    """
    address, source = resolve_address(address)
    embedded = address is None
    set_safe_env(embedded=embedded)
    import ray

    if ray.is_initialized():
        return _connection(embedded, source, address)
    if address is not None:
        _probe(_resolved(address), timeout_s)
    where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address!r} ({source})"
    if address is not None:
        os.environ.setdefault("RAY_gcs_rpc_server_connect_timeout_s", str(max(1, int(timeout_s))))
    if address is None:
        _start_embedded(ray, num_cpus)
        return _connection(embedded, source, address)
    try:
        with _address_env(address), _waiting(f"joining the Ray cluster at {address} (up to "
                                              f"{timeout_s + JOIN_GRACE_S:g} s: --connect-timeout)"), \
                _bounded(timeout_s + JOIN_GRACE_S):
            ray.init(address=address, log_to_driver=_verbose(), logging_level=logging.WARNING)
    except _JoinTimeout:
        raise InfrastructureError(
            f"could not {where}: it answered as Ray, but joining did not finish within {timeout_s + JOIN_GRACE_S:g} s "
            "(--connect-timeout plus a grace). Check that the cluster is healthy (ray status on the head), or raise "
            "--connect-timeout.") from None
    except Exception as exc:  # noqa: BLE001 - Ray raises many types for a failed join
        hint = ""
        if "pip package" in str(exc) and "ray[client]" in str(exc):
            hint = " Install swapcheck with its dependencies (pip install swapcheck) or pip install 'ray[client]'."
        raise InfrastructureError(f"could not {where}: {type(exc).__name__}: {exc}{hint}") from None
    return _connection(embedded, source, address)


def start_attempts(env: dict[str, str] | None = None) -> int:
    """How many times to start the embedded instance (:data:`START_ATTEMPTS_ENV`, 1 to 10)."""
    raw = (os.environ if env is None else env).get(START_ATTEMPTS_ENV, "").strip()
    if not raw:
        return START_ATTEMPTS
    if not raw.isdigit() or not 1 <= int(raw) <= 10:
        raise UsageError(f"{START_ATTEMPTS_ENV}={raw!r}: give a whole number of attempts from 1 to 10")
    return int(raw)


def start_timeout(env: dict[str, str] | None = None) -> float:
    """Seconds one start of the embedded instance may take (:data:`START_TIMEOUT_ENV`, 1 to 3600)."""
    raw = (os.environ if env is None else env).get(START_TIMEOUT_ENV, "").strip()
    if not raw:
        return START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 3600:  # NaN too
        raise UsageError(f"{START_TIMEOUT_ENV}={raw!r}: give the seconds one start of Ray may take, from 1 to 3600")
    return value


def with_retries(start: Any, attempts: int, *, pause_s: float = START_BACKOFF_S, sleep: Any = time.sleep,
                 on_failure: Any = None, timeout_s: float | None = None) -> None:
    """``start()`` up to ``attempts`` times, pausing ``pause_s``, then twice that, ... between tries;
    ``on_failure(exc, attempt)`` after each failed one. The last failure is raised as
    :class:`RayStartFailure` (exit 3) with what was tried and what to do (``timeout_s``: the bound of
    each try, named in the message with its knob)."""
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises many types for a failed start
            last = exc
            if on_failure is not None:
                on_failure(exc, attempt)
            if attempt < attempts:
                pause = pause_s * 2 ** (attempt - 1)
                _wait_line(f"Ray did not start (attempt {attempt} of {attempts}: {_first_line(exc)}); "
                           f"trying again in {pause:g} s")
                sleep(pause)
    assert last is not None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    each = f" of up to {timeout_s:g} s each" if timeout_s is not None else ""
    longer = f"raise {START_TIMEOUT_ENV} (now {timeout_s:g} s) or " if timeout_s is not None else "raise "
    raise RayStartFailure(
        f"could not start a local Ray instance in {attempts} attempt(s){each} ({_first_line(last)}); load "
        f"average {load}. A busy machine can time out Ray's start: retry when it is quieter, {longer}"
        f"{START_ATTEMPTS_ENV} (now {attempts}), or start Ray once (`ray start --head`, docs/cluster.md) and "
        "pass its address, --address 127.0.0.1:PORT (`ray start` prints it; `--address auto` may find another "
        "user's Ray on this machine). Nothing was run; no Ray process of these attempts is left.") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _start_embedded(ray: Any, num_cpus: int | None) -> None:
    """Start the embedded instance, retried (:func:`with_retries`): each try in a new session directory
    and bounded by :func:`start_timeout`; a failed one shut down, its processes ended and its session
    kept for its logs."""
    attempts, timeout_s = start_attempts(), start_timeout()
    # Ray's own wait for the GCS to write its port (30 s by default) must not end a try before ours does.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(math.ceil(timeout_s)))
    tries = [0]

    def start() -> None:
        tries[0] += 1
        # "local": always a new instance of our own. Without it Ray joins a cluster that `ray start`
        # left on this machine (someone else's, with its own settings) and then refuses num_cpus
        # ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
        session = _new_session_dir()
        what = f"starting a local Ray instance (attempt {tries[0]} of {attempts}, up to {timeout_s:g} s: {START_TIMEOUT_ENV})"
        try:
            with _waiting(what), _bounded(timeout_s):
                ray.init(
                    address="local",
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=_verbose(),
                    logging_level=logging.WARNING,
                    configure_logging=True,
                    # Ray makes its temp dir world-writable (0777): it gets a folder inside ours (0700), so
                    # nobody else can reach what it keeps there.
                    _temp_dir=os.path.join(session, "ray"),
                )
        except _JoinTimeout:
            raise TimeoutError(f"Ray did not start within {timeout_s:g} s") from None
        finally:
            _own_session(session)

    def failed(exc: BaseException, attempt: int) -> None:
        keep_session(f"Ray could not start (attempt {attempt}): {type(exc).__name__}")
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - what a half-started instance left is cleaned as far as it goes
            pass
        if _session["dir"] is not None:
            end_processes(_session["dir"] + os.sep)

    with_retries(start, attempts, on_failure=failed, timeout_s=timeout_s)


# -- lines while waiting, and the processes a failed start left ------------------------------------

_reporter: dict[str, Callable[[str], None] | None] = {"fn": None}


def report_waits(fn: Callable[[str], None] | None) -> None:
    """Where the lines go while Ray starts or a join waits (the CLI: its progress notes); None: nowhere."""
    _reporter["fn"] = fn


def _wait_line(line: str) -> None:
    fn = _reporter["fn"]
    if fn is not None:
        try:
            fn(line)
        except Exception:  # noqa: BLE001 - a status line must never fail a start
            pass


@contextmanager
def _waiting(what: str, every_s: float = WAIT_LINE_S) -> Iterator[None]:
    """A line ``<what>: N s so far`` every ``every_s`` seconds until the block ends (no silent minutes)."""
    import threading

    if _reporter["fn"] is None:
        yield
        return
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            _wait_line(f"{what}: {time.monotonic() - t0:.0f} s so far")

    thread = threading.Thread(target=tick, name="swapcheck-ray-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)


def _pids_with(mark: str) -> list[int]:
    """The processes whose command line holds ``mark`` (a session directory of ours), this one aside."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark in cmdline and state != "Z":
            found.append(int(entry))
    return found


def end_processes(mark: str, grace_s: float = 5.0, limit_s: float = 30.0) -> list[int]:
    """End every process whose command line holds ``mark`` (SIGTERM, then SIGKILL ``grace_s`` later) and
    reap those that are our children. Returns the pids that were running.

    A Ray start that failed half-way leaves its GCS, raylet and helpers running with no driver that
    knows them (``ray.shutdown`` knows only a node that finished starting), and gcs_server and raylet
    can outlive a SIGTERM. Every Ray process names its session directory on its command line, and ours
    is unique (``sc-ray-`` plus random characters), so this ends exactly what the failed start made --
    looking again until none is left (up to ``limit_s``), since a raylet may start its agents meanwhile.
    """
    import signal

    seen: dict[int, float] = {}  # pid -> when it was sent SIGTERM
    deadline = time.monotonic() + limit_s
    while True:
        live = _pids_with(mark)
        if not live or time.monotonic() > deadline:
            break
        now = time.monotonic()
        for pid in live:
            sig = signal.SIGKILL if now - seen.setdefault(pid, now) >= grace_s else signal.SIGTERM
            if sig == signal.SIGTERM and seen[pid] != now:
                continue  # sent already: wait for it, up to grace_s
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        _reap(list(seen))
        time.sleep(0.1)
    _reap(list(seen))
    return sorted(seen)


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of ``pids`` that are our children and have ended (no zombies)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a raylet's worker), or already collected
            pass


def _resolved(address: str) -> str:
    """``auto`` as Ray resolves it (the cluster started on this node), when it can; else as given."""
    if address != "auto":
        return address
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address) or address
    except Exception:  # noqa: BLE001 - no cluster found: ray.init says so itself (under the timer)
        return address


@contextmanager
def _bounded(seconds: float) -> Iterator[None]:
    """Raise :class:`_JoinTimeout` in the main thread after ``seconds`` (a timer signal), so that a join
    that answered as Ray but then stalls still ends. Elsewhere than the main thread, or where SIGALRM
    already has a handler of someone else's, no timer is set."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGALRM) not in (
            signal.SIG_DFL, signal.SIG_IGN, None):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        # Only where Ray's own Python code runs: raised inside the standard library (logging's at-fork
        # lock handlers, an import, subprocess) it was swallowed ("Exception ignored in ...") or could
        # leave a lock held or a module half-imported. Elsewhere, look again in 0.1 s.
        if _safe_to_interrupt(frame):
            raise _JoinTimeout()
        signal.setitimer(signal.ITIMER_REAL, 0.1)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _safe_to_interrupt(frame: Any) -> bool:
    """Whether the timer may raise in ``frame``: a function of Ray's package, not a module being imported."""
    if frame is None:
        return False
    code = frame.f_code
    return bool(code.co_name != "<module>" and code.co_filename.startswith(_ray_dir()))


def _ray_dir() -> str:
    ray = sys.modules.get("ray")
    path = getattr(ray, "__file__", None)
    return os.path.dirname(path) + os.sep if path else "\0"


# -- the embedded instance's session directory ------------------------------------------------------

_session: dict[str, str | None] = {"dir": None, "keep": None}


def _new_session_dir() -> str:
    """A new directory of our own (mode 0700) for the embedded instance: under ``RAY_TMPDIR`` or the
    temp dir, or ``/tmp`` when that is too long for Ray's Unix sockets (107 bytes)."""
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    if len(base) + len("/sc-ray-") + 8 + len("/ray") + _SOCKET_TAIL > 107:  # mkdtemp adds 8 characters
        base = "/tmp"
    try:
        return tempfile.mkdtemp(prefix="sc-ray-", dir=base)  # 0700, created atomically, a fresh name
    except OSError as exc:
        raise InfrastructureError(f"cannot create a session directory for Ray under {base}: {exc.strerror or exc}. "
                                  "Set RAY_TMPDIR to a writable directory with a short path.") from None


def _own_session(path: str) -> None:
    """Remember the embedded instance's session directory and clean it up when the process ends."""
    if _session["dir"] is None:
        atexit.register(_end_session)  # after Ray's own atexit shutdown handler: runs before it
    _session["dir"], _session["keep"] = path, None


def session_dir() -> str | None:
    """The embedded instance's session directory (logs, sockets), or None when none was started here."""
    return _session["dir"]


def keep_session(reason: object) -> None:
    """Keep the embedded instance's session directory when the process ends (a failure: its logs are
    for debugging); a note on stderr says where. ``reason`` is a line, or the exception a command
    ends with. Ray's logs tell nothing about bad input (exit 2), a fault of the results store
    (``StorageFault``, ``StorageFailure``, ``OSError``) or an interruption, so those keep nothing; a
    bug, a Ray failure or failed units (exit 1) keep it."""
    if isinstance(reason, BaseException):
        from orchestrator.errors import Interrupted, StorageFailure, exit_code_for
        from storage.errors import StorageFault

        if (getattr(reason, "exit_code", None) == 0 or exit_code_for(reason) == 2
                or isinstance(reason, StorageFault | StorageFailure | OSError | Interrupted)):
            return
    if _session["dir"] is not None and _session["keep"] is None:
        _session["keep"] = reason if isinstance(reason, str) else type(reason).__name__


def _end_session() -> None:
    """At exit: stop the embedded instance, then remove its session directory or say where it is kept."""
    path, reason = _session["dir"], _session["keep"]
    if path is None:
        return
    disconnect(keep=reason is not None)


def disconnect(keep: bool = False) -> None:
    """Stop (or leave) Ray. The embedded instance's session directory is removed unless ``keep`` or
    :func:`keep_session` asked for it to stay (then one line on stderr says where)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    path, reason = _session["dir"], _session["keep"]
    if path is None:
        return
    _session["dir"], _session["keep"] = None, None
    if keep or reason is not None:
        sys.stderr.write(f"note: the embedded Ray instance's logs are kept in {path}/session_latest/logs "
                         f"({reason or 'kept on request'}); remove the directory when done.\n")
        return
    for _ in range(3):  # processes that are still exiting may write a last log line meanwhile
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.2)


#: The name of the address check before it spoke Ray's protocol (kept for callers of the TCP check).
_reachable = _probe


# -- a second raylet on this machine (docs/cluster.md, "Two nodes on one machine") -------------------


def add_local_node(address: str, num_cpus: int, num_gpus: int = 0) -> str:
    """Start a raylet on 127.0.0.1 joined to the loopback head at ``address`` (``auto``: the head that
    ``ray start`` recorded under ``RAY_TMPDIR``), as ``ray start --address`` would, and return its node
    id once the head has registered it. Like ``ray start``, the node keeps running after this process
    ends: ``ray stop``, or :func:`end_processes` with the cluster's temp dir, stops it. A start that
    fails or passes :func:`start_timeout` ends the processes it made before raising."""
    set_safe_env(embedded=False)
    gcs = _resolved(address)
    if _hostport(gcs) is None:
        raise UsageError(f"no Ray head found for {address!r}: give the head's host:port (ray start prints it; "
                         "it is also in $RAY_TMPDIR/ray/ray_current_cluster)")
    _probe(gcs, 30.0)
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(gcs_address=gcs, node_ip_address="127.0.0.1", num_cpus=num_cpus, num_gpus=num_gpus,
                       min_worker_port=0, max_worker_port=0, node_manager_port=0,
                       include_log_monitor=False)  # type: ignore[arg-type]  # Ray annotates it str | None; it takes a bool
    params.dashboard_agent_listen_port = None  # a free port: the head's agent holds the default one
    timeout_s = start_timeout()
    try:
        with _bounded(timeout_s):
            node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    except BaseException as exc:
        ended = _end_children()
        if isinstance(exc, _JoinTimeout):
            raise RayStartFailure(f"the node did not join {gcs} within {timeout_s:g} s ({START_TIMEOUT_ENV}); "
                                  f"its {len(ended)} process(es) were ended") from None
        raise
    return str(node.node_id)


def _end_children() -> list[int]:
    """End this process's descendants (what a failed node start made); returns their pids."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    ours, frontier = [], [os.getpid()]
    while frontier:
        kids = [pid for pid, ppid in parents.items() if ppid in frontier]
        ours += kids
        frontier = kids
    marks = [f"/proc/{pid}" for pid in ours]  # only these pids: matched by their own /proc entry below
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while any(os.path.exists(m) for m in marks) and time.monotonic() < deadline:
            _reap(ours)
            time.sleep(0.1)
    return ours


def _main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.cluster add-node ADDRESS`` / ``stop TEMPDIR`` (docs/cluster.md)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orchestrator.cluster",
                                     description="A second Ray node on 127.0.0.1, and stopping exactly one local cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add-node", help="start a raylet on 127.0.0.1 joined to the loopback head at ADDRESS")
    add.add_argument("address", help="the head's GCS address (127.0.0.1:PORT), or auto (the head under $RAY_TMPDIR)")
    add.add_argument("--num-cpus", type=int, default=1)
    add.add_argument("--num-gpus", type=int, default=0)
    stop = sub.add_parser("stop", help="end every Ray process of the cluster whose temp dir is TEMPDIR")
    stop.add_argument("tempdir", help="the cluster's RAY_TMPDIR (what its ray start --temp-dir is under)")
    args = parser.parse_args(argv)
    try:
        if args.command == "stop":
            where = _cluster_dir(args.tempdir)
            pids = end_processes(where + os.sep)
            left = _pids_with(where + os.sep)
            sys.stderr.write(f"ended {len(pids)} Ray process(es) under {where}"
                             + (f"; still running: {left}\n" if left else "\n"))
            return 3 if left else 0
        node_id = add_local_node(args.address, args.num_cpus, args.num_gpus)
    except (UsageError, InfrastructureError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    sys.stderr.write(f"a Ray node on 127.0.0.1 joined the cluster (node {node_id}, {_n(args.num_cpus, 'CPU')}); "
                     "`ray stop` or `python -m orchestrator.cluster stop \"$RAY_TMPDIR\"` stops it\n")
    return 0


def _cluster_dir(path: str) -> str:
    """``path`` as a cluster's own temp dir: an existing directory holding Ray's ``ray/`` folder, never the
    system temp dir or ``/`` (whose paths are in every Ray process's command line)."""
    where = os.path.realpath(path)
    if where in {os.sep, os.path.realpath(tempfile.gettempdir())} or not os.path.isdir(os.path.join(where, "ray")):
        raise UsageError(f"{path!r} is not one cluster's own temp dir (a directory of its own holding ray/, "
                         "as RAY_TMPDIR=$(mktemp -d) gives); nothing was stopped")
    return where


if __name__ == "__main__":
    raise SystemExit(_main())
