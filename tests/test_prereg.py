"""Pre-registration: hashed at launch before any unit runs, append-only, scored after the run."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import tiny_spec_text

runner = CliRunner()

PREDICTIONS = """
sweep = "prereg-tiny"

[[predictions]]
id = "pow2-identical"
statement = "Under pow2 scales the pair is bit-identical at every K."
table = "kdepth"
where = "comparison = 'pair' AND scale_mode = 'pow2'"
every = "differing = 0"
label = "k"
noun = "units"

[[predictions]]
id = "everything-differs"
statement = "A deliberately wrong prediction: every comparison differs somewhere."
table = "kdepth"
where = "comparison = 'reference'"
every = "differing > 0"
label = "impl_a || ' K=' || k || ' seed=' || seed || ' ' || scale_mode"

[[predictions]]
id = "rate"
statement = "Fewer than 1e-3 of outputs differ between the pair under real scales."
table = "kdepth"
where = "comparison = 'pair' AND scale_mode = 'real'"
aggregate = "sum(differing) < 1e-3 * sum(elements)"
measure = "sum(differing) / sum(elements)"
"""


def _setup(tmp_path: Path, predictions: str = PREDICTIONS) -> tuple[Path, Path]:
    (tmp_path / "prereg").mkdir()
    (tmp_path / "prereg" / "p.toml").write_text(predictions)
    spec = tmp_path / "spec.toml"
    spec.write_text('preregistration = ["prereg/p.toml"]\n' + tiny_spec_text(name="prereg-tiny"))
    return spec, tmp_path / "results"


def _launch(spec: Path, results: Path):
    return runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])


def _report(results: Path):
    return runner.invoke(app, ["report", "predictions", "--results", str(results), "--format", "json"])


def test_predictions_are_registered_and_scored(ray_local, tmp_path: Path) -> None:
    spec, results = _setup(tmp_path)
    assert _launch(spec, results).exit_code == 0
    res = _report(results)
    assert res.exit_code == 0, res.output
    by_id = {r["prediction"]: r for r in json.loads(res.stdout)}
    assert by_id["pow2-identical"]["status"] == "confirmed"
    assert by_id["pow2-identical"]["support"] == "6/6"
    wrong = by_id["everything-differs"]
    assert wrong["status"] == "refuted" and wrong["counterexample"]
    assert "K=" in wrong["counterexample"]
    assert by_id["rate"]["status"] == "confirmed" and by_id["rate"]["measured"] < 1e-3
    assert not any(r["amended"] for r in by_id.values())


def test_editing_a_registered_file_is_caught(ray_local, tmp_path: Path) -> None:
    spec, results = _setup(tmp_path)
    assert _launch(spec, results).exit_code == 0
    original = (tmp_path / "prereg" / "p.toml").read_text()
    (tmp_path / "prereg" / "p.toml").write_text(original.replace("differing = 0", "differing >= 0"))
    relaunch = _launch(spec, results)
    assert relaunch.exit_code == 2 and "changed after it was registered" in relaunch.output
    rep = _report(results)
    assert rep.exit_code == 1 and "edited after registration" in rep.output
    # The registered text is what gets scored.
    assert all(r["file_edited_after_registration"] for r in json.loads(rep.stdout))


def test_amendment_after_results_is_marked(ray_local, tmp_path: Path) -> None:
    spec, results = _setup(tmp_path)
    assert _launch(spec, results).exit_code == 0
    from orchestrator.prereg import sha256

    digest = sha256((tmp_path / "prereg" / "p.toml").read_text())
    (tmp_path / "prereg" / "p2.toml").write_text(
        f'sweep = "prereg-tiny"\namends = "{digest}"\n\n[[predictions]]\nid = "everything-differs"\n'
        'statement = "Amended: pow2 reference rows never differ."\ntable = "kdepth"\n'
        "where = \"comparison = 'reference' AND scale_mode = 'pow2'\"\nevery = \"differing = 0\"\n")
    spec.write_text('preregistration = ["prereg/p.toml", "prereg/p2.toml"]\n' + tiny_spec_text(name="prereg-tiny"))
    assert _launch(spec, results).exit_code == 0
    by_id = {r["prediction"]: r for r in json.loads(_report(results).stdout)}
    amended = by_id["everything-differs"]
    assert amended["amended"] and amended["amended_after_results"] and amended["status"] == "confirmed"
    assert not by_id["pow2-identical"]["amended"]


def test_bad_predictions_exit_2_and_write_nothing(tmp_path: Path) -> None:
    for bad in (PREDICTIONS.replace('table = "kdepth"', 'table = "kdepht"', 1),
                PREDICTIONS.replace("every = \"differing = 0\"", "every = \"differnig = 0\""),
                PREDICTIONS.replace('sweep = "prereg-tiny"', 'sweep = "other"'),
                PREDICTIONS.replace("noun = \"units\"", "noun = \"units\"\nsurprise = 1")):
        d = tmp_path / str(abs(hash(bad)))
        d.mkdir()
        spec, results = _setup(d, bad)
        res = _launch(spec, results)
        assert res.exit_code == 2, res.output
        assert "p.toml" in res.output
        assert not results.exists()


def test_one_parser_for_registration_and_scoring() -> None:
    """Launch and report read prediction files with the same parser (storage.prereg.parse), which
    names the field path of each problem; at launch its error becomes a SpecError (exit 2)."""
    import pytest

    from orchestrator import prereg
    from orchestrator.errors import SpecError
    from reports import predictions
    from storage.prereg import PredictionFileError, parse
    from swapcheck_common.errors import InputError

    assert predictions.parse is parse and prereg.parse is parse
    assert predictions.PredictionFile is prereg.PredictionFile
    assert [p.id for p in parse(PREDICTIONS, "p.toml").predictions] == ["pow2-identical", "everything-differs", "rate"]
    bad = PREDICTIONS.replace('noun = "units"', 'noun = "units"\nsurprise = 1')
    with pytest.raises(PredictionFileError) as caught:
        parse(bad, "p.toml")
    assert isinstance(caught.value, InputError) and caught.value.problems == ["predictions.0.surprise: unknown key (got 1)"]
    with pytest.raises(SpecError, match="predictions.0.surprise: unknown key"):
        prereg.parse_file(bad, "p.toml")
