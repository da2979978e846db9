"""`report all` as a person reads it: verdicts first, a table of contents, captioned figures, the date.

A small real results tree (K-depth with two seeds and a bit-identical pair, per-layer replay written
in a scrambled order, kernel checks, no end-to-end arms) is rendered to HTML. Without a browser the
page's structure is checked; with Debian's ``chromium`` (``make test`` does not install it; CI's
``.ci/run`` does) the page is loaded headless: no console errors, and a screenshot is produced.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import figures, render
from storage.catalog import open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed
SWEEP = "s1"
TYPES = ("q", "k", "v", "o", "gate", "up", "down")


def _compare(elements: int, differing: int, spacing: int) -> dict[str, Any]:
    return {"elements": elements, "differing": differing, "frac_differing": differing / elements,
            "max_spacing": spacing, "max_spacing_significant": spacing, "hist_0": elements - differing,
            "hist_1": differing, "hist_2": 0, "hist_gt2": 0, "nonfinite_mismatch": 0, "max_abs_error": 0.0}


def _kdepth(k: int, seed: int, differing: int, comparison: str = "pair", impl_b: str = "b-kernel") -> dict[str, Any]:
    return {"unit_id": f"kd-{comparison}-{k}-{seed}", "experiment": "kdepth", "dtype": "int8", "out_dtype": "bf16",
            "m": 32, "n": 32, "k": k, "seed": seed, "scale_mode": "real", "bias": False, "comparison": comparison,
            "impl_a": "a-kernel", "impl_b": impl_b, "kernel_a": "a-kernel", "kernel_b": impl_b,
            **_compare(1024, differing, 1 if differing else 0)}


def _replay(index: int, kind: str, differing: int) -> dict[str, Any]:
    where = "mlp" if kind in ("gate", "up", "down") else "self_attn"
    return {"unit_id": f"rp-{index}-{kind}", "experiment": "replay", "model": "tiny",
            "layer": f"layers.{index}.{where}.{kind}_proj", "layer_index": index, "layer_type": kind,
            "scale_mode": "real", "comparison": "pair", "impl_a": "a-kernel", "impl_b": "b-kernel", "m": 4, "n": 8,
            "k": 8, **_compare(512, differing, 1 if differing else 0), "bitwise_equal": differing == 0,
            "accumulators_equal": True, "accumulators_exact": True}


def _check(table: str, kernel: str, verdict: str) -> dict[str, Any]:
    return {"unit_id": f"{table}-{kernel}", "experiment": table, "kernel": kernel, "kind": "int8", "dtype": "bf16",
            "trial": 0, "seed": 0, "verdict": verdict}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("html") / "results"
    store = ResultStore(root)
    store.write("kdepth", SWEEP, "kd", [
        _kdepth(64, 0, 0), _kdepth(64, 1, 2), _kdepth(256, 0, 3), _kdepth(256, 1, 5),
        _kdepth(64, 0, 0, "reference", "exact"), _kdepth(64, 1, 0, "reference", "exact"),
        _kdepth(256, 0, 1, "reference", "exact"), _kdepth(256, 1, 0, "reference", "exact"),
    ])
    # written alphabetically (down, gate, ..., v): the heatmap must put them in forward order
    store.write("replay", SWEEP, "rp", [_replay(i, t, 3 if (i, t) == (1, "up") else 0)
                                        for i in (1, 0) for t in sorted(TYPES)])
    store.write("exact_match", SWEEP, "em", [_check("exact_match", "a-kernel", "IDENTICAL")])
    return root


@pytest.fixture(scope="module")
def page(results: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("page") / "report.html"
    res = runner.invoke(app, ["report", "all", "--results", str(results), "--sweep", SWEEP, "--format", "html",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


class _Page(HTMLParser):
    """Ids, in-page links, and each <img> with the <figure> it sits in and that figure's caption."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.images: list[dict[str, Any]] = []
        self.stack: list[dict[str, Any]] = []
        self.in_caption: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag == "a" and (a.get("href") or "").startswith("#"):
            self.links.append(str(a["href"])[1:])
        if tag == "figure":
            self.stack.append({"id": a.get("id"), "caption": "", "images": 0})
        elif tag == "figcaption" and self.stack:
            self.in_caption = self.stack[-1]
        elif tag == "img":
            self.images.append({"figure": self.stack[-1] if self.stack else None, "alt": a.get("alt")})

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self.stack:
            self.stack.pop()
        elif tag == "figcaption":
            self.in_caption = None

    def handle_data(self, data: str) -> None:
        if self.in_caption is not None:
            self.in_caption["caption"] += data


