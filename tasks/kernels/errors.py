"""The error of the kernel layer (its own module: the operand checks and the registry both raise it)."""

from __future__ import annotations

from swapcheck_common.errors import InputError


class KernelError(InputError):
    """A bad kernel name, bad kernel parameters, or operands the kernel does not accept (exit code 2).

    The message always says what is allowed (the valid names, parameters, dtypes or layouts).
    """
