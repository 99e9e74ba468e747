"""The user-facing documents (README.md and docs/*.md): every link resolves, and they explain
decisions in words rather than by pointing at internal issue numbers, which a reader cannot open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
# "issue 29", "issues 8 and 29", "issue 38 §2", "§3e": how an internal tracker's items are named.
ISSUE_REFERENCE = re.compile(r"\bissues?\s+#?\d+|§\s*\d", re.I)


def prose(text: str) -> str:
    """The text a reader sees as prose: fenced blocks and inline code removed."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    broken: list[str] = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:: outside the repository
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading {anchor!r} in {linked.name}")
    return broken


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.relative_to(ROOT).as_posix() for p in DOCUMENTS])
def test_every_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.relative_to(ROOT).as_posix() for p in DOCUMENTS])
def test_no_internal_issue_numbers(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for m in ISSUE_REFERENCE.finditer(text)]
    assert found == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation!\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[fine](other.md#a-code-heading-with-punctuation) [self](#page) "
                    "[web](https://example.com/x#y) `[in code](gone.md)`\n\n"
                    "[gone](gone.md) [no anchor](other.md#missing) [no self anchor](#missing)\n")
    assert broken_links(page) == ["gone.md: no such file", "other.md#missing: no heading 'missing' in other.md",
                                  "#missing: no heading 'missing' in page.md"]
    assert [m.group(0) for m in ISSUE_REFERENCE.finditer("as issue 29 §2 asks; issues 8 and 38; --issue-sizes")] == [
        "issue 29", "§2", "issues 8"]
