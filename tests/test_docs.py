"""The README and the pages under ``docs/`` hold together: every relative link reaches a file, every ``#anchor`` a
heading of its page, the README stays an entry page, and no page cites issue numbers (the docs describe the project
as it is; history is in ``CHANGELOG.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").glob("*.md")])
IDS = [p.relative_to(REPO).as_posix() for p in PAGES]
README_MAX_LINES = 150
# targets written beside the chart; a link to them is checked once they exist
WRITTEN_ELSEWHERE = {"charts/gpu-tailor/README.md"}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
ISSUE = re.compile(r"issue [0-9]|#[0-9]{2}", re.I)


def prose(text: str) -> str:
    """The page without its fenced code blocks, where a ``[x](y)`` or a ``#`` is not markdown."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces made dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(text).splitlines():
        m = re.match(r"#{1,6} (.+)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    return [t for t in LINK.findall(prose(text)) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            if rel not in WRITTEN_ELSEWHERE:
                broken.append(f"{target}: no {rel}")
            continue
        if anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {rel}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_issue_numbers(page: Path) -> None:
    found = [line for line in page.read_text().splitlines() if ISSUE.search(line)]
    assert not found, found


def test_the_readme_is_an_entry_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    # CI runs the README's test command; a newcomer's two commands open the page
    head = "\n".join(lines[:16])
    assert "gpu-tailor simulate" in head and "bash scripts/test.sh" in head


@pytest.mark.parametrize(("heading", "anchor"), [
    ("## The webhook's `--config`", "the-webhooks---config"),
    ("### What failurePolicy Fail costs", "what-failurepolicy-fail-costs"),
    ("## The taint: one scheduler per GPU node", "the-taint-one-scheduler-per-gpu-node"),
    ("### The `tailor` policy", "the-tailor-policy"),
], ids=["quote-and-code", "plain", "colon", "code"])
def test_slug_matches_githubs_anchors(heading: str, anchor: str) -> None:
    assert anchors(heading) == {anchor}


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](#nowhere) [file](missing.md)\n")
    assert links(page.read_text()) == ["#title", "#nowhere", "missing.md"]
    assert "nowhere" not in anchors(page.read_text())
    assert not (tmp_path / "missing.md").exists()
