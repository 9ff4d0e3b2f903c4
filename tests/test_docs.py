"""The user docs hold together: every relative link resolves, every file in docs/results is the data
behind some doc (and there are few of them), README stays short, and no doc tells the project's
development history (that is git's)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "docs" / "results"
LINK = re.compile(r"\]\(([^)\s]+)\)")
HISTORY = re.compile(r"\bsessions? \d+\b|\bissues? #?\d+\b", re.IGNORECASE)


def relative_links(doc: pathlib.Path) -> list[pathlib.Path]:
    """The local files a markdown file links to (anchors dropped, web links skipped)."""
    targets = []
    for target in LINK.findall(doc.read_text()):
        path = target.split("#")[0]
        if path and not re.match(r"[a-z]+:", path):
            targets.append((doc.parent / path).resolve())
    return targets


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_relative_link_resolves(doc):
    missing = [str(target.relative_to(ROOT)) for target in relative_links(doc) if not target.exists()]
    assert not missing, f"{doc.name} links to files that do not exist: {missing}"


def test_every_result_file_is_linked_from_a_doc_and_there_are_at_most_40():
    linked = {target for doc in DOCS for target in relative_links(doc)}
    files = [path.resolve() for path in RESULTS.rglob("*") if path.is_file()]
    unlinked = [str(path.relative_to(ROOT)) for path in files
                if path not in linked and path.parent not in linked]  # a linked folder covers its files
    assert not unlinked, f"data no doc links to (git keeps it; delete it here): {unlinked}"
    assert len(files) <= 40


def test_readme_stays_short_and_no_doc_tells_development_history():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    for doc in DOCS:
        found = HISTORY.findall(doc.read_text())
        assert not found, f"{doc.name}: {found}"
