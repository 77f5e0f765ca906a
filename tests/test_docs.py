"""The README stays a map and the docs stay whole: the README is about 200 lines (at most
250), its first two commands are the two a new user runs from a fresh clone (a tool runs
them as written), it answers a newcomer's three questions with a link each, and every
relative link of the README and of docs/ leads to a file that exists (and, with an
anchor, to a heading of that file). The site itself is built with `mkdocs build --strict`
by .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code, where a link is only text."""
    return _CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    """The relative targets of ``text``'s Markdown links (no scheme, no bare anchor)."""
    return [t for t in _LINK.findall(prose(text)) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc make it for plain headings."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return re.sub(r" +", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_FENCE.sub("", path.read_text()))}


def test_the_readme_is_a_map_of_about_200_lines() -> None:
    """About 200 lines of map, besides the settings table (one row a setting: issue 33 asks for
    every setting in the README, each tested through a flag, a variable and the file)."""
    text = README.read_text()
    table = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = sum(1 for line in table.splitlines() if line.startswith("| `"))
    lines = text.count("\n") - rows
    assert lines <= 230, (
        f"README.md has {lines} lines besides its settings table: it is the map; move the detail to a page of docs/"
    )


def test_the_first_two_commands_stay_as_they_are() -> None:
    fences = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    assert fences[:2] == [
        "scripts/setup && .venv/bin/sluice run examples/wordcount.py",
        "scripts/setup && .venv/bin/python -m pytest",
    ]
    first = _FENCE.findall(README.read_text())[:2]
    assert all(f.startswith("```bash\n") for f in first), "no other block may come before the two commands"


def test_a_newcomer_finds_state_changes_keys_and_inboxes_one_link_away() -> None:
    targets = links(README.read_text())
    for where in (
        "services/jobs/machine.py",
        "services/jobs/state.py",
        "services/jobs/core.py",
        "store/keys.py",
        "services/jobmanager/",
    ):
        assert any(t.startswith(where) for t in targets), f"the README does not link {where}"


def test_the_sections_error_messages_name_are_in_the_readme() -> None:
    text = README.read_text()
    for name in ("Across hosts", "Storage on S3"):
        assert f"[{name}](docs/" in text, f"error messages send users to README {name!r}: keep a link of that name"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_a_heading(path: Path) -> None:
    broken = []
    for target in links(path.read_text()):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(ROOT)} links to: {', '.join(broken)}"


def test_every_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert PAGES and all(f": {p.name}\n" in nav for p in PAGES), "a page of docs/ is missing from mkdocs.yml's nav"
