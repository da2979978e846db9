"""The code a user's kernel runs, as a fingerprint that enters its units' ids (issue #36).

Built-in kernels carry an explicit ``version`` that is bumped with their numerics.  A user's kernel
(``package.module:attr``, an entry point, a lazily registered target) is edited all day, and its
``version`` attribute defaults to "1": without more, a relaunch after an edit found every unit done
and served the old results.  So a user's kernel is fingerprinted by its code:

* every ``.py`` file of the top-level package that holds the kernel (its helpers included), or the
  one file of a top-level module, each hashed by its content and named relative to the package's
  directory (so the same code checked out elsewhere, on another node, has the same fingerprint);
* for code installed as a distribution (site-packages), the distribution's name and version instead;
* the modules of everything the target is made of: the module named in ``module:attr``, the class
  of a kernel instance, a ``@kernel_function``'s function.

swapcheck's own packages are not hashed (built-ins keep their versions).  The fingerprint is the
first :data:`DIGITS` hex digits of the SHA-256 over those parts; :func:`code_fingerprint` returns
None when no source of the target can be found (it is then covered by its version alone, as before).
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["DIGITS", "MAX_FILES", "code_fingerprint"]

#: Hex digits of the fingerprint.
DIGITS = 16
#: More ``.py`` files than this in one package: only the files of the modules themselves are hashed.
MAX_FILES = 2000
#: swapcheck's own top-level packages: versioned explicitly, never fingerprinted.
OWN = frozenset({"tasks", "orchestrator", "storage", "reports", "swapcheck_common"})


def _modules_of(target: Any, module_name: str | None) -> list[str]:
    names = [module_name] if module_name else []
    for obj in (target, type(target), getattr(target, "fn", None), getattr(target, "__wrapped__", None)):
        mod = getattr(obj, "__module__", None)
        if isinstance(mod, str) and mod not in ("builtins", "abc"):
            names.append(mod)
    return list(dict.fromkeys(names))


def _installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _distribution(top: str) -> str | None:
    try:
        dists = metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - a broken installation: no version to name
        return None
    versions = []
    for d in sorted(set(dists)):
        try:
            versions.append(f"{d}=={metadata.version(d)}")
        except metadata.PackageNotFoundError:
            continue
    return ";".join(versions) or None


def _parts(module: str) -> list[tuple[str, bytes]]:
    """(name, content digest) pairs for one module's code, as the module docstring says."""
    top = module.split(".")[0]
    if top in OWN:
        return []
    mod, top_mod = sys.modules.get(module), sys.modules.get(top)
    file = getattr(mod, "__file__", None)
    if not file:
        return []
    path = Path(file).resolve()
    if _installed(path):
        dist = _distribution(top)
        if dist:
            return [(f"dist:{top}", dist.encode())]
    roots = [Path(p).resolve() for p in getattr(top_mod, "__path__", []) or []]
    files: list[tuple[str, Path]] = []
    for root in roots:
        found = sorted(root.rglob("*.py"))
        if len(found) > MAX_FILES:
            files = []
            break
        files += [(f"{top}/{f.relative_to(root).as_posix()}", f) for f in found if "__pycache__" not in f.parts]
    if not files:
        files = [(f"{module}:{path.name}", path)]
    out = []
    for name, f in files:
        digest = _digest(f)
        if digest is not None:
            out.append((name, digest))
    return out


_DIGESTS: dict[tuple[str, int, int, int], bytes] = {}


def _digest(f: Path) -> bytes | None:
    """SHA-256 of a file's bytes, remembered while its size, mtime and inode stay the same."""
    try:
        st = f.stat()
        key = (str(f), st.st_size, st.st_mtime_ns, st.st_ino)
        if key not in _DIGESTS:
            _DIGESTS[key] = hashlib.sha256(f.read_bytes()).digest()
        return _DIGESTS[key]
    except OSError:
        return None


def code_fingerprint(target: Any, module_name: str | None = None) -> str | None:
    """The fingerprint of the code behind ``target`` (module docstring); None when none is found."""
    parts: dict[str, bytes] = {}
    for module in _modules_of(target, module_name):
        parts.update(_parts(module))
    if not parts:
        return None
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + parts[name])
    return h.hexdigest()[:DIGITS]
