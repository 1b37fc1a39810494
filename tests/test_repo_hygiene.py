"""The repository's reasons stay in the repository: no comment or document cites a file outside it (the fact
sheets once kept beside the checkout) or an issue tracker's number, neither of which a person who clones the
repository can follow. Facts about Google live in docs/google-facts.md, with their public sources, and every
pointer into it (or into docs/multislice-facts.md) must name one of its headings.

Every tracked text file is read (``git ls-files``; uv.lock and binary files aside), so a citation in a
comment, a docstring, a YAML note or a Markdown page is caught alike.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()

# Each pattern starts with a literal and runs on the lower-cased text, so that re's fast literal search
# carries the scan of a few megabytes in well under a second.

#: The words of a citation of a file outside the repository: the fact sheets kept beside it (cited by
#: name or by section sign) and anything reached through the parent directory. Written in pieces so that
#: this checker is not itself a citation.
_SHEET, _SECTION, _BESIDE, _PARENT = (
    "tpu-" + "facts",
    "facts " + "\u00a7",
    "shared/" + "reference",
    "../" + "shared",
)
OUTSIDE_FILE = [re.compile(re.escape(word)) for word in (_SHEET, _SECTION, _BESIDE, _PARENT)]

#: A tracker reference: "issue 12", "issue #12", "PR #3", "pull request 7", "ticket 9", "GH-123" (each a
#: word of its own), ".../issues/123", ".../pull/123".
TRACKER_WORD = [
    re.compile(p)
    for p in (
        r"issues?\s*#?\s*\d+\b",
        r"tickets?\s*#?\s*\d+\b",
        r"prs?\s*#?\s*\d+\b",
        r"pull\s+requests?\s*#?\s*\d+\b",
        r"gh-\d+\b",
    )
]
TRACKER_PATH = [re.compile(p) for p in (r"/issues/\d+", r"/pulls?/\d+", r"/merge_requests/\d+")]
#: ``#N`` in brackets ("(#19)") or right after a project name ("SkyPilot #123", "jax#123",
#: "tensorflow/tpu#877", "before #19"). The name must be at least two letters and end in a letter, so a
#: slice's incarnation key (``us-central1-a/a#1``, ``s1#1``) or an attempt count ("503 #2") is not taken
#: for one. Matched backwards from each ``#N``, which is rare, instead of from every word.
HASH_NUMBER = re.compile(r"#\d+\b")
NAME_BEFORE = re.compile(r"(?:^|[^\w/.-])[a-z][\w.-]*[a-z](?:/[a-z][\w.-]*[a-z])?[ \t]?$")
_WORD_CHAR = re.compile(r"\w")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: Not the project's prose: the lock file (hashes and URLs of every dependency).
SKIPPED = ("uv.lock",)

#: A pointer into one of the fact pages: ``docs/google-facts.md#flex-start`` (the ``docs/`` may be left out
#: inside docs/).
FACTS_POINTER = re.compile(r"(?:docs/)?((?:google|multislice)-facts\.md)#([A-Za-z0-9_-]+)")


def citations(text: str) -> list[tuple[int, str]]:
    """(offset, what) for everything in ``text`` that cites something a reader of the repository cannot
    follow, ``what`` quoting it."""
    low = text.lower()
    if len(low) != len(text):  # a few characters lower-case to two; keep the offsets
        low = text.translate(_ASCII_LOWER)
    spans = [(m.span(), "a file outside the repository") for p in OUTSIDE_FILE for m in p.finditer(low)]
    spans += [
        (m.span(), "a tracker number")
        for p in TRACKER_WORD
        for m in p.finditer(low)
        if m.start() == 0 or not _WORD_CHAR.match(low[m.start() - 1])
    ]
    spans += [(m.span(), "a tracker number") for p in TRACKER_PATH for m in p.finditer(low)]
    for m in HASH_NUMBER.finditer(low):
        before = low[max(0, m.start() - 100) : m.start()]
        name = NAME_BEFORE.search(before)
        taken = any(start < m.end() and m.start() < end for (start, end), _ in spans)
        if not taken and (before.endswith(("(", "[")) or name is not None):
            start = m.start() - 1 if name is None else m.start() - len(before) + name.start()
            spans.append(((start, m.end()), "a tracker number"))
    return sorted((start, f"{kind} ({text[start:end].strip()!r})") for (start, end), kind in spans)


def citation_problems(line: str) -> list[str]:
    return [what for _, what in citations(line)]


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    return {heading_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", markdown, re.MULTILINE)}


def tracked_files() -> list[str]:
    """The repository's tracked files, or, outside a git checkout, every file under it but the usual
    build and cache directories."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30
        ).stdout.decode()
        return [name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        ignored = {".git", ".venv", ".tools", ".mypy_cache", ".ruff_cache", ".pytest_cache", "__pycache__"}
        return [
            p.relative_to(REPO).as_posix()
            for p in REPO.rglob("*")
            if p.is_file() and not ignored.intersection(p.relative_to(REPO).parts)
        ]


def text_files() -> Iterator[tuple[str, str]]:
    """(path, text) of every tracked text file that is the project's own."""
    for name in tracked_files():
        if name in SKIPPED or name == THIS_FILE:
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_no_comment_or_document_cites_what_a_clone_cannot_follow() -> None:
    found: list[str] = []
    for name, text in text_files():
        for offset, what in citations(text):
            start = text.rfind("\n", 0, offset) + 1
            end = text.find("\n", offset)
            line = text[start : len(text) if end < 0 else end]
            found.append(f"{name}:{text.count(chr(10), 0, offset) + 1}: cites {what}: {line.strip()[:120]}")
    assert not found, "point at docs/ (or at code) instead:\n" + "\n".join(found)


def test_every_pointer_into_the_fact_pages_names_one_of_their_headings() -> None:
    anchors = {
        page: anchors_of((REPO / "docs" / page).read_text(encoding="utf-8"))
        for page in ("google-facts.md", "multislice-facts.md")
    }
    dangling = [
        f"{name}:{number}: {m.group(0)}"
        for name, text in text_files()
        if "-facts.md#" in text
        for number, line in enumerate(text.splitlines(), 1)
        for m in FACTS_POINTER.finditer(line)
        if m.group(2).lower() not in anchors[m.group(1)]
    ]
    own = (REPO / "docs" / "google-facts.md").read_text(encoding="utf-8")
    dangling += [
        f"docs/google-facts.md: (#{m.group(1)})"
        for m in re.finditer(r"\]\(#([A-Za-z0-9_-]+)\)", own)
        if m.group(1) not in anchors["google-facts.md"]
    ]
    assert not dangling, "no such heading:\n" + "\n".join(dangling)


@pytest.mark.parametrize(
    "line",
    [
        f"# the host facts (ce-{_SHEET} \u00a71.1)",
        f'"""Flex-start waits ({_SECTION}1.4)."""',
        f"# Source: {_PARENT}/reference/{_SHEET}.md \u00a73",
        f"Sources: ``{_BESIDE}/ce-{_SHEET}.md``",
        "# what Google answers (issue 16, Google's answer)",
        '"""Issue 17\'s acceptance on the simulator"""',
        "(issue #19; JAX's BaseTpuCluster reads them)",
        "fixed in PR #3",
        "see pull request 42",
        "SkyPilot users reported it (SkyPilot #1234)",
        "as jax#123 shows",
        'be "2.4".", tensorflow/tpu#877). That v2',
        "placed single-host multislices before #19",
        "the fix (#19) moved it",
        "https://github.com/skypilot-org/skypilot/issues/4579",
        "https://github.com/o/r/pull/7297",
        "tracked as GH-123",
    ],
)
def test_a_citation_that_a_clone_cannot_follow_is_found(line: str) -> None:
    assert citation_problems(line)


@pytest.mark.parametrize(
    "line",
    [
        '    line = groups(rep)["us-central1-a/a#1"]',
        '    assert (row["key"], row["name"]) == (f"{ZONE}/a-r1#1", "a-r1")',
        '        "slice,us-central1-a/s1#1,us-central1-a,s1,1,v5litepod-8,8,on-demand,DELETED,,"',
        '    with pytest.raises(TransientError, match="503 #2"):',
        "    x = compute(y)  # noqa: E501",
        "## 3. When one slice is lost",
        "#: The CE TPU image's default boot disk is 10 GB (docs/google-facts.md#images).",
        "(docs/multislice-facts.md, section 3)",
        "https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange",
        "color: #ff0000; background: #123",
        "a v5litepod-8 or tpu7x-8 slice, 2 issues with 3 hosts",
        "# 1 chip: 1,1,1; 4 chips: 2,2,1",
    ],
)
def test_an_ordinary_line_is_not_taken_for_a_citation(line: str) -> None:
    assert citation_problems(line) == []


def test_a_heading_anchor_is_githubs() -> None:
    assert heading_anchor("Compute Engine quotas") == "compute-engine-quotas"
    assert heading_anchor("3. When one slice is lost") == "3-when-one-slice-is-lost"
    assert heading_anchor("Flex-start") == "flex-start"
    assert anchors_of("# Title\n\ntext\n## TPU API nodes\n### Images ##\n") == {
        "title",
        "tpu-api-nodes",
        "images",
    }


def test_no_two_test_modules_share_a_name() -> None:
    """The test directories are not packages: pytest imports each test module by its file name, and a
    second module of the same name elsewhere fails the whole run's collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            seen.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
