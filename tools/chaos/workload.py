"""The input text, generated from a seed, and what the job must output, computed apart.

Every one of ``vocabulary`` distinct words appears at least once (so there are at least
that many keys), and ``draws`` more occurrences follow a Zipf law over the same words
(rank r drawn with probability proportional to 1 / r**s): a few keys are very hot, most
are cold, as real text is. Words are letters only, separated by single spaces.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Workload", "generate", "expected", "read_output", "Row"]

Row = tuple[int, int, int]
"""(count, words with that count, sum of their CRC32s): one row of the job's output."""

JOB_FILE = Path(__file__).with_name("job.py")


@dataclass(frozen=True)
class Workload:
    path: Path
    vocabulary: int
    tokens: int
    bytes: int


def _word(i: int) -> str:
    """The i-th word: bijective base 26 over a-z (a, b, ..., z, aa, ab, ...), so all differ."""
    out = []
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out.append(chr(97 + r))
    return "".join(reversed(out))


def generate(
    path: Path, seed: int, *, vocabulary: int = 100_000, draws: int = 300_000, exponent: float = 1.1, per_line: int = 12
) -> Workload:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocabulary + 1, dtype=np.float64)
    weights = 1.0 / ranks**exponent
    hot = rng.choice(vocabulary, size=draws, p=weights / weights.sum())
    # Which word gets which rank is seeded too: the hot words differ from run to run.
    names = np.array([_word(i) for i in rng.permutation(vocabulary)], dtype=object)
    tokens = np.concatenate([np.arange(vocabulary), hot])
    rng.shuffle(tokens)
    words = names[tokens]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for start in range(0, len(words), per_line):
            f.write(" ".join(words[start : start + per_line]) + "\n")
    return Workload(path, vocabulary, len(words), path.stat().st_size)


def expected(path: Path) -> list[Row]:
    """The job's result in plain Python, from the file as written (not from the generator)."""
    counts: Counter[str] = Counter()
    with path.open() as f:
        for line in f:
            counts.update(w for w in line.rstrip("\n").split(" ") if w)
    words: Counter[int] = Counter()
    crcs: Counter[int] = Counter()
    for word, n in counts.items():
        words[n] += 1
        crcs[n] += zlib.crc32(word.encode())
    return sorted((n, words[n], crcs[n]) for n in words)


def read_output(directory: Path) -> list[Row]:
    """The sink as a plain reader sees it: every data file in the directory (names starting
    with ``_`` or ``.`` are markers and staging, which readers skip)."""
    import pyarrow.parquet as pq

    rows: list[Row] = []
    for f in sorted(directory.iterdir()):
        if f.name.startswith(("_", ".")) or not f.is_file():
            continue
        table = pq.read_table(f)
        rows += zip(
            table.column("count").to_pylist(), table.column("words").to_pylist(), table.column("crc").to_pylist()
        )
    return sorted(rows)
