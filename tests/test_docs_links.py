"""The docs stand on their own: no page of docs/ or README.md points at a repository file that is missing.

What is checked, on README.md and every ``docs/**/*.md`` (fenced code blocks left out):

* **Markdown links** ``[text](target)``, images and reference definitions ``[id]: target``: the
  target, without its ``#anchor``, must exist relative to the page's folder (``/target`` from the
  repository root). ``http(s)://``, ``mailto:`` and anchor-only links are not followed.
* **Backticked paths** (outside links) that name a repository file: a token such as
  ``tasks/kernels/int8.py`` whose first part is a top-level entry of the repository, or a folder
  beside the page (``reference/numerics.md`` from docs/), must exist relative to the repository root
  or the page. Paths that ``.gitignore`` covers (``results/...``: made by a run) are outputs, not
  files of the repository, and are left alone, as are paths whose folder is not in the repository
  (an upstream project's tree cited by a reference page, such as vLLM's ``tests/kernels/...``).
* **Backticked Markdown paths** (``something/page.md``) must exist wherever their first part is,
  unless they sit under an upstream source tree named in :data:`UPSTREAM_ROOTS`: a ``.md`` path is a
  citation of a page, the kind of reference this test exists for.

Bare file names without a folder (``report.md``) are not checked: they name outputs as often as files.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

#: Upstream source trees the reference pages cite by path (vLLM's ``csrc/``, its ``vllm/`` package,
#: CUTLASS's ``include/``): not files of this repository.
UPSTREAM_ROOTS = frozenset({"csrc", "vllm", "include"})

_FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_PATH = re.compile(r"(?:\.{1,2}/)*[\w.-]+(?:/[\w.-]+)*/?")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.I)


@dataclass(frozen=True)
class Broken:
    page: str
    line: int
    kind: str  # "link" or "path"
    target: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.kind} {self.target!r} names no file of the repository"


def _pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _ignore_patterns(root: Path) -> list[str]:
    path = root / ".gitignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (relative to the root) or a folder above it matches a .gitignore pattern
    (the subset of the syntax .gitignore uses here: globs, a leading or inner ``/`` anchors, a
    trailing ``/`` means a folder)."""
    parts = rel.strip("/").split("/")
    for pattern in patterns:
        folder_only = pattern.endswith("/")
        body = pattern.strip("/")
        anchored = pattern.startswith("/") or "/" in body
        for i in range(len(parts)):
            if folder_only and i == len(parts) - 1 and "." in parts[i]:
                continue  # a folder pattern names a folder, not a file (`results/` is not `x/results.md`)
            here = "/".join(parts[: i + 1])
            if fnmatch.fnmatchcase(here, body) if anchored else fnmatch.fnmatchcase(parts[i], body):
                return True
    return False


