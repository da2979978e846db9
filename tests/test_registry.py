"""swapcheck_common.registry.Registry: the one shape of every name -> thing table (kinds, kernels, attention
kernels, quantizers, reports), and the one error base its failures share (exit code 2)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import exit_code_for
from swapcheck_common.errors import InputError
from swapcheck_common.registry import Registry, RegistryError, did_you_mean

LAZY_MODULE = "swapcheck_test_registry_lazy"


class WidgetError(RegistryError):
    """A registry's own error class."""


@pytest.fixture
def lazy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module on the path that nothing has imported yet (removed from sys.modules afterwards)."""
    (tmp_path / f"{LAZY_MODULE}.py").write_text('WIDGET = ("the widget",)\nNOT_A_WIDGET = 42\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(LAZY_MODULE, None)
    yield LAZY_MODULE
    sys.modules.pop(LAZY_MODULE, None)


def test_register_and_get_and_a_duplicate_is_refused() -> None:
    reg: Registry[int] = Registry("widget", error=WidgetError)
    assert reg.register("one", 1) == 1
    assert reg.get("one") == 1 and "one" in reg and len(reg) == 1
    with pytest.raises(WidgetError, match="widget 'one' is already registered"):
        reg.register("one", 2)
    assert reg.get("one") == 1  # the first stays
    reg.register("one", 3, replace=True)
    assert reg.get("one") == 3
    reg.unregister("one")
    reg.unregister("one")  # absent: no error
    assert "one" not in reg
    with pytest.raises(WidgetError, match="non-empty name"):
        reg.register("", 1)


def test_names_are_sorted_and_iteration_follows_them() -> None:
    reg: Registry[int] = Registry("widget")
    for name, value in (("zeta", 3), ("alpha", 1), ("mid", 2)):
        reg.register(name, value)
    assert reg.names() == ["alpha", "mid", "zeta"] == list(reg)
    assert reg.values() == [1, 2, 3]
    assert reg.items() == [("alpha", 1), ("mid", 2), ("zeta", 3)]


def test_an_unknown_name_says_did_you_mean_and_the_allowed_names_and_is_an_input_error() -> None:
    reg: Registry[int] = Registry("widget", error=WidgetError)
    for name in ("sprocket", "gear", "flange"):
        reg.register(name, 0)
    with pytest.raises(WidgetError) as info:
        reg.get("sprockett")
    assert str(info.value) == "unknown widget 'sprockett'; did you mean 'sprocket'? allowed: flange, gear, sprocket"
    assert isinstance(info.value, RegistryError) and isinstance(info.value, InputError)
    assert isinstance(info.value, ValueError)  # callers that caught ValueError still do
    assert exit_code_for(info.value) == 2
    with pytest.raises(WidgetError) as info:
        reg.get("zzz")
    assert "did you mean" not in str(info.value) and "allowed: flange, gear, sprocket" in str(info.value)
    narrowed = reg.unknown("gearr", allowed=["gear"], note="; or give 'module:attr'")
    assert str(narrowed) == "unknown widget 'gearr'; did you mean 'gear'? allowed: gear; or give 'module:attr'"
    assert str(Registry("widget").unknown("x")).endswith("allowed: none registered")
    assert did_you_mean("gera", ["gear", "flange"]) == "did you mean 'gear'? "


def test_every_registry_error_maps_to_exit_code_2_through_the_one_base() -> None:
    from storage.errors import QueryError, StorageError
    from tasks.attention import AttentionError
    from tasks.checks import CheckInputError
    from tasks.kernels import KernelError
    from tasks.kinds import KindError
    from tasks.quantizers import QuantizerError

    for cls in (RegistryError, KindError, KernelError, AttentionError, QuantizerError, CheckInputError,
                StorageError, QueryError):
        assert issubclass(cls, InputError), cls
        assert exit_code_for(cls("x")) == 2, cls
    assert issubclass(KindError, RegistryError)


def test_the_registries_of_swapcheck_are_registries() -> None:
    import tasks.kinds as kinds
    from tasks.attention import registry as attention
    from tasks.kernels import registry as kernels
    from tasks.quantizers import registry as quantizers

    for module in (kinds, kernels, attention, quantizers):
        assert isinstance(module._REGISTRY, Registry), module.__name__


def test_a_lazy_entry_is_imported_only_on_get(lazy_module: str) -> None:
    reg: Registry[tuple[str]] = Registry("widget", error=WidgetError)
    reg.register("w", f"{LAZY_MODULE}:WIDGET")
    assert reg.names() == ["w"] and "w" in reg and not reg.is_loaded("w")
    assert reg.ref("w") == f"{LAZY_MODULE}:WIDGET"
    assert LAZY_MODULE not in sys.modules  # listing, membership and ref import nothing
    assert reg.get("w") == ("the widget",)
    assert LAZY_MODULE in sys.modules
    assert reg.is_loaded("w") and reg.ref("w") is None
    assert reg.get("w") is sys.modules[LAZY_MODULE].WIDGET


def test_a_lazy_entry_is_validated_and_a_broken_one_names_itself(lazy_module: str) -> None:
    def validate(name: str, entry: object) -> None:
        if not isinstance(entry, tuple):
            raise WidgetError(f"{name}: not a widget")

    reg: Registry[tuple[str]] = Registry("widget", error=WidgetError, validate=validate)
    reg.register("bad", f"{LAZY_MODULE}:NOT_A_WIDGET")
    reg.register("missing", f"{LAZY_MODULE}:NO_SUCH_ATTR")
    reg.register("gone", "swapcheck_no_such_module_anywhere:W")
    with pytest.raises(WidgetError, match="bad: not a widget"):
        reg.get("bad")
    assert not reg.is_loaded("bad")  # a refused entry is not kept as loaded
    with pytest.raises(WidgetError, match=f"widget 'missing': cannot load {LAZY_MODULE}:NO_SUCH_ATTR"):
        reg.get("missing")
    with pytest.raises(WidgetError, match="widget 'gone': cannot load swapcheck_no_such_module_anywhere:W"):
        reg.get("gone")
