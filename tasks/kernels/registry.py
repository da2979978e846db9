"""The registry of scaled-GEMM implementations ("kernels").

One :class:`swapcheck_common.registry.Registry` (the shape every registry of swapcheck shares), with the
kernels' own rules on top:

* ``@register_kernel("name")`` on a :class:`Kernel` subclass (or a factory returning a Kernel);
* ``register_kernel("name", "package.module:attr")`` registers a lazy entry, imported on first use;
* duplicate names are refused (:class:`KernelError`, an :class:`~swapcheck_common.errors.InputError`: exit 2);
* an unknown name is answered with "did you mean ..." and the list of valid names;
* installed distributions add kernels through the entry-point group ``swapcheck.kernels``
  (``name = "package.module:attr"``), discovered lazily and never allowed to shadow a built-in;
* a name containing ``:`` is a user's own kernel, ``"package.module:attr"``, imported directly.

What a target may be (registered, entry point or ``module:attr``), decided by :func:`_build`
*before anything is called*: only objects that declare themselves swapcheck kernels.

========================================  ==================================================
target                                    becomes
========================================  ==================================================
a :class:`Kernel` instance                itself (takes no parameters)
a :class:`Kernel` subclass                ``cls(**params)``
a function marked ``@kernel_function``    a plain matmul ``f(A, B) -> C``, wrapped as a
(:class:`KernelFunction`)                 :class:`MatmulKernel` (unscaled; ``params`` are passed
                                          to ``f`` as keyword arguments)
a callable marked ``@kernel_factory``     a factory: ``f(**params)`` must return a Kernel
(:class:`KernelFactory`)
anything else (an unmarked function or    :class:`KernelError` naming what is allowed; nothing
class, ``subprocess:Popen``, ...)         is called
========================================  ==================================================

Trust model (docs/specs.md): resolving ``"package.module:attr"`` imports ``package.module``, which
runs its top-level code, and reads the attribute (through modules and classes only); nothing else
is called until the target is known to be a kernel.  Modules of the standard library and of
torch / numpy (:data:`NEVER_KERNEL_MODULES`) are refused before any import, and so is any module
the user-code rule refuses (:func:`_user_code_refusal`, docs/kernels.md): a dotted path with a
``__main__`` component (a program's entry point: importing it runs the program), and a module of an
installed distribution (found in site-packages) that does not declare the ``swapcheck.kernels``
entry-point group; your own modules (found elsewhere) are allowed.  User kernels
(``module:attr`` names and entry points) can be turned off for the whole process and its Ray
workers: :func:`set_user_kernels` (``False``) sets ``SWAPCHECK_USER_KERNELS=0`` in the environment,
which :func:`user_kernels_enabled` reads at every resolution.

A registered name may declare a *suffix parameter*: ``fp8-blocked`` declares ``block_size``, so
``get_kernel("fp8-blocked-128")`` is ``get_kernel("fp8-blocked", block_size=128)``.

Every kernel shares one call (docs/reference/design.md): ``kernel(a, b, scale_a, scale_b, out_dtype, bias=None)``
returns the ``[M, N]`` output.  :class:`Kernel.__call__` validates the operands (see
:mod:`.operands`), asks :meth:`Kernel.supports` and :meth:`Kernel.available`, and only then runs
:meth:`Kernel.compute`; anything unsupported is a :class:`KernelError` whose message says what is
allowed.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import importlib
import inspect
import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar

from swapcheck_common.registry import Registry
from tasks.inputs import expansion_input

from .errors import KernelError

if TYPE_CHECKING:
    import torch

    from .operands import Operands

__all__ = [
    "ENTRY_POINT_GROUP",
    "NEVER_KERNEL_MODULES",
    "USER_KERNELS_ENV",
    "Kernel",
    "KernelError",
    "KernelFactory",
    "KernelFunction",
    "MatmulKernel",
    "get_kernel",
    "kernel_factory",
    "kernel_function",
    "kernel_names",
    "list_kernels",
    "register_kernel",
    "set_user_kernels",
    "user_kernels",
    "user_kernels_enabled",
]

ENTRY_POINT_GROUP = "swapcheck.kernels"
OPERAND_DTYPES = ("int8", "fp8_e4m3", "any")
DEVICES = ("cpu", "cuda")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
_DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: The environment variable behind :func:`set_user_kernels` ("0" turns user kernels off).
USER_KERNELS_ENV = "SWAPCHECK_USER_KERNELS"
#: Top-level packages that never hold a swapcheck kernel (besides the standard library, see
#: ``sys.stdlib_module_names``): a ``module:attr`` inside them is refused before any import.
NEVER_KERNEL_MODULES = frozenset({"torch", "numpy", "orchestrator", "storage", "reports"})
ALLOWED_TARGETS = (
    "a tasks.kernels.Kernel subclass or instance, a plain matmul f(A, B) -> C marked with "
    "@tasks.kernels.kernel_function, or a factory returning a Kernel marked with "
    "@tasks.kernels.kernel_factory (wrap a third-party function in your own module: "
    "`my_matmul = kernel_function(torch.matmul)`)"
)


# ---------------------------------------------------------------------------------------------
# marking callables as kernels, and the user-kernel switch


class _Marked:
    """A callable that declares itself a swapcheck kernel (see :func:`kernel_function`)."""

    role = ""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn) or isinstance(fn, _Marked):
            raise TypeError(f"{type(self).__name__} wraps a callable, got {fn!r}")
        self.fn = fn
        functools.update_wrapper(self, fn)  # name, doc, module; __wrapped__ gives the signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        where = f"{getattr(self.fn, '__module__', None) or '?'}:{getattr(self.fn, '__qualname__', repr(self.fn))}"
        return f"<{self.role} {where}>"


class KernelFunction(_Marked):
    """A plain matmul ``f(A, B) -> C`` marked as a swapcheck kernel (made by :func:`kernel_function`)."""

    role = "kernel_function"


class KernelFactory(_Marked):
    """A callable returning a :class:`Kernel`, marked as a swapcheck kernel (:func:`kernel_factory`)."""

    role = "kernel_factory"


def kernel_function(fn: Callable[..., Any]) -> KernelFunction:
    """Mark ``fn`` as a plain matmul kernel ``f(A, B, **params) -> C`` (decorator or call).

    Returns a new callable (``fn`` itself is not modified), so wrapping a third-party function
    marks only your name for it::

        @kernel_function
        def my_matmul(a, b, *, block=64): ...

        torch_matmul = kernel_function(torch.matmul)   # "mypkg.kernels:torch_matmul"
    """
    return KernelFunction(fn)


def kernel_factory(fn: Callable[..., Any]) -> KernelFactory:
    """Mark ``fn`` as a kernel factory: ``fn(**params)`` must return a :class:`Kernel`."""
    return KernelFactory(fn)


def user_kernels_enabled() -> bool:
    """Whether ``module:attr`` and entry-point kernels may be loaded (``SWAPCHECK_USER_KERNELS``)."""
    return os.environ.get(USER_KERNELS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def set_user_kernels(enabled: bool) -> None:
    """Turn user kernels on or off for this process and the processes it starts (Ray workers
    inherit the environment): sets ``SWAPCHECK_USER_KERNELS`` to "1" or "0"."""
    os.environ[USER_KERNELS_ENV] = "1" if enabled else "0"


@contextlib.contextmanager
def user_kernels(enabled: bool) -> Iterator[None]:
    """:func:`set_user_kernels` for a ``with`` block; the previous setting comes back afterwards."""
    before = os.environ.get(USER_KERNELS_ENV)
    set_user_kernels(enabled)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(USER_KERNELS_ENV, None)
        else:
            os.environ[USER_KERNELS_ENV] = before


def _user_kernels_off(what: str) -> KernelError:
    return KernelError(
        f"{what}: user kernels are turned off (--no-user-kernels, or {USER_KERNELS_ENV}=0); only "
        "built-in kernel names are allowed (swapcheck kernels list)"
    )


class Kernel(abc.ABC):
    """Base class of every scaled-GEMM implementation.

    Subclasses set the class attributes below, optionally ``param_defaults`` (the parameters they
    accept, with defaults), and implement :meth:`compute`.  They may override :meth:`available`,
    :meth:`supports` and :meth:`check_params`.

    Attributes:
        name: the name the kernel reports (and the name that ``get_kernel`` resolves back to it).
        operand_dtype: "int8", "fp8_e4m3" or "any" (int8 or fp8 e4m3, both operands alike).
        device: "cpu" or "cuda": where the operands must live.
        description: one line naming the formula and the reference section it follows.
        version: bump when the numerics change; it goes into unit ids.
        params: the parameters this instance was built with (defaults filled in).
    """

    name: str = ""
    operand_dtype: str = "any"
    device: str = "cpu"
    description: str = ""
    version: str = "1"
    param_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.param_defaults))
        if unknown:
            allowed = ", ".join(f"{k}={v!r}" for k, v in self.param_defaults.items()) or "none"
            raise KernelError(
                f"kernel {_class_name(type(self))!r} got unknown parameter(s) "
                f"{', '.join(unknown)}; allowed parameters (with defaults): {allowed}"
            )
        merged = {**self.param_defaults, **params}
        self.params: dict[str, Any] = self.check_params(merged)

    # -- hooks for subclasses -------------------------------------------------------------------
    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate (and normalise) the merged parameters; raise KernelError on a bad value."""
        return params

    def available(self) -> tuple[bool, str | None]:
        """(True, None) if the kernel can run in this process, else (False, reason)."""
        return True, None

    def supports(
        self,
        m: int,
        n: int,
        k: int,
        scale_a_numel: int,
        scale_b_numel: int,
        has_bias: bool,
    ) -> tuple[bool, str | None]:
        """(True, None) if the kernel handles this problem and scale layout, else (False, reason)."""
        return True, None

    def caveat(self) -> str | None:
        """What a user must know before trusting this kernel on this machine although it runs: a native
        path that is not exact here, or one on a slow reference fallback (None: nothing).  ``swapcheck
        kernels list`` shows it; a kernel may also expose ``code_path``, the path it takes here."""
        return None

    def bounds_algorithm(
        self, operand_dtype: str, m: int, n: int, capability: tuple[int, int] | None = None
    ) -> tuple[str, str] | None:
        """The accumulation this kernel declares for an ``[M, K] x [K, N]`` problem of ``operand_dtype``:
        ``(algorithm, accumulate)`` for :func:`tasks.checks.bounds.algorithm`, or None: no bound declared.

        The ``kdepth`` kind judges every implementation's outputs against the declared algorithm's
        bound around the exact result (the three-way arbiter of the certificate, docs/certificate.md);
        a kernel that declares nothing is reported as "no bound declared", never given a guessed one.
        """
        return None

    @abc.abstractmethod
    def compute(self, ops: Operands) -> torch.Tensor:
        """Compute the ``[M, N]`` output from validated operands (see :class:`.operands.Operands`)."""

    # -- the shared call ------------------------------------------------------------------------
    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        out_dtype: torch.dtype,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from .operands import check_operands

        ops = check_operands(self, a, b, scale_a, scale_b, out_dtype, bias)
        ok, reason = self.supports(
            ops.m, ops.n, ops.k, ops.scale_a_numel, ops.scale_b_numel, ops.bias is not None
        )
        if not ok:
            raise KernelError(f"kernel {self.name!r} does not support this problem: {reason}")
        ok, reason = self.available()
        if not ok:
            raise KernelError(f"kernel {self.name!r} is not available here: {reason}")
        return self.compute(ops)

    # -- identity ---------------------------------------------------------------------------------
    @property
    def identity(self) -> dict[str, Any]:
        """What identifies this kernel's numerics: name, version and parameters."""
        return {"name": self.name, "version": self.version, "params": dict(self.params)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Kernel):
            return NotImplemented
        return type(self) is type(other) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.version, tuple(sorted(self.params.items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"<Kernel {self.name}({args}) v{self.version}>"


class MatmulKernel(Kernel):
    """A user's plain matmul callable ``f(A, B) -> C``, wrapped as an *unscaled* kernel.

    ``A`` is ``[M, K]`` and ``B`` ``[K, N]`` floating-point tensors of one dtype; ``f`` returns the
    ``[M, N]`` product.  :meth:`matmul` calls ``f`` directly (what ``swapcheck check`` does, with
    operands in the check's dtype).  Through the shared kernel call the wrapper converts the int8 or
    fp8 operands to ``out_dtype`` (exact: int8 and e4m3 values are bf16, fp16 and fp32 values),
    calls ``f`` and returns its result in ``out_dtype``; a plain matmul has no scales and no bias, so
    that call accepts only unit scales and ``bias=None`` (anything else is a :class:`KernelError`).

    ``params`` are passed to ``f`` as keyword arguments (``f(A, B, **params)``).
    """

    operand_dtype = "any"
    device = "cpu"
    version = "1"

    def __init__(self, fn: Any, name: str, device: str = "cpu", **params: Any) -> None:
        self.fn = fn
        self.name = name
        self.device = device
        # Kernel.__init__ checks params against param_defaults; f's own signature (checked by
        # _build) is what decides here, so the params are taken as given.
        self.params = self.check_params(dict(params))
        where = f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', repr(fn))}"
        self.target = where
        raw = getattr(fn, "__doc__", None)  # the function's own docstring, not a wrapper class's
        doc = (inspect.cleandoc(raw) if isinstance(raw, str) else "").strip().splitlines()
        self.description = f"plain matmul callable {where}" + (f": {doc[0]}" if doc else "")

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        """``f(A, B, **params)``, unchecked (the caller judges what comes back)."""
        return self.fn(a, b, **self.params)

    def compute(self, ops: Operands) -> torch.Tensor:
        import torch

        unit = bool((ops.scale_a == 1).all()) and bool((ops.scale_b == 1).all())
        if not unit or ops.bias is not None:
            raise KernelError(
                f"kernel {self.name!r} is a plain matmul f(A, B) -> C: it has no scales and no bias, "
                "so it takes only unit scales and bias=None (check it with `swapcheck check`, which "
                "calls f on operands of the check's dtype)"
            )
        out = self.matmul(ops.a.to(ops.out_dtype), ops.b.to(ops.out_dtype))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (ops.m, ops.n):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise KernelError(
                f"kernel {self.name!r} returned {got}; a matmul of [M, K] = [{ops.m}, {ops.k}] "
                f"and [K, N] = [{ops.k}, {ops.n}] must return a tensor of shape [{ops.m}, {ops.n}]"
            )
        return out.to(ops.out_dtype)

    @property
    def identity(self) -> dict[str, Any]:
        return {**super().identity, "callable": self.target}

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.target, tuple(sorted(self.params.items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"<MatmulKernel {self.name} = {self.target}({args})>"


def _required_positional(fn: Any) -> tuple[int | None, inspect.Signature | None]:
    """How many positional parameters ``fn`` requires (None: its signature cannot be read)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None, None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [
        p for p in sig.parameters.values() if p.kind in kinds and p.default is inspect.Parameter.empty
    ]
    return len(required), sig


def _matmul_kernel(fn: Any, sig: inspect.Signature | None, params: dict[str, Any], what: str,
                   default_name: str) -> MatmulKernel:  # fmt: skip
    if sig is not None and params:
        try:
            sig.bind(None, None, **params)
        except TypeError as exc:
            raise KernelError(
                f"{what} is a plain matmul f(A, B) -> C; it does not accept parameters "
                f"{sorted(params)} ({exc}); its signature is {fn.__name__}{sig}"
            ) from exc
    return MatmulKernel(fn, default_name, **params)


def _class_name(cls: type) -> str:
    """The registered name of a kernel class, even when ``name`` is a per-instance property."""
    for klass in cls.__mro__:
        value = klass.__dict__.get("name")
        if isinstance(value, str) and value:
            return value
    for entry in _REGISTRY.values():  # every entry is an _Entry: nothing is imported here
        if entry.target is cls:
            return entry.name
    return cls.__name__


# ---------------------------------------------------------------------------------------------
# registry proper


@dataclass
class _Entry:
    name: str
    target: Any  # Kernel subclass, factory, Kernel instance, or "module:attr" (lazy)
    info: dict[str, Any] = field(default_factory=dict)
    source: str = "builtin"  # "builtin" | "entry point <dist>" | "lazy"

    @property
    def suffix_param(self) -> str | None:
        return self.info.get("suffix_param")


#: name -> its entry (a lazy target is resolved by :func:`_resolve`, through the trust checks).
_REGISTRY: Registry[_Entry] = Registry("kernel", error=KernelError)
_ENTRY_POINTS_LOADED = False
_REFUSED_ENTRY_POINTS: dict[str, str] = {}


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise KernelError(
            f"invalid kernel name {name!r}: use letters, digits and . _ + - "
            "(no ':' -- that form means 'module:attr')"
        )


def register_kernel(name: str, target: Any = None, **info: Any) -> Any:
    """Register a kernel under ``name``.

    Three forms::

        @register_kernel("my-kernel")             # decorator on a Kernel subclass or factory
        class MyKernel(Kernel): ...

        register_kernel("my-kernel", MyKernel)    # direct
        register_kernel("my-kernel", "pkg.mod:MyKernel")   # lazy: imported on first use

    ``info`` is stored with the entry; ``suffix_param="block_size"`` makes ``"<name>-<int>"`` mean
    ``block_size=<int>``.  A name that is already registered raises :class:`KernelError`.
    """
    _check_name(name)
    if name in _REGISTRY:
        raise KernelError(
            f"kernel name {name!r} is already registered (by {_describe_target(_REGISTRY.get(name))}); "
            "pick another name"
        )
    sp = info.get("suffix_param")
    if sp is not None and not isinstance(sp, str):
        raise KernelError(f"suffix_param must be a parameter name, got {sp!r}")
    from tasks.inputs import caller_module, registered_at_runtime

    caller = caller_module()

    def _add(obj: Any) -> Any:
        if name in _REGISTRY:  # re-checked: the decorator may run later than the call
            raise KernelError(f"kernel name {name!r} is already registered")
        if isinstance(obj, str):
            if ":" not in obj:
                raise KernelError(f"lazy kernel target must be 'module:attr', got {obj!r}")
            _REGISTRY.register(name, _Entry(name, obj, dict(info), "lazy"))
            return obj
        if not _is_kernel_target(obj):
            raise KernelError(
                f"cannot register {obj!r} as kernel {name!r}: expected a Kernel subclass, a Kernel "
                "instance, a callable marked @kernel_function (a plain matmul f(A, B) -> C) or "
                "@kernel_factory (returns a Kernel), or a 'module:attr' string"
            )
        if isinstance(obj, type) and issubclass(obj, Kernel) and "name" not in obj.__dict__:
            obj.name = name
        _REGISTRY.register(name, _Entry(name, obj, dict(info), "builtin"))
        registered_at_runtime(f"kernel {name!r}", obj, caller)
        return obj

    if target is None:
        return _add
    return _add(target)


def _unregister(name: str) -> None:
    """Remove an entry (tests only)."""
    from tasks.inputs import caller_module, registered_at_runtime

    registered_at_runtime(f"kernel {name!r}", None, caller_module())
    _REGISTRY.unregister(name)


def _describe_target(entry: _Entry) -> str:
    t = entry.target
    if isinstance(t, str):
        return t
    if isinstance(t, type):
        return f"{t.__module__}:{t.__qualname__}"
    return repr(t)


def _load_entry_points() -> None:
    """Add the ``swapcheck.kernels`` entry points as lazy entries (once per process)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # a broken installation must not break the built-ins
        warnings.warn(f"could not read entry points {ENTRY_POINT_GROUP!r}: {exc}", stacklevel=2)
        return
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
        if ep.name in _REGISTRY:
            existing = _REGISTRY.get(ep.name)
            if existing.target == ep.value:
                continue
            _REFUSED_ENTRY_POINTS[ep.name] = (
                f"entry point {ep.name}={ep.value} from {dist} refused: the name is already "
                f"registered by {_describe_target(existing)}"
            )
            warnings.warn(_REFUSED_ENTRY_POINTS[ep.name], stacklevel=2)
            continue
        if not _NAME_RE.match(ep.name) or ":" not in ep.value:
            _REFUSED_ENTRY_POINTS[ep.name] = (
                f"entry point {ep.name}={ep.value} from {dist} refused: expected name = "
                "'module:attr'"
            )
            warnings.warn(_REFUSED_ENTRY_POINTS[ep.name], stacklevel=2)
            continue
        _REGISTRY.register(ep.name, _Entry(ep.name, ep.value, {}, f"entry point from {dist}"))


def _refused_module(module_name: str) -> str | None:
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names:
        return "the standard library"
    if top in NEVER_KERNEL_MODULES:
        return f"the {top!r} package"
    return None


# ---------------------------------------------------------------------------------------------
# the user-code rule: which modules a 'module:attr' name may import (docs/kernels.md)

#: The distribution of swapcheck itself: its own modules may always be named (built-in lazy entries).
OWN_DISTRIBUTION = "swapcheck"
USER_CODE_RULE = (
    "a 'module:attr' name may import only your own modules (found outside site-packages) or a module "
    f"of an installed distribution that declares the entry-point group {ENTRY_POINT_GROUP!r}, and "
    "never a __main__ module (docs/kernels.md, 'Which modules a name may import')"
)


def _norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _site_dirs() -> list[str]:
    """Where installed distributions live: site-packages / dist-packages (real paths)."""
    import site
    import sysconfig

    dirs: list[str] = []
    with contextlib.suppress(Exception):
        dirs += site.getsitepackages()
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    for key in ("purelib", "platlib"):
        with contextlib.suppress(Exception):
            dirs.append(sysconfig.get_paths()[key])
    dirs += [p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")]
    return sorted({os.path.realpath(d) for d in dirs if d})


def _installed_location(top: str) -> str | None:
    """The site-packages folder holding top-level package/module ``top``, or None when ``top`` is
    found elsewhere (your own code: the current directory, PYTHONPATH, an editable install's source
    tree) or not at all.  Uses ``importlib.util.find_spec`` on the top-level name only, which runs
    no code of the package."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    places = list(spec.submodule_search_locations or [])
    if spec.origin and spec.has_location:
        places.append(spec.origin)
    site_dirs = _site_dirs()
    for place in places:
        real = os.path.realpath(place)
        for d in site_dirs:
            if real == d or real.startswith(d + os.sep):
                return d
    return None


@functools.cache
def _top_level_distributions() -> dict[str, list[str]]:
    try:
        return {k: list(v) for k, v in metadata.packages_distributions().items()}
    except Exception:  # a broken installation: nothing is known to provide anything
        return {}


def _kernel_distributions() -> set[str]:
    """Normalised names of the distributions that declare swapcheck kernels (and swapcheck's own)."""
    names = {_norm_dist(OWN_DISTRIBUTION)}
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:
        return names
    for ep in eps:
        dist = getattr(getattr(ep, "dist", None), "name", None)
        if dist:
            names.add(_norm_dist(dist))
    return names


def _main_refusal(module_name: str) -> str | None:
    """The __main__ rule, from the name alone: no component of the dotted path is ``__main__``."""
    if "__main__" in module_name.split("."):
        return (
            f"module {module_name!r} is a __main__ module, the entry point of a program "
            "(`python -m ...`): importing it runs that program (the __main__ rule)"
        )
    return None


def _user_code_refusal(module_name: str) -> str | None:
    """Why the user-code rule refuses to import ``module_name`` (None: allowed).  Decided before
    anything is imported: the name itself (:func:`_main_refusal`), then where its top-level package
    is found (the installed-package rule)."""
    main = _main_refusal(module_name)
    if main is not None:
        return main
    top = module_name.split(".")[0]
    where = _installed_location(top)
    if where is None:
        return None  # your own code (or not found: the import then fails, running nothing)
    dists = _top_level_distributions().get(top, [])
    allowed = _kernel_distributions()
    if any(_norm_dist(d) in allowed for d in dists):
        return None
    shown = ", ".join(sorted(set(dists))) or "no known distribution"
    return (
        f"module {module_name!r} belongs to an installed package ({top!r} in {where}, from "
        f"{shown}) that does not declare swapcheck kernels (entry-point group "
        f"{ENTRY_POINT_GROUP!r}); installed third-party code is never imported from a kernel name "
        "(the installed-package rule)"
    )


def _import_target(spec: str, what: str) -> Any:
    """The object ``"package.module:attr"`` names: import the module (its top-level code runs),
    then read the attribute through modules and classes only.  Nothing is called."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise KernelError(f"{what}: expected 'package.module:attr', got {spec!r}")
    if not _DOTTED_RE.match(module_name) or not _DOTTED_RE.match(attr):
        raise KernelError(
            f"{what}: expected 'package.module:attr' with dotted Python names, got {spec!r}"
        )
    # The user-code rule (docs/kernels.md), before anything is imported: the __main__ rule from the
    # name alone, then the packages that never hold kernels, then where the top-level package lives.
    refusal = _main_refusal(module_name)
    if refusal is None:
        refused = _refused_module(module_name)
        if refused is not None:
            raise KernelError(
                f"{what}: module {module_name!r} belongs to {refused}, which holds no swapcheck "
                f"kernels; it was not imported and nothing was called. Name {ALLOWED_TARGETS}"
            )
        refusal = _user_code_refusal(module_name)
    if refusal is not None:
        raise KernelError(
            f"{what}: refused by the user-code rule: {refusal}; it was not imported and nothing "
            f"was called. Rule: {USER_CODE_RULE}"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise KernelError(f"{what}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if part.startswith("__"):
            raise KernelError(f"{what}: {part!r} is a special attribute, never a kernel")
        if isinstance(obj, types.ModuleType):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise KernelError(f"{what}: module {module_name!r} has no attribute {attr!r}") from exc
        elif isinstance(obj, type):
            try:  # no descriptors run: a property or classmethod is not a kernel
                obj = inspect.getattr_static(obj, part)
            except AttributeError as exc:
                raise KernelError(f"{what}: module {module_name!r} has no attribute {attr!r}") from exc
            if isinstance(obj, staticmethod):
                obj = obj.__func__
        else:
            raise KernelError(
                f"{what}: {attr!r} goes through a {type(obj).__name__}; a 'module:attr' path may "
                "only go through modules and classes"
            )
    return obj


def _is_kernel_target(obj: Any) -> bool:
    """Whether ``obj`` declares itself a swapcheck kernel (nothing is called to find out)."""
    if isinstance(obj, type):
        return issubclass(obj, Kernel)
    return issubclass(type(obj), (Kernel, _Marked))


def _not_a_kernel(what: str, target: Any) -> KernelError:
    if isinstance(target, type):
        shown = f"class {target.__module__}.{target.__qualname__}"
    elif callable(target):
        mod = getattr(target, "__module__", None) or "?"
        shown = f"the unmarked callable {mod}.{getattr(target, '__qualname__', type(target).__name__)}"
    else:
        shown = f"{type(target).__name__} {target!r}"[:120]
    return KernelError(
        f"{what} is {shown}, not a Kernel subclass, Kernel instance or marked kernel callable; "
        f"nothing was called. Name {ALLOWED_TARGETS}"
    )


def _build(target: Any, params: dict[str, Any], what: str, default_name: str) -> Kernel:
    if not _is_kernel_target(target):
        raise _not_a_kernel(what, target)
    if isinstance(target, Kernel):
        if params:
            raise KernelError(f"{what} is a ready-made kernel instance and takes no parameters")
        return target
    if isinstance(target, type):
        if inspect.isabstract(target) or target is MatmulKernel:
            raise KernelError(
                f"{what} is the abstract class {target.__qualname__}, not a kernel; name your "
                "subclass that implements compute()"
            )
        kernel = target(**params)
    elif isinstance(target, KernelFunction):
        required, sig = _required_positional(target)
        if required is not None and required != 2:
            raise KernelError(
                f"{what} is a @kernel_function with signature "
                f"{getattr(target, '__name__', '')}{sig}: {required} required positional "
                "parameter(s); a plain matmul takes exactly two, f(A, B) -> C"
            )
        return _matmul_kernel(target, sig, params, what, default_name)
    else:
        try:
            kernel = target(**params)
        except TypeError as exc:
            raise KernelError(f"{what}: bad parameters {params!r}: {exc}") from exc
    if not isinstance(kernel, Kernel):
        raise KernelError(
            f"{what} returned {type(kernel).__name__}, not a tasks.kernels.Kernel; subclass Kernel "
            "and implement compute()"
        )
    if not kernel.name:
        kernel.name = default_name  # a user's class without a name reports how it was asked for
    return kernel


def _resolve(entry: _Entry) -> Any:
    if entry.source.startswith("entry point") and not user_kernels_enabled():
        raise _user_kernels_off(f"kernel {entry.name!r} ({entry.source})")
    if isinstance(entry.target, str):
        entry.target = _import_target(entry.target, f"kernel {entry.name!r} ({entry.source})")
    return entry.target


def _split_suffix(name: str) -> tuple[_Entry, str, int] | None:
    base, sep, suffix = name.rpartition("-")
    if not sep or not suffix.isdigit():
        return None
    entry = _REGISTRY.get(base) if base in _REGISTRY else None
    if entry is None or entry.suffix_param is None:
        return None
    return entry, entry.suffix_param, int(suffix)


def get_kernel(name: str, **params: Any) -> Kernel:
    """Build the kernel called ``name`` with ``params`` (defaults for the rest).

    ``name`` is a registered name, a registered name with its integer suffix parameter
    (``"fp8-blocked-128"``), an entry-point name (group ``swapcheck.kernels``), or
    ``"package.module:attr"`` naming a user's Kernel subclass or instance, or a callable marked
    :func:`kernel_function` (plain matmul ``f(A, B) -> C``) or :func:`kernel_factory`; anything
    else is a :class:`KernelError` raised before anything is called (module docstring).  With user
    kernels off (:func:`set_user_kernels`), ``module:attr`` and entry-point names are refused.
    """
    if not isinstance(name, str) or not name:
        raise KernelError(f"kernel name must be a non-empty string, got {name!r}")
    if ":" in name:
        if not user_kernels_enabled():
            raise _user_kernels_off(f"kernel {name!r}")
        target = _import_target(name, f"kernel {name!r}")
        return _build(target, params, f"kernel {name!r}", name)
    if name not in _REGISTRY:
        _load_entry_points()
    if name in _REGISTRY:
        return _build(_resolve(_REGISTRY.get(name)), params, f"kernel {name!r}", name)
    split = _split_suffix(name)
    if split is not None:
        entry, pname, value = split
        if pname in params and params[pname] != value:
            raise KernelError(
                f"kernel {name!r} names {pname}={value} but {pname}={params[pname]!r} was also given"
            )
        return _build(_resolve(entry), {**params, pname: value}, f"kernel {name!r}", name)
    raise _unknown(name)


def code_path_of(kernel: Kernel) -> str | None:
    """The code path ``kernel`` takes on this machine, where it exposes one (a ``code_path`` attribute
    or property, or a method returning it), else None."""
    path = getattr(kernel, "code_path", None)
    return None if path is None else str(path() if callable(path) else path)


@expansion_input
def kernel_code(name: str) -> str | None:
    """The code fingerprint of a user's kernel (``package.module:attr``, an entry point, a lazily
    registered target: :mod:`.fingerprint`), None for a built-in one (its ``version`` covers it).
    Enters the ids of the units that run the kernel, so an edit of its code reruns them."""
    from tasks.fingerprint import code_fingerprint

    if ":" in name:
        module_name = name.partition(":")[0]
        return code_fingerprint(_import_target(name, f"kernel {name!r}"), module_name)
    if name not in _REGISTRY:
        _load_entry_points()
    entry = _REGISTRY.get(name) if name in _REGISTRY else None
    if entry is None:
        split = _split_suffix(name)
        entry = split[0] if split is not None else None
    if entry is None:
        return None
    spec = entry.target if isinstance(entry.target, str) else None
    target = _resolve(entry)
    # swapcheck's own modules are never hashed: a built-in (any target defined in them) gets None
    return code_fingerprint(target, spec.partition(":")[0] if spec else None)


def _unknown(name: str) -> KernelError:
    """The registry's unknown-name error, with what else a kernel name may be."""
    _load_entry_points()
    suffixed = [e.name for e in _REGISTRY.values() if e.suffix_param]
    takes = "takes" if len(suffixed) == 1 else "take"
    extra = f"; {', '.join(suffixed)} also {takes} an integer suffix (e.g. '{suffixed[0]}-128')" if suffixed else ""
    refused = f" ({_REFUSED_ENTRY_POINTS[name]})" if name in _REFUSED_ENTRY_POINTS else ""
    error = _REGISTRY.unknown(name, note=f"{extra}; or give 'package.module:attr' for your own Kernel{refused}")
    assert isinstance(error, KernelError)
    return error


def kernel_names() -> list[str]:
    """Every registered name (built-ins, lazy entries and entry points), sorted."""
    _load_entry_points()
    return _REGISTRY.names()


def list_kernels() -> list[dict[str, Any]]:
    """One row per registered kernel, built with its default parameters.

    Fields: name, operand_dtype, device, available, reason, description, version, params, source,
    code_path (the path it takes on this machine, where the kernel exposes one) and caveat
    (:meth:`Kernel.caveat`).
    A kernel that cannot even be built (import error, bad factory) is a row with available False
    and the error as its reason.
    """
    rows: list[dict[str, Any]] = []
    for name in kernel_names():
        entry = _REGISTRY.get(name)
        row: dict[str, Any] = {
            "name": name,
            "operand_dtype": None,
            "device": None,
            "available": False,
            "reason": None,
            "description": "",
            "version": None,
            "params": {},
            "source": entry.source,
            "code_path": None,
            "caveat": None,
        }
        try:
            kernel = _build(_resolve(entry), {}, f"kernel {name!r}", name)
            ok, reason = kernel.available()
            row.update(
                operand_dtype=kernel.operand_dtype,
                device=kernel.device,
                available=bool(ok),
                reason=reason,
                description=kernel.description,
                version=kernel.version,
                params=dict(kernel.params),
            )
            if ok:
                row.update(code_path=code_path_of(kernel), caveat=kernel.caveat())
        except Exception as exc:  # a failure is a row too
            row["reason"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def check_choice(kernel: str, param: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """Helper for check_params: ``value`` must be one of ``choices``."""
    if value not in choices:
        raise KernelError(
            f"kernel {kernel!r}: {param}={value!r} is not allowed; choose one of "
            f"{', '.join(repr(c) for c in choices)}"
        )
    return value
