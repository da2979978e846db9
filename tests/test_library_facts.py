"""tests/_library_facts.py: the value recorded for the installed version, a skip naming what to check."""

from __future__ import annotations

import _library_facts
import pytest
from _library_facts import fact

RECORD = {">=0.4,<0.7": "via fp32", ">=0.7,<0.8": "once"}


@pytest.mark.parametrize(("installed", "want"), [("0.4.1", "via fp32"), ("0.6.0", "via fp32"),
                                                  ("0.7.0", "once"), ("0.7.1rc1", "once")])  # fmt: skip
def test_the_range_of_the_installed_version(monkeypatch: pytest.MonkeyPatch, installed: str, want: str) -> None:
    monkeypatch.setattr(_library_facts, "version", lambda package: installed)
    assert fact("ml_dtypes", RECORD, what="its float64 -> bf16 cast") == want


def test_local_versions_are_in_their_release_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_library_facts, "version", lambda package: "2.13.0+cpu")
    assert fact("torch", {">=2.13,<2.14": True}, what="x") is True


def test_an_unrecorded_version_skips_naming_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_library_facts, "version", lambda package: "0.8.0")
    with pytest.raises(pytest.skip.Exception) as info:
        fact("ml_dtypes", RECORD, what="its float64 -> bf16 cast")
    msg = str(info.value.msg)
    assert msg.startswith(
        "ml_dtypes 0.8.0: behaviour of its float64 -> bf16 cast not recorded for this version "
        "(recorded: >=0.4,<0.7; >=0.7,<0.8); check it and add it to the record in ")
    assert msg.endswith("test_library_facts.py::test_an_unrecorded_version_skips_naming_what_to_check")


def test_overlapping_ranges_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_library_facts, "version", lambda package: "0.6.0")
    with pytest.raises(ValueError, match="overlapping ranges"):
        fact("ml_dtypes", {">=0.4": 1, "<0.7": 2}, what="x")
