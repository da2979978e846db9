"""The stable per-unit seed: one integer from any parameters, the same in every process.

``stable_seed(*parts)`` hashes ``repr(parts)`` with SHA-256 and keeps the low 63 bits of its first
eight bytes (little-endian), so it fits ``torch.Generator.manual_seed`` and numpy alike.  It does not
depend on ``PYTHONHASHSEED``, the process or the machine; changing it would change every seeded draw
(checkpoints, operands, check trials), so it never changes.
"""

from __future__ import annotations

import hashlib

__all__ = ["stable_seed"]


def stable_seed(*parts: object) -> int:
    """A seed in [0, 2**63) from ``parts`` (hashed through ``repr``; stable across processes)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)
