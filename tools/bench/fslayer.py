"""What Sluice's file layer (services/dataplane/fs.py) costs on a local disk, against the
direct calls it replaced (os, pathlib, open), operation by operation, on the same files.

    python -m tools.bench.fslayer [--files 2000] [--mb 64] [--repeat 5]

Prints, per operation, the best of ``--repeat`` runs for each side and their ratio
(layer / direct): a ratio, not a verdict, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sluice.services.dataplane import fs

__all__ = ["main", "measure"]


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def measure(home: Path, files: int = 2000, mb: int = 64, repeat: int = 5) -> list[tuple[str, float, float]]:
    """(operation, direct seconds, layer seconds) for each operation, on files made under ``home``."""
    many = home / "many"
    many.mkdir(parents=True)
    for i in range(files):
        (many / f"f{i:05d}.txt").write_bytes(b"x" * (i % 100 + 1))
    big = home / "big.txt"
    line = b"the sluice gate water flow river lock canal basin spark\n"
    big.write_bytes(line * (mb * (1 << 20) // len(line)))
    size = big.stat().st_size
    starts = list(range(0, size - 1, max(1, size // 512)))  # 512 ranged reads of 64 KiB over the file
    small = home / "small"
    small.mkdir()
    payload = b'{"type":"struct","fields":[]}'

    def list_direct() -> object:
        return sorted((p.name, p.stat().st_size) for p in many.iterdir() if p.is_file())

    def list_layer() -> object:
        return [(e.name, e.size) for e in fs.listdir(str(many)) if e.is_file]

    def stat_direct() -> object:
        return [(many / f"f{i:05d}.txt").stat().st_size for i in range(0, files, 4)]

    def stat_layer() -> object:
        return [fs.info(str(many / f"f{i:05d}.txt")) for i in range(0, files, 4)]

    def ranges_direct() -> object:
        with open(big, "rb") as f:
            for s in starts:
                f.seek(s)
                f.read(1 << 16)
        return None

    def ranges_layer() -> object:
        with fs.open_read(str(big)) as f:
            for s in starts:
                f.seek(s)
                f.read(1 << 16)
        return None

    def copy_direct() -> object:  # into a new file each time, as a split's copy is
        (home / "copy").unlink(missing_ok=True)
        with open(big, "rb") as src, open(home / "copy", "wb") as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
        return None

    def copy_layer() -> object:
        (home / "copy").unlink(missing_ok=True)
        with fs.open_read(str(big)) as src, open(home / "copy", "wb") as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
        return None

    def write_direct() -> object:  # replacing the files, as _schema.json and a sink's marker are
        for i in range(200):
            (small / f"s{i}.json").write_bytes(payload)
        return None

    def write_direct_atomic() -> object:  # what the layer does: a hidden temp file, then a rename
        for i in range(200):
            temp = small / f".s{i}.json.tmp"
            temp.write_bytes(payload)
            os.replace(temp, small / f"s{i}.json")
        return None

    def write_layer() -> object:  # atomic: a hidden temp file, then a rename
        for i in range(200):
            fs.write_bytes(str(small / f"s{i}.json"), payload)
        return None

    def move_direct() -> object:
        for i in range(200):
            os.replace(small / f"s{i}.json", small / f"m{i}.json")
            os.replace(small / f"m{i}.json", small / f"s{i}.json")
        return None

    def move_layer() -> object:
        for i in range(200):
            fs.move(str(small / f"s{i}.json"), str(small / f"m{i}.json"))
            fs.move(str(small / f"m{i}.json"), str(small / f"s{i}.json"))
        return None

    pairs = [
        (f"list a directory of {files} files with sizes", list_direct, list_layer),
        (f"stat {files // 4} files", stat_direct, stat_layer),
        (f"512 ranged reads of 64 KiB in a {mb} MiB file", ranges_direct, ranges_layer),
        (f"copy a {mb} MiB file in 8 MiB reads", copy_direct, copy_layer),
        ("write 200 small files (layer: atomic)", write_direct, write_layer),
        ("write 200 small files atomically", write_direct_atomic, write_layer),
        ("400 renames", move_direct, move_layer),
    ]
    write_direct()
    return [(name, _best(direct, repeat), _best(layer, repeat)) for name, direct, layer in pairs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-fs-") as home:
        rows = measure(Path(home), args.files, args.mb, args.repeat)
    print(f"{'operation (file://, best of ' + str(args.repeat) + ')':<52} {'direct':>10} {'layer':>10} {'ratio':>7}")
    for name, direct, layer in rows:
        print(f"{name:<52} {direct * 1e3:>8.2f}ms {layer * 1e3:>8.2f}ms {layer / direct:>6.2f}x")


if __name__ == "__main__":
    main()
