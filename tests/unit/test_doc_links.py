"""Every relative link in README.md and docs/*.md reaches an existing file and, for ``#anchor``, a heading of it.

Anchors are GitHub's: a heading's text, lower-cased, without punctuation but ``-`` and ``_``, spaces as ``-``,
and ``-1``, ``-2`` ... for the second, third heading of the same text. Code blocks hold no links and no headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def without_code(text: str) -> str:
    """``text`` with its fenced blocks blanked (line numbers kept) and inline code spans as a plain word."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: "code" + "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``: its headings' slugs, numbered as GitHub numbers repeated ones."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(f"{base}-{count}" if count else base)
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: target: why`` for each relative link of ``path`` that does not resolve (paths shown
    relative to ``root``)."""
    text = without_code(path.read_text())
    problems = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if EXTERNAL.match(target):
            continue
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}: {target}"
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading with this anchor in {linked.relative_to(root)}")
    return problems


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("§4 GCE rules (DESIGN.md section 4)", "4-gce-rules-designmd-section-4"),
        ("`reaper evaluate`: what would a phase do to my fleet?", "reaper-evaluate-what-would-a-phase-do-to-my-fleet"),
        (
            "On separate workers: the CeleryExecutor and the KubernetesExecutor",
            "on-separate-workers-the-celeryexecutor-and-the-kubernetesexecutor",
        ),
        ("The audit view (`bench/audit.py`)", "the-audit-view-benchauditpy"),
        ("reaper_gce_enforcement: 100,000 instances", "reaper_gce_enforcement-100000-instances"),
        ("Deploying, in short", "deploying-in-short"),
    ],
)
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_missing_file_a_missing_anchor_and_a_repeated_heading_are_told_apart(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Somewhere\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Part\n\n## Part\n\n"
        "[ok](#part-1) [gone](#part-2) [file](nowhere.md) [there](other.md#somewhere) [deep](other.md#nowhere)\n"
        "```sh\n[in a code block](nowhere-either.md)\n```\n`[in code](nowhere-too.md)` [web](https://example.com/x)\n"
    )
    problems = broken_links(page, tmp_path)
    assert problems == [
        "page.md:7: #part-2: no heading with this anchor in page.md",
        "page.md:7: nowhere.md: no such file",
        "page.md:7: other.md#nowhere: no heading with this anchor in other.md",
    ]
