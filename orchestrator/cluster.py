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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from orchestrator.errors import InfrastructureError

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
EMBEDDED_ENV = {**LOOPBACK_ENV, "RAY_AUTH_MODE": "token"}
ADDRESS_ENV = "RAY_ADDRESS"


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


def _reachable(address: str, timeout_s: float) -> None:
    """A TCP connection to ``host:port`` (of ``host:port`` or ``ray://host:port``) within the timeout."""
    import socket

    target = _hostport(address)
    if target is None:
        return  # "auto", or a form Ray resolves itself: ray.init's own checks (under the timeout) apply
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        raise InfrastructureError(
            f"cannot reach the Ray cluster at {address!r} within {timeout_s:g} s: {exc}. Check the address "
            "(ray://head:10001 for Ray Client, head:6379 on a cluster node) or raise --connect-timeout."
        ) from None


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
        _reachable(address, timeout_s)
    where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address!r} ({source})"
    if address is not None:
        # An address that accepts connections but is not a Ray head: Ray's own GCS connect timeout
        # (ray.init must run in the main thread, so no watchdog thread can bound it instead).
        os.environ.setdefault("RAY_gcs_rpc_server_connect_timeout_s", str(max(1, int(timeout_s))))
    try:
        if address is None:
            # "local": always a new instance of our own. Without it Ray joins a cluster that `ray start`
            # left on this machine (someone else's, with its own settings) and then refuses num_cpus
            # ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=_verbose(),
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        else:
            with _address_env(address):
                ray.init(address=address, log_to_driver=_verbose(), logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - Ray raises many types for a failed start/join
        hint = ""
        if "pip package" in str(exc) and "ray[client]" in str(exc):
            hint = " Install swapcheck with its dependencies (pip install swapcheck) or pip install 'ray[client]'."
        raise InfrastructureError(f"could not {where}: {type(exc).__name__}: {exc}{hint}") from None
    return _connection(embedded, source, address)


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
