"""Starting or joining Ray.

The embedded default is a local Ray instance that listens on loopback only
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray bind to 127.0.0.1), with token authentication on
(``RAY_AUTH_MODE=token``: ``ray.init`` generates the token) and no dashboard. ``--address`` joins an
existing cluster instead (for example ``ray://head:10001`` or ``auto`` on a cluster node).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from orchestrator.errors import InfrastructureError

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
EMBEDDED_ENV = {**LOOPBACK_ENV, "RAY_AUTH_MODE": "token"}


@dataclass(frozen=True)
class Connection:
    embedded: bool
    address: str
    num_cpus: float


def _verbose() -> bool:
    """``swapcheck -v``: workers' output reaches the terminal (otherwise it stays in Ray's logs)."""
    return os.environ.get("SWAPCHECK_VERBOSITY") == "verbose"


def set_safe_env(embedded: bool) -> None:
    """Loopback binding is the safe default for users too; an explicit environment wins."""
    for key, value in (EMBEDDED_ENV if embedded else LOOPBACK_ENV).items():
        os.environ.setdefault(key, value)


def _reachable(address: str, timeout_s: float) -> None:
    """A TCP connection to ``host:port`` (of ``host:port`` or ``ray://host:port``) within the timeout."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself: ray.init's own checks (under the timeout) apply
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InfrastructureError(
            f"cannot reach the Ray cluster at {address!r} within {timeout_s:g} s: {exc}. Check the address "
            "(ray://head:10001 for Ray Client, head:6379 on a cluster node) or raise --connect-timeout."
        ) from None


def connect(address: str | None = None, num_cpus: int | None = None, timeout_s: float = 30.0) -> Connection:
    """Start the embedded Ray instance (``address=None``) or join ``address`` within ``timeout_s``."""
    set_safe_env(embedded=address is None)
    import ray

    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return Connection(address is None, ctx.gcs_address, ray.cluster_resources().get("CPU", 0))
    if address is not None:
        _reachable(address, timeout_s)
    where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address!r}"
    if address is not None:
        # An address that accepts connections but is not a Ray head: Ray's own GCS connect timeout
        # (ray.init must run in the main thread, so no watchdog thread can bound it instead).
        os.environ.setdefault("RAY_gcs_rpc_server_connect_timeout_s", str(max(1, int(timeout_s))))
    try:
        if address is None:
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=_verbose(),
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        else:
            ray.init(address=address, log_to_driver=_verbose(), logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - Ray raises many types for a failed start/join
        raise InfrastructureError(f"could not {where}: {type(exc).__name__}: {exc}") from None
    ctx = ray.get_runtime_context()
    return Connection(address is None, ctx.gcs_address, ray.cluster_resources().get("CPU", 0))


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
