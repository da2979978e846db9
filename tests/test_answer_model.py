"""answer-qwen3, the shipped model with answers (docs/models.md "A model with answers"): it loads by
name with its sha256 checked, a tampered copy is refused, the prompt reader carries answers, and a
generate unit records ``correct`` that plain DuckDB over its Parquet reproduces.

The slow siblings (retraining reproduces the hash; held-out accuracy; a sweep through Ray) are in
tests/test_answer_model_train.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.kinds import fields
from tasks.models import build_model
from tasks.models.checkpoint import SHIPPED_MODELS, ManifestError, check_manifest, shipped_model_dir
from tasks.prompts import answers_from_payload, read_prompt_file, read_prompt_records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import train_answer_model as tam  # noqa: E402

DEMO_PROMPTS = ROOT / "sweeps" / "prompts" / "answer-demo.jsonl"
runner = CliRunner()


def test_shipped_model_loads_by_name_with_its_hash_checked() -> None:
    assert fields.SHIPPED_MODELS == SHIPPED_MODELS  # the torch-free copy the spec validation uses
    root = shipped_model_dir("answer-qwen3")
    manifest = check_manifest(root)
    assert manifest is not None
    sha = hashlib.sha256((root / "model.safetensors").read_bytes()).hexdigest()
    assert manifest["model_safetensors_sha256"] == sha
    assert (root / "model.safetensors").stat().st_size < 5 * 2**20
    model = build_model("answer-qwen3")
    assert model.identity()["model"] == "answer-qwen3" and model.source == "float-checkpoint"
    assert len(model.linears()) == 7 * tam.CONFIG["num_hidden_layers"]
    assert fields.model_fingerprint("answer-qwen3") == f"answer-qwen3@{sha[:16]}"
    assert fields.model_and_prompt_problems("e.x", "answer-qwen3", fields.FilePrompts(file=str(DEMO_PROMPTS))) == []
    # The shipped model answers: 1 + 2 and 999 + 999 through the W8A8 engine.
    gen = model.generate([tam.encode_prompt(1, 2), tam.encode_prompt(999, 999)], tam.ANSWER_LEN)
    assert [tam.decode_answer(t) for t in gen.tokens] == [3, 1998]


def test_tampered_weights_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "answer-qwen3"
    shutil.copytree(shipped_model_dir("answer-qwen3"), bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    (bad / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match MANIFEST.json"):
        build_model(str(bad))
    problems = fields.model_and_prompt_problems("experiments.a", str(bad), fields.SyntheticPrompts())
    assert len(problems) == 1 and problems[0].startswith("experiments.a.model: ") and "sha256" in problems[0]
    # The CLI refuses such a spec with exit 2, naming the field.
    spec = tmp_path / "spec.toml"
    spec.write_text(f'question = "q"\nname = "t"\n[experiments.a]\nkind = "generate"\nmodel = "{bad}"\n'
                    '[experiments.a.arms.c]\nkernel = "int8-cutlass-order"\n')
    res = runner.invoke(app, ["sweep", "validate", str(spec)])
    assert res.exit_code == 2, res.output
    assert "experiments.a.model" in res.output and "does not match" in res.output
    (bad / "MANIFEST.json").write_text(json.dumps({"model_safetensors_sha256": "x"}))
    with pytest.raises(ManifestError, match="not a sha256"):
        check_manifest(bad)


def test_prompt_reader_carries_answers(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"tokens": [1, 5], "answer": [7, 2], "text": "ignored"}\n[3, 4]\n\n{"tokens": [9]}\n')
    prompts, answers = read_prompt_records(str(f))
    assert prompts == [[1, 5], [3, 4], [9]] and answers == [[7, 2], None, None]
    assert read_prompt_file(str(f)) == prompts
    payload = fields.prompt_payload(fields.FilePrompts(file=str(f)))
    assert payload == {"tokens": prompts, "answers": answers}
    assert answers_from_payload(payload) == answers
    # A file without answers gives the payload it gave before answers existed (unit ids unchanged).
    g = tmp_path / "q.jsonl"
    g.write_text('{"tokens": [1, 5]}\n[3, 4]\n')
    assert fields.prompt_payload(fields.FilePrompts(file=str(g))) == {"tokens": [[1, 5], [3, 4]]}
    assert answers_from_payload({"tokens": [[1]]}) is None
    for bad, why in (('{"tokens": [1], "answer": []}', "answer"), ('{"tokens": [1], "answer": [-1]}', "answer"),
                     ('{"tokens": [1], "answer": "12"}', "answer"), ('{"tokens": []}', "non-empty")):
        f.write_text('[1]\n' + bad + "\n")
        with pytest.raises(ValueError, match=rf"p.jsonl:2: .*{why}"):
            read_prompt_records(str(f))


def test_demo_prompts_are_held_out_and_right() -> None:
    prompts, answers = read_prompt_records(str(DEMO_PROMPTS))
    test_pairs, _ = tam.split_pairs(0)
    held_out = {(p // 1000, p % 1000) for p in test_pairs.tolist()}
    for line, p, a in zip(DEMO_PROMPTS.read_text().splitlines(), prompts, answers, strict=True):
        x, y = map(int, json.loads(line)["text"].split("=")[0].split("+"))
        assert (x, y) in held_out
        assert p == tam.encode_prompt(x, y) and a == tam.encode_answer(x, y) and tam.decode_answer(a) == x + y


def test_generate_unit_records_correct_and_duckdb_recomputes_accuracy(tmp_path: Path) -> None:
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.schemas import SEQUENCES
    from tasks.kinds.generate import KIND, GenerateExperiment

    prompts = tmp_path / "p.jsonl"
    lines = DEMO_PROMPTS.read_text().splitlines()[:12]
    # Two planted wrong expected answers and one prompt without an answer.
    rows = [json.loads(x) for x in lines]
    rows[0]["answer"] = tam.encode_answer(0, 0) if rows[0]["answer"] != tam.encode_answer(0, 0) else tam.encode_answer(0, 1)
    rows[1]["answer"] = rows[1]["answer"][:-1] + [tam.DIGIT0]  # a digit where <eos> belongs
    del rows[2]["answer"]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exp = GenerateExperiment.model_validate({
        "kind": "generate", "model": "answer-qwen3", "restarts": 1, "max_new_tokens": 5,
        "prompts": fields.FilePrompts(file=str(prompts)), "arms": {"cutlass": {"kernel": "int8-cutlass-order"}}})
    (unit,) = KIND.expand("answers", exp)
    out = KIND.run(unit.params, None)
    seqs = out["sequences"]
    assert seqs[2]["correct"] is None and seqs[2]["extracted_answer"] is None
    for r, want in zip(seqs, rows, strict=True):
        if "answer" in want:
            assert r["extracted_answer"] == r["tokens"][:5]
            assert r["correct"] == (r["extracted_answer"] == want["answer"])
    assert not seqs[0]["correct"] and not seqs[1]["correct"]
    table = pa.Table.from_pylist([{"unit_id": unit.id, "experiment": "answers", **r} for r in seqs], schema=SEQUENCES)
    pq.write_table(table, tmp_path / "seq.parquet")
    got = duckdb.connect().execute(f"""
        SELECT arm, count(correct) AS n, count(*) FILTER (WHERE correct) AS k
        FROM read_parquet('{tmp_path / "seq.parquet"}') GROUP BY arm""").fetchall()
    # Independent recomputation: decode each generated answer to an integer and compare with x + y.
    truth = []
    for r, line in zip(seqs, lines, strict=True):
        x, y = map(int, json.loads(line)["text"].split("=")[0].split("+"))
        truth.append(tam.decode_answer(r["tokens"][:5]) == x + y)
    assert sum(truth) >= 11  # the trained model answers (nearly) all of them right
    # Rows 0 and 1 expect a wrong answer, row 2 none: accuracy counts rows 3.. and nothing else.
    assert got == [("cutlass", 11, sum(truth[3:]))]