def test_every_figure_is_captioned_and_the_contents_resolve(page: Path) -> None:
    text = page.read_text()
    p = _Page()
    p.feed(text)
    assert len(p.images) >= 3  # K-depth pairs, K-depth vs the reference, replay
    for img in p.images:
        assert img["figure"] is not None, "an image outside a <figure>"
        assert img["figure"]["caption"].strip(), f"figure {img['figure']['id']} has no caption"
        assert img["alt"]
    assert p.links, "no table of contents"
    assert set(p.links) <= set(p.ids), f"links to missing ids: {set(p.links) - set(p.ids)}"
    assert len(p.ids) == len(set(p.ids)), "duplicate ids"
    # issue #40: the answers, then the contents, then the verdict table, then the sections' figures
    assert text.index('id="summary"') < text.index('class="toc"') < text.index('id="verdicts"') < text.index("<figure")


def test_verdicts_date_not_run_and_ppm(page: Path) -> None:
    text = page.read_text()
    assert "a-kernel vs b-kernel" in text[:text.index("<figure")]
    assert re.search(r"Generated <time datetime=\"\d{4}-\d\d-\d\dT[^\"]+\">\d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert "not run" in text  # no end-to-end arms ran for the pair
    assert "ppm" in text and "fraction of outputs" not in text
    assert text.rindex('id="provenance"') > text.rindex("<figure")


def test_replay_layers_in_forward_order(results: Path) -> None:
    with open_catalog(results) as cat:
        order, labels, ppms = figures._replay_grid(figures.replay.by_layer(cat, SWEEP))
    assert [(r["layer_index"], r["layer_type"]) for r in order] == [(i, t) for i in (0, 1) for t in TYPES]
    assert labels == ["a-kernel vs b-kernel (real scales)"]
    assert ppms[("layers.1.mlp.up_proj", labels[0])] == pytest.approx(1e6 * 3 / 512)
    assert sum(v == 0 for v in ppms.values()) == 13


def test_kdepth_series_keep_the_seeds(results: Path) -> None:
    with open_catalog(results) as cat:
        series = figures._kdepth_series(cat.named("kdepth_by_seed", sweep=SWEEP))
    pt = series[("int8", "pair")][("a-kernel", "b-kernel")][("real", 64)]
    assert (pt["d"], pt["e"]) == (2, 2048)
    assert sorted(pt["seeds"]) == [0.0, pytest.approx(1e6 * 2 / 1024)]
    assert series[("int8", "reference")][("a-kernel", "exact")][("real", 64)]["d"] == 0


def test_json_and_markdown_documents(results: Path) -> None:
    with open_catalog(results) as cat:
        doc = render.json_document(cat, SWEEP)
        md = render.markdown_document(cat, SWEEP)
    json.dumps(doc)
    assert set(doc) >= {"certificate", "tables", "figures", "provenance", "generated_at"}
    assert doc["certificate"]["rows"] and all(f["title"] and f["caption"] for f in doc["figures"])
    assert md.startswith(f"# swapcheck report: {SWEEP}") and "## Verdicts per kernel pair" in md
    assert md.index("## Verdicts") < md.index("## Contents")


def test_report_all_json_and_refused_formats(results: Path) -> None:
    from orchestrator.cli.common import DocFormat
    from orchestrator.cli.report import all_

    out = results.parent / "all.json"
    all_(results=str(results), sweep=SWEEP, fmt=DocFormat.json, out_file=out)
    assert json.loads(out.read_text())["figures"]
    res = runner.invoke(app, ["report", "all", "--results", str(results), "--format", "csv"])
    assert res.exit_code == 2


def test_markdown_preface_is_rendered_by_a_library() -> None:
    html = render.markdown_to_html("# Nightly: no regression\n\n| a | b |\n|---|---|\n| `x` | **y** |\n\n<script>x</script>\n")
    assert "<h1>Nightly: no regression</h1>" in html
    assert "<table>" in html and "<code>x</code>" in html and "<strong>y</strong>" in html
    assert "<script>" not in html


def test_page_loads_in_headless_chromium(page: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no `chromium` on PATH, so the page is not loaded in a headless browser; install Debian's "
                    "chromium to run this test (`sudo apt-get install chromium`; .ci/run installs it on CI)")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--window-size=1280,2000"]
    res = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    console = [line for line in res.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    assert "<figcaption>" in res.stdout and "Verdicts per kernel pair" in res.stdout
    shot = page.with_name("shot.png")
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
