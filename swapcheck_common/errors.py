"""The one base class of input errors, whatever layer raises them.

A :class:`InputError` means the user asked for something swapcheck cannot do as asked (an unknown
name, a bad parameter, an unreadable file) and nothing was changed. ``orchestrator.errors.exit_code_for``
maps the whole tree to exit code 2 at one place; the layers below subclass it for their own errors
(``tasks.kernels.KernelError``, ``tasks.kinds.KindError``, ``storage.errors.StorageError``, ...).
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Bad input, refused before anything changed: exit code 2."""

    exit_code = 2
