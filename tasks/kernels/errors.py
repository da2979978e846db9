"""The error of the kernel layer (its own module: the operand checks and the registry both raise it)."""

from __future__ import annotations


class KernelError(ValueError):
    """A bad kernel name, bad kernel parameters, or operands the kernel does not accept.

    The message always says what is allowed (the valid names, parameters, dtypes or layouts).
    """
