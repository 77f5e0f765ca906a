"""Text corpora for the word-count benchmarks.

* ``small``: lines drawn from a 5,000-word vocabulary (about 5,000 distinct keys): a
  reduce side with little to do.
* ``zipf``: a realistic vocabulary, Zipf's law (exponent ``s``, about 1 in natural text)
  over a lexicon of ``lexicon`` made-up words whose length grows with their rank, as in a
  language (common words are short). At 60 MB it holds a few hundred thousand distinct
  words: a reduce side that counts many keys, as real text (source code, logs, prose) does.

* ``source``: real text nobody here wrote: the Python source files of the installed
  packages (pyspark, pandas, numpy, ...), concatenated in path order up to the size asked
  for, repeated if they hold less. About 150,000 distinct words in 60 MB, identifiers and
  prose of docstrings: the held-out data of issue 31's measurements.

* ``stdlib``: real text that ships with every machine that runs Sluice: the text files of
  this interpreter's standard library (``sysconfig``'s ``stdlib``: the ``.py`` sources,
  the test suite's data, docs; no site-packages, no binaries, only files that are UTF-8),
  in sorted path order, repeated up to the size asked for. About 37 MB of it, 177,000
  distinct words with the word count's tokenisation (``distinct_words`` says how many).

All are deterministic for a seed (``source`` ignores it: the same packages give the same text).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

__all__ = ["CORPORA", "distinct_words", "small_vocabulary", "stdlib_files", "write_corpus", "zipf"]

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"  # in English's order of frequency


def small_vocabulary(path: Path, megabytes: int, seed: int = 1) -> None:
    """Random lines of words from a 5,000-word vocabulary with a skewed frequency."""
    rng = random.Random(seed)
    vocab = [f"w{i}" + "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6))) for i in range(5000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    block = "\n".join(" ".join(rng.choices(vocab, weights, k=rng.randint(3, 15))) for _ in range(20000)) + "\n"
    data = block.encode()
    with path.open("wb") as f:
        for _ in range(max(1, megabytes * 1024 * 1024 // len(data))):
            f.write(data)


def _lexicon(size: int, rng: random.Random) -> list[bytes]:
    """``size`` distinct words; the word of rank r has about 2 + log2(r) / 2 letters."""
    words: list[bytes] = []
    seen: set[bytes] = set()
    weights = [1.0 / (i + 1) ** 0.6 for i in range(len(LETTERS))]
    while len(words) < size:
        rank = len(words) + 1
        n = max(1, int(2 + math.log2(rank) / 2 + rng.gauss(0, 1.2)))
        word = "".join(rng.choices(LETTERS, weights, k=n)).encode()
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def zipf(path: Path, megabytes: int, seed: int = 1, *, lexicon: int = 500_000, s: float = 1.0) -> None:
    """Lines of 4-16 words drawn by Zipf's law over a made-up lexicon (see the module doc)."""
    import numpy as np

    rng = random.Random(seed)
    lex = np.array(_lexicon(lexicon, rng), dtype=object)
    cdf = np.cumsum(1.0 / np.arange(1, lexicon + 1) ** s)
    cdf /= cdf[-1]
    gen = np.random.default_rng(seed)
    target = megabytes * 1024 * 1024
    written = 0
    with path.open("wb") as f:
        while written < target:
            words = lex[np.searchsorted(cdf, gen.random(1_000_000))]
            cuts = np.cumsum(gen.integers(4, 17, size=1_000_000 // 4))
            cuts = cuts[cuts < len(words)]
            lines = [b" ".join(line) for line in np.split(words, cuts)]
            block = b"\n".join(lines) + b"\n"
            if written + len(block) > target:  # the last block: the whole lines that fit
                f.write(block[: block.rfind(b"\n", 0, target - written) + 1])
                break
            f.write(block)
            written += len(block)


def installed_source(path: Path, megabytes: int, seed: int = 1) -> None:
    """The ``.py`` files under this interpreter's site-packages, in sorted path order, up to
    ``megabytes`` (whole files; the last one cut at a line end), again from the start if the
    packages hold less. ``seed`` is unused: real text has none."""
    import sysconfig

    del seed
    root = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    if not files:
        raise ValueError(f"no Python source files under {root}: the 'source' corpus needs installed packages")
    _concatenated(files, path, megabytes)


def stdlib_files() -> list[Path]:
    """The standard library's text files (see the module doc), in sorted path order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    binary = {".pyc", ".so", ".a", ".whl", ".tar", ".gz", ".zip", ".exe", ".dll", ".bz2", ".xz"}
    files = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix in binary or {"site-packages", "dist-packages"} & set(p.parts):
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(p)
    if not files:
        raise ValueError(f"no text files under {root}: the 'stdlib' corpus needs the standard library's sources")
    return files


def _concatenated(files: list[Path], path: Path, megabytes: int) -> None:
    """``files`` one after another (each ending in a newline) up to ``megabytes``, the last
    one cut at a line end, again from the start if they hold less."""
    target, written = megabytes * 1024 * 1024, 0
    with path.open("wb") as out:
        while written < target:
            before = written
            for f in files:
                data = f.read_bytes()
                if not data.endswith(b"\n"):
                    data += b"\n"
                if written + len(data) > target:
                    out.write(data[: data.rfind(b"\n", 0, target - written) + 1])
                    return
                out.write(data)
                written += len(data)
            if written == before:
                return


def stdlib_text(path: Path, megabytes: int, seed: int = 1) -> None:
    """The standard library's text files up to ``megabytes`` (``seed`` unused: real text has none)."""
    del seed
    _concatenated(stdlib_files(), path, megabytes)


def distinct_words(path: Path) -> int:
    """Distinct words of a text file by the word count's tokenisation (lower case, split at
    anything but a-z, 0-9 and the apostrophe)."""
    import re

    split = re.compile(r"[^a-z0-9']+")
    words: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            words.update(split.split(line.lower()))
    words.discard("")
    return len(words)


CORPORA = {"small": small_vocabulary, "zipf": zipf, "source": installed_source, "stdlib": stdlib_text}


def write_corpus(kind: str, path: Path, megabytes: int, seed: int = 1) -> None:
    try:
        make = CORPORA[kind]
    except KeyError:
        raise ValueError(f"unknown corpus {kind!r}; use one of {', '.join(CORPORA)}") from None
    make(path, megabytes, seed)