def _blank(match: re.Match[str]) -> str:
    """Keep line numbers: replace a match by as many newlines as it spans."""
    return "\n" * match.group(0).count("\n")


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def broken_references(root: Path) -> list[Broken]:
    """Every link and backticked path of README.md and docs/ that names a missing repository file."""
    top = {entry.name for entry in root.iterdir()}
    patterns = _ignore_patterns(root)
    found: list[Broken] = []
    for page in _pages(root):
        rel_page = page.relative_to(root).as_posix()
        text = _FENCE.sub(_blank, page.read_text(encoding="utf-8"))
        prose = _CODE.sub(lambda m: " " * len(m.group(0)), text)  # links inside code are code

        targets = [(m.start(), m.group(1)) for m in _LINK.finditer(prose)]
        targets += [(m.start(), m.group(1)) for m in _DEFINITION.finditer(prose)]
        for pos, target in targets:
            if _EXTERNAL.match(target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            where = root / path.lstrip("/") if path.startswith("/") else page.parent / path
            if not where.exists():
                found.append(Broken(rel_page, _line(prose, pos), "link", target))

        link_spans = [m.span() for m in _LINK.finditer(text)]
        for m in _CODE.finditer(text):
            token = m.group(2).strip()
            if any(a <= m.start() < b for a, b in link_spans) or not _PATH.fullmatch(token) or "/" not in token.rstrip("/"):
                continue
            first = token.split("/")[0]
            beside = page.parent / first
            if first in (".", ".."):
                candidates = [page.parent / token]
            elif first in top or beside.exists():
                candidates = [root / token, page.parent / token]
            elif token.endswith(".md") and first not in UPSTREAM_ROOTS:
                candidates = [root / token, page.parent / token]
            else:
                continue  # not a path of this repository (a module, an upstream file, a URL part)
            if any(c.exists() for c in candidates):
                continue
            rel = [r for r in (Path(os.path.relpath(os.path.normpath(c), root)).as_posix() for c in candidates)
                   if not r.startswith("../")]
            if any(_ignored(r + ("/" if token.endswith("/") else ""), patterns) for r in rel):
                continue  # an output of a run (.gitignore'd), not a file of the repository
            if not token.endswith(".md") and not any(c.parent.is_dir() for c in candidates):
                continue  # a folder the repository does not have: an upstream tree's path
            found.append(Broken(rel_page, _line(text, m.start()), "path", token))
    return found


def test_no_page_names_a_missing_file() -> None:
    broken = broken_references(REPO)
    assert broken == [], "\n".join(map(str, broken))


def test_the_reference_pages_exist_and_are_linked() -> None:
    """The facts the docs cite live in docs/reference/, and the pages reach them by links."""
    reference = REPO / "docs" / "reference"
    for name in ("design.md", "vllm-kernels.md", "numerics.md"):
        assert (reference / name).is_file(), name
    cited = "\n".join(page.read_text() for page in _pages(REPO) if reference not in page.parents)
    for name in ("vllm-kernels.md", "numerics.md", "design.md"):
        assert f"(reference/{name})" in cited or f"(docs/reference/{name})" in cited, name
    # the sources the issue found cited but absent: every citation goes through docs/reference/ now
    assert not re.search(r"(?<![\w/])DESIGN\.md", cited)
    assert not re.search(r"(?<![\w/\[(])reference/(?:vllm-kernels|numerics)\.md(?!\])", cited)


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    """README.md, .gitignore and docs/ copied into a tmp dir; the other top-level entries linked."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ("README.md", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for entry in REPO.iterdir():
        if not (root / entry.name).exists() and entry.name not in {".git", ".venv", "results", "build"}:
            (root / entry.name).symlink_to(entry)
    assert broken_references(root) == []  # the copy is as clean as the repository
    return root


def _plant(root: Path, page: str, text: str) -> int:
    path = root / page
    lines = path.read_text().splitlines()
    lines.insert(3, text)
    path.write_text("\n".join(lines) + "\n")
    return 4


@pytest.mark.parametrize("planted,kind,target", [
    ("See [the design](DESIGN.md).", "link", "DESIGN.md"),
    ("See [numerics](reference/numerics.md#2-decoding) and [x](../docs/nope.md).", "link", "../docs/nope.md"),
    ("![a figure](figures/missing.png)", "link", "figures/missing.png"),
    ("[ref]: reference/gone.md", "link", "reference/gone.md"),
    ("Facts in `reference/vllm-kernels-old.md` §2.", "path", "reference/vllm-kernels-old.md"),
    ("The kernel lives in `tasks/kernels/int8_old.py`.", "path", "tasks/kernels/int8_old.py"),
    ("A design card, `shared/DESIGN.md`.", "path", "shared/DESIGN.md"),
])
def test_a_planted_broken_reference_is_found(copy: Path, planted: str, kind: str, target: str) -> None:
    line = _plant(copy, "docs/kernels.md", planted)
    assert Broken("docs/kernels.md", line, kind, target) in broken_references(copy)


@pytest.mark.parametrize("planted", [
    "An [anchor](#the-int8-accumulator-on-every-cpu), a [site](https://duckdb.org/docs/), <https://x.org/a.md>.",
    "Outputs: `results/demo-report.html`, `benchmarks/results/`; modules: `tasks.kernels.int8`.",
    "Upstream: `csrc/quantization/cutlass_w8a8/Epilogues.md`, `vllm/envs.py`, vLLM's `tests/kernels/x/test_y.py`.",
    "In code: `[x](missing.md)`; a bare `report.md`; a glob `storage/queries/*.sql`.",
    "```sh\ncat docs/missing.md  # [x](gone.md)\n```",
])
def test_what_is_not_a_repository_file_is_left_alone(copy: Path, planted: str) -> None:
    _plant(copy, "docs/kernels.md", planted)
    assert broken_references(copy) == []
