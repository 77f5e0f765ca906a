"""The multi-host section ('Across hosts', docs/hosts.md) can be followed by a test (no hosts
needed: this runs in the default suite): every machine's block is marked and uses only
placeholders the test fills, and the parser refuses, naming the block, what it could not
follow. (The README's first two commands are guarded in tests/test_docs.py.)"""

from __future__ import annotations

import re

import pytest

from .readme import PAGE, PATHS, PLACEHOLDERS, ReadmeError, blocks, fill, placeholders
from .test_readme_hosts import CLIENT, MACHINES

TEXT = PAGE.read_text()


def test_every_block_the_hosts_test_runs_is_in_the_section_and_fills_completely() -> None:
    section = blocks(TEXT)
    wanted = {n for names in [*MACHINES.values(), CLIENT[1]] for n in names}
    assert wanted == set(section), f"the page's marked blocks {sorted(section)} are not those run: {sorted(wanted)}"
    values = {**{w: f"<{w.lower()}>" for w in PLACEHOLDERS}, **{p: f"/here{p}" for p in PATHS}}
    for name, body in section.items():
        filled = fill(name, body, values)
        assert not placeholders(filled), (name, filled)
        assert not re.search(r"(?<!/here)/(mnt|var/lib)/sluice", filled), (name, filled)
    assert "--advertise-host <this_host>" in fill("taskmanager", section["taskmanager"], values)


def test_a_marker_without_its_block_and_an_unknown_placeholder_are_refused_by_name() -> None:
    good = "# Sluice\n\n## Across hosts\n\n<!-- hosts:redis -->\n```bash\nredis-server --bind REDIS_HOST &\n```\n"
    assert blocks(good) == {"redis": "redis-server --bind REDIS_HOST &"}
    with pytest.raises(ReadmeError, match="hosts:jm"):
        blocks(good + "\n<!-- hosts:jm -->\nrun this:\n```bash\nsluice jobmanager &\n```\n")
    with pytest.raises(ReadmeError, match=r"two blocks are marked hosts:redis"):
        blocks(good + "\n" + good.split("## Across hosts\n", 1)[1])
    with pytest.raises(ReadmeError, match=r"no '## Across hosts' section"):
        blocks(good.replace("Across hosts", "Many machines"))
    with pytest.raises(ReadmeError, match=r"hosts:taskmanager uses JM_HOST"):
        fill("taskmanager", "sluice taskmanager --advertise-host JM_HOST &", {"THIS_HOST": "x"})
    assert (
        fill(
            "x",
            'echo "$SLUICE_REDIS_URL" THIS_HOST /mnt/sluice/in /mnt/sluicex',
            {"THIS_HOST": "1.2.3.4", "/mnt/sluice": "/s"},
        )
        == 'echo "$SLUICE_REDIS_URL" 1.2.3.4 /s/in /mnt/sluicex'
    )
