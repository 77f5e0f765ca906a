"""The multi-host page's 'Across hosts' section (``docs/hosts.md``, which the README links
to) as commands: its marked blocks (``<!-- hosts:NAME -->`` before a ```` ```bash ````
fence), and those commands with the placeholders filled in.

A block uses placeholders (``REDIS_HOST``, ``STORAGE_HOST``, ``THIS_HOST``,
``YOUR_TEXT_FILES``) and two paths a machine has (``/mnt/sluice``, the shared mount, and
``/var/lib/sluice``, the machine's own data); ``fill`` replaces each with what stands for it
here, and refuses a block with a placeholder it has no value for, so a page that grows a
new one fails loudly instead of running a command with a literal ``NEW_HOST`` in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "README",
    "PAGE",
    "SECTION",
    "PLACEHOLDERS",
    "PATHS",
    "ReadmeError",
    "section",
    "blocks",
    "placeholders",
    "fill",
]

README = Path(__file__).resolve().parents[2] / "README.md"
PAGE = README.parent / "docs" / "hosts.md"
"""The page that holds the section (the README links to it by the section's name)."""
_WHERE = "docs/hosts.md"
SECTION = "## Across hosts"
PLACEHOLDERS = ("REDIS_HOST", "STORAGE_HOST", "THIS_HOST", "YOUR_TEXT_FILES")
PATHS = ("/mnt/sluice", "/var/lib/sluice")

_MARK = re.compile(r"<!-- hosts:([a-z]+) -->")
_BLOCK = re.compile(r"<!-- hosts:([a-z]+) -->\n```bash\n(.*?)\n```\n", re.S)
_WORD = re.compile(r"(?<![\w$])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
"""An upper-case word with an underscore not read as a shell variable: a placeholder, or the
name of a variable being set (``export SLUICE_HOME=...``)."""


class ReadmeError(AssertionError):
    """The multi-host section is not what the test can follow (which block, and why)."""


def section(text: str) -> str:
    """The section from its heading to the next ``## `` heading."""
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        raise ReadmeError(f"{_WHERE} has no {SECTION!r} section (error messages point at it: keep its name)")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def blocks(text: str) -> dict[str, str]:
    """Block name -> its commands, from the page's text (the whole file)."""
    part = section(text)
    found = _BLOCK.findall(part)
    marks = _MARK.findall(part)
    if len(found) != len(marks):
        bare = sorted(set(marks) - {name for name, _ in found}) or marks
        raise ReadmeError(
            f"{_WHERE} {SECTION!r}: a marker <!-- hosts:NAME --> must be followed, on the next line, "
            f"by a ```bash block; not so for {', '.join(f'hosts:{m}' for m in bare)}"
        )
    out: dict[str, str] = {}
    for name, body in found:
        if name in out:
            raise ReadmeError(
                f"{_WHERE} {SECTION!r}: two blocks are marked hosts:{name}; give each machine's its own name"
            )
        out[name] = body
    return out


def placeholders(block: str) -> set[str]:
    """The placeholders ``block`` uses: its upper-case words that are not Sluice's variables."""
    return {w for w in _WORD.findall(block) if not w.startswith("SLUICE_")}


def fill(name: str, block: str, values: Mapping[str, str]) -> str:
    """``block`` with every placeholder and path of ``values`` replaced; ReadmeError naming the
    block when it uses a placeholder ``values`` has none for."""
    missing = sorted(placeholders(block) - set(values))
    if missing:
        raise ReadmeError(
            f"{_WHERE} block hosts:{name} uses {', '.join(missing)}, which the test cannot fill: "
            f"use one of {', '.join(PLACEHOLDERS)}, or teach tests/hosts/readme.py the new one"
        )
    out = block
    for path in PATHS:
        if path in values:
            out = re.sub(rf"{re.escape(path)}(?![\w-])", lambda _m, v=values[path]: v, out)
    for word in PLACEHOLDERS:
        if word in values:
            out = re.sub(rf"(?<![\w$]){word}\b", lambda _m, v=values[word]: v, out)
    return out
