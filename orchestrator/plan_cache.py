"""The plan cache: a spec's expansion kept on the launching machine, keyed by all it depends on.

Expanding a spec costs about 7-10 µs a unit (each unit's content-addressed id is a hash of its canonical
parameters): 1.0 s at 100,000 units, 10.5 s at a million (benchmarks/bench_growth.py), paid by every relaunch of a finished sweep to
learn that nothing is left to run (issue #39). The expansion is a deterministic function of

* the resolved spec: the sweep's name and every experiment's validated fields (paths made absolute);
* swapcheck's own code: the SHA-256 of every ``.py`` file of its packages, the Python and pydantic
  versions, and the ``SWAPCHECK_*`` and ``TRITON_*`` environment;
* the *expansion inputs* it read (tasks.inputs): model fingerprints, prompt files, the code
  fingerprints of users' kernels, kinds and quantizers, each with its result.

A plan is stored under the hash of the first two; a later expansion with the same hash calls each
recorded input again, and reuses the plan only if every result is the same. Anything else (a file
that does not parse, another hash, a changed input, a process that registered a kernel or kind as an
object: ``tasks.inputs.not_hermetic``) expands the spec as before. Units are still walked from the
spec when they run (``Plan.iter_units``), and a walk that gives other ids than the plan stops the
launch (``PlanChanged``), so a plan reused wrongly could only ever make a launch stop, never run or
skip the wrong work; ``tests/test_plan_cache.py`` also holds the reused plan equal to the expanded
one for every shipped spec and every kind's example.

Where: ``$SWAPCHECK_PLAN_CACHE`` (a directory; ``off`` disables the cache), else
``$XDG_CACHE_HOME/swapcheck/plans`` or ``~/.cache/swapcheck/plans``. The newest :data:`KEEP` plans
are kept. A plan file is one JSON header line (what the plan is keyed by, its inputs, its profiles,
the SHA-256 of the rest) and then each unit's 20-character id, the index of its profile, and the ids
again in sorted order (``Plan.sorted_ids``: a relaunch matches them against a checkpoint's sorted
ids with one comparison, orchestrator.runner.Pending).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from orchestrator.spec import LoadedSpec
from storage.files import write_cache_file
from tasks.inputs import OWN, Recording, not_hermetic, replay

__all__ = ["KEEP", "cache_dir", "code_digest", "load", "plan_key", "save"]

log = logging.getLogger(__name__)

#: The file format (bump when the header or the body changes). 2: the ids sorted too.
FORMAT = 2
#: Plans kept in the cache directory (the newest by modification time; a reuse refreshes it).
KEEP = 32
ENV = "SWAPCHECK_PLAN_CACHE"
_ID_LEN = 20


def cache_dir() -> Path | None:
    """The cache directory, or None when ``SWAPCHECK_PLAN_CACHE=off``."""
    from storage.files import cache_dir as swapcheck_cache

    value = (os.environ.get(ENV) or "").strip()  # unset or empty: the default directory
    if value:
        return None if value.lower() in ("off", "0", "no", "false") else Path(value).expanduser()
    base = swapcheck_cache()  # $XDG_CACHE_HOME/swapcheck or ~/.cache/swapcheck, as every cache of swapcheck's
    return base / "plans" if base is not None else None


def code_digest() -> str:
    """SHA-256 over every ``.py`` file of swapcheck's own packages (names relative to each package),
    with the Python and pydantic versions. File digests are remembered while a file's size, mtime
    and inode stay the same (tasks.fingerprint)."""
    import importlib.util

    import pydantic

    from tasks.fingerprint import _digest

    h = hashlib.sha256(f"python {sys.version}\npydantic {pydantic.VERSION}\n".encode())
    for top in sorted(OWN):
        found = importlib.util.find_spec(top)
        roots = list(found.submodule_search_locations or []) if found else []
        for root in roots:
            for f in sorted(Path(root).rglob("*.py")):
                if "__pycache__" in f.parts:
                    continue
                digest = _digest(f)
                h.update(f"{top}/{f.relative_to(root).as_posix()}\0".encode() + (digest or b"unreadable"))
    return h.hexdigest()


def plan_key(spec: LoadedSpec) -> str:
    """The hash a plan is stored under: the resolved spec and the code (module docstring)."""
    experiments = [[name, f"{type(exp).__module__}.{type(exp).__qualname__}",
                    exp.model_dump(mode="json") if hasattr(exp, "model_dump") else repr(exp)]
                   for name, exp in spec.experiments.items()]
    env = {k: v for k, v in os.environ.items() if k.startswith(("SWAPCHECK_", "TRITON_")) and k != ENV}
    material = {"format": FORMAT, "sweep": spec.sweep.name, "experiments": experiments, "code": code_digest(),
                "env": env}
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":"), default=repr).encode()).hexdigest()


def _path(directory: Path, key: str) -> Path:
    return directory / f"{key[:40]}.plan"


@dataclass(frozen=True)
class Cached:
    """A kept plan (``orchestrator.plan.make_plan`` makes the ``Plan`` of it): its ids in plan order
    and sorted (Arrow string arrays over the file's bytes), each unit's profile index, the profiles
    (``Profile.to_json``) and the merged duplicates."""

    ids: pa.Array
    sorted_ids: pa.Array
    which: array[int]
    profiles: list[dict[str, Any]]
    skip: set[int]


def load(spec: LoadedSpec) -> tuple[Cached | None, str | None]:
    """(the kept plan of ``spec`` when every input it was expanded from is unchanged, else None;
    the key to :func:`save` a new expansion under, None when the cache is off or the process is not
    hermetic)."""
    directory = cache_dir()
    if directory is None or not_hermetic() is not None:
        return None, None
    key = plan_key(spec)
    path = _path(directory, key)
    try:
        data = path.read_bytes()
    except OSError:
        return None, key
    cached, why = _parse(data, key)
    if cached is None:
        log.info("plan cache: %s not reused (%s)", path, why)
        return None, key
    try:
        os.utime(path)  # the newest are kept
    except OSError:
        pass
    log.info("plan of sweep %s: %d units from the plan cache (%s)", spec.sweep.name, len(cached.ids), path)
    return cached, key


def _parse(data: bytes, key: str) -> tuple[Cached | None, str]:
    import numpy as np

    cut = data.find(b"\n")
    head, body = memoryview(data)[: max(cut, 0)], memoryview(data)[cut + 1:]  # no copy of the body
    try:
        header = json.loads(bytes(head))
        if cut < 0 or header.get("format") != FORMAT or header.get("key") != key:
            return None, "another format or key"
        n = int(header["n"])
        if hashlib.sha256(body).hexdigest() != header["body_sha256"] or len(body) != n * (2 * _ID_LEN + 4):
            return None, "damaged"
        changed = replay(header["inputs"])
        if changed is not None:
            return None, changed
        profiles = header["profiles"]
        if not (isinstance(profiles, list) and all(isinstance(p, dict) for p in profiles)):
            return None, "damaged"
        which = array("I")
        if which.itemsize != 4:
            return None, "no 4-byte array on this platform"
        which.frombytes(body[n * _ID_LEN: n * (_ID_LEN + 4)])
        if sys.byteorder != "little":
            which.byteswap()
        if n and int(np.frombuffer(which, dtype=np.uint32).max()) >= len(profiles):
            return None, "damaged"
        ids = _id_array(body, n)
        in_order = _id_array(body[n * (_ID_LEN + 4):], n)
        skip = {int(j) for j in header["skip"]}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, pa.ArrowException) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    return Cached(ids, in_order, which, profiles, skip), ""


def _id_array(body: bytes | memoryview, n: int) -> pa.Array:
    """The ``n`` ids at the start of ``body`` (20 bytes each) as an Arrow string array over the same
    bytes: no Python string per unit."""
    import numpy as np

    wide = (n + 1) * _ID_LEN >= 2**31  # offsets past int32: a large_string, then cast
    offsets = np.arange(0, (n + 1) * _ID_LEN, _ID_LEN, dtype=np.int64 if wide else np.int32)
    ids = pa.Array.from_buffers(pa.large_string() if wide else pa.string(), n,
                                [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(body)])
    ids.validate(full=True)
    return ids.cast(pa.string()) if wide else ids


def save(key: str, plan: Any, rec: Recording) -> None:
    """Keep ``plan`` (an ``orchestrator.plan.Plan``) under ``key`` (:func:`load`'s; the plan just
    expanded while ``rec`` recorded its inputs), unless the process is not hermetic or an input
    changed while it was read. Never fails a launch."""
    directory = cache_dir()
    reason = not_hermetic() or rec.conflict
    if directory is None or reason is not None:
        if reason:
            log.info("plan of sweep %s not cached: %s", plan.sweep, reason)
        return
    if any(len(i) != _ID_LEN for i in plan.ids):
        return
    which = array("I", plan.which)
    if sys.byteorder != "little":
        which.byteswap()
    body = "".join(plan.ids).encode("ascii") + which.tobytes() + "".join(sorted(plan.ids)).encode("ascii")
    header = {"format": FORMAT, "key": key, "sweep": plan.sweep, "n": len(plan.ids),
              "skip": sorted(plan._skip), "inputs": rec.entries(), "body_sha256": hashlib.sha256(body).hexdigest(),
              "profiles": [p.to_json() for p in plan.profiles]}
    if write_cache_file(_path(directory, key), json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
                        + b"\n" + body):
        _evict(directory)
    else:
        log.info("plan cache %s not written", directory)


def _evict(directory: Path) -> None:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    plans = sorted(directory.glob("*.plan"), key=mtime, reverse=True)
    for old in plans[KEEP:]:
        old.unlink(missing_ok=True)
