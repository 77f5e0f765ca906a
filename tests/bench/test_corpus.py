"""The word-count benchmark's corpora: deterministic, the asked size, whole lines, and the
Zipf corpus with the many distinct words issue 11's P7 asks for (>= 100,000 at 60 MB)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tools.bench.corpus import write_corpus, zipf


def test_the_zipf_corpus_is_deterministic_and_ends_on_a_whole_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    zipf(a, 1, lexicon=20_000)
    zipf(b, 1, lexicon=20_000)
    data = a.read_bytes()
    assert data == b.read_bytes()
    assert data.endswith(b"\n")
    assert 0.95 * 1024 * 1024 <= len(data) <= 1024 * 1024
    lines = data.splitlines()
    assert all(4 <= len(line.split()) <= 16 for line in lines[:-1])


def test_the_zipf_corpus_follows_zipfs_law_over_many_distinct_words(tmp_path: Path) -> None:
    path = tmp_path / "z.txt"
    zipf(path, 8, lexicon=500_000)
    counts = Counter(path.read_bytes().split())
    ranked = [n for _, n in counts.most_common()]
    assert len(counts) > 100_000  # at 8 MB already; 60 MB holds several times more
    # Zipf with s = 1: frequency ~ 1/rank, so rank x frequency stays about flat at the head
    assert 0.5 < (10 * ranked[9]) / ranked[0] < 2.0
    assert 0.5 < (100 * ranked[99]) / ranked[0] < 2.0


def test_an_unknown_corpus_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown corpus 'prose'; use one of small, zipf, source, stdlib"):
        write_corpus("prose", tmp_path / "x.txt", 1)


def test_the_source_corpus_is_real_python_text_of_the_asked_size_in_whole_lines(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_corpus("source", a, 2)
    write_corpus("source", b, 2)
    data = a.read_bytes()
    assert data == b.read_bytes()  # the same installed packages give the same text
    assert data.endswith(b"\n") and 0.9 * 2 * 1024 * 1024 <= len(data) <= 2 * 1024 * 1024
    assert b"def " in data and b"import " in data


@pytest.mark.slow  # (40 MB read and tokenised: about 10 s)
def test_the_stdlib_corpus_is_utf8_text_of_the_standard_library_with_over_100000_distinct_words(
    tmp_path: Path,
) -> None:
    """Issue 31: real text that ships with the machine, at least 100,000 distinct words by
    the word count's tokenisation (all of it: about 37 MB before it repeats)."""
    from tools.bench.corpus import distinct_words

    path = tmp_path / "s.txt"
    write_corpus("stdlib", path, 40)
    data = path.read_bytes()
    assert data.endswith(b"\n") and b"def " in data
    data.decode("utf-8")
    assert distinct_words(path) > 100_000
