"""The embedded Ray instance listens on loopback only and refuses clients without its token."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

SERVER = """
import signal, sys, time
from orchestrator.cluster import connect, disconnect
signal.signal(signal.SIGTERM, lambda *_: (disconnect(), sys.exit(0)))
c = connect(num_cpus=1)
print(c.address, flush=True)
time.sleep(120)
"""

CLIENT = """
import os, sys
import ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("CONNECTED")
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


@pytest.mark.slow
def test_embedded_ray_is_loopback_only_and_token_protected() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        address = server.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        bad = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN": "not-the-token-" + "0" * 50}
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", CLIENT, address], cwd=REPO, env=bad, capture_output=True,
                             text=True, timeout=120)
        assert "REFUSED" in out.stdout, out.stdout + out.stderr[-2000:]
        assert time.time() - t0 < 120
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def test_the_embedded_instance_keeps_its_session_directory_private(ray_local: object) -> None:
    """Ray makes its temp dir world-writable; the embedded instance's own directory is owner-only
    (issue #24: per-launch session directories of mode 0777 accumulated in /tmp/ray)."""
    import stat

    from orchestrator.cluster import session_dir

    where = session_dir()
    assert where is not None and os.path.basename(where).startswith("sc-ray-")
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
