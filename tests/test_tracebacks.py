"""Short tracebacks (sluice.errors_display) on real ones: errors raised in a job file loaded
the way TaskManagers load job code, through Sluice, PySpark and the standard library."""

from __future__ import annotations

import functools
import itertools
import json
import traceback
from pathlib import Path
from types import ModuleType

import pytest

from sluice.errors_display import internal_roots, is_internal, short_traceback
from sluice.services.taskmanager.library import load_module

HINT = "sluice status j1 --json"
JOB = """import json

from pyspark.sql.types import StructType


def parse(text):
    return json.loads(text)


def settings(text):
    try:
        return parse(text)
    except ValueError as exc:
        raise RuntimeError("the settings are not JSON") from exc


def schema():
    return StructType.fromJson({"type": "struct"})


def hook(obj):
    return deep(3)


def deep(n):
    return deep(n - 1) if n else boom()


def boom():
    raise ValueError("bad input row 42")
"""

_names = itertools.count()


def job_module(tmp_path: Path, source: str = JOB) -> ModuleType:
    path = tmp_path / "lib" / "abc123" / "sluice_job_abc123.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return load_module(path, f"sluice_job_test_{next(_names)}")


def raised(call, *args) -> str:
    """The traceback text the worker records (describe_error) for what ``call`` raises
    when Sluice calls it, without this test's own frame."""
    from sluice.services.taskmanager.worker import describe_error

    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 (any error is what is being displayed)
        assert exc.__traceback__ is not None
        return describe_error(exc.with_traceback(exc.__traceback__.tb_next))
    raise AssertionError(f"{call} did not raise")


def user_frames(text: str) -> list[str]:
    return [
        line.split(", in ")[-1]
        for line in text.splitlines()
        if line.startswith('  File "') and "sluice_job_abc123.py" in line
    ]


def test_a_user_error_under_sluice_and_the_standard_library_shows_the_users_frames_and_the_exception(
    tmp_path: Path,
) -> None:
    from sluice.services.embedded.spark_connect import _listens

    module = job_module(tmp_path)
    # Sluice's code (a wait's check, called before the first try) calls json.loads, which
    # calls the user's hook, which raises.
    full = "task lines -> out[0] failed after 2 restarts: " + raised(
        _listens, "127.0.0.1", 1, 1.0, 0.1, functools.partial(json.loads, '{"a": 1}', object_hook=module.hook)
    )
    frames = sum(line.startswith('  File "') for line in full.splitlines())
    short = short_traceback(full, hint=HINT)
    lines = short.splitlines()
    assert lines[0] == "task lines -> out[0] failed after 2 restarts: Traceback (most recent call last):"
    assert user_frames(short) == ["hook", "deep", "deep", "deep", "boom"] == user_frames(full)
    assert "    return deep(n - 1) if n else boom()" in lines and '    raise ValueError("bad input row 42")' in lines
    assert "  [Previous line repeated 1 more time]" in lines  # Python's count of the fourth deep()
    assert frames - 5 >= 4  # _listens, and json's loads, decode, raw_decode
    assert lines[-2:] == [
        "ValueError: bad input row 42",
        f"({frames - 5} internal frames of Sluice, Spark and Python hidden; the full traceback: {HINT})",
    ]
    assert "embedded/spark_connect.py" in full and "embedded/spark_connect.py" not in short and "json/" not in short


def test_pyspark_frames_are_hidden(tmp_path: Path) -> None:
    module = job_module(tmp_path)
    full = raised(module.schema)
    assert "pyspark" in full
    short = short_traceback(full, hint=HINT)
    assert "site-packages" in full and "site-packages" not in short
    assert user_frames(short) == ["schema"]
    assert short.splitlines()[-2] == "KeyError: 'fields'"
    assert short.splitlines()[-1].startswith("(") and "internal frame" in short.splitlines()[-1]


def test_each_exception_of_a_chain_keeps_its_user_frames(tmp_path: Path) -> None:
    module = job_module(tmp_path)
    full = raised(module.settings, "{not json")
    short = short_traceback(full, hint=HINT)
    assert "json/decoder.py" in full and "json/" not in short.replace("json.loads", "")
    assert user_frames(short) == ["settings", "parse", "settings"]
    assert "The above exception was the direct cause of the following exception:" in short
    assert "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes" in short
    assert short.splitlines()[-2] == "RuntimeError: the settings are not JSON"


def test_an_error_at_import_shows_the_job_files_line(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError) as info:
        job_module(tmp_path, "x = 1\ny = x / 0\n")
    full = "".join(traceback.format_exception(info.value))
    short = short_traceback(full, roots=internal_roots())
    assert "library.py" in full and "<frozen" in full
    assert user_frames(short) == ["<module>"] and "    y = x / 0" in short
    assert short.splitlines()[-1].endswith("hidden)")  # no hint given: no "full traceback" clause
    assert "Traceback (most recent call last):" in short  # this test's own frame is the user's too


def test_an_error_with_no_user_frame_keeps_the_innermost_frame() -> None:
    text = raised(Path("/nonexistent/dir/x").read_text)
    short = short_traceback(text, hint=HINT)
    frames = [line for line in short.splitlines() if line.startswith('  File "')]
    assert len(frames) == 1 and "pathlib.py" in frames[0]
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/dir/x'" in short


@pytest.mark.parametrize(
    "text",
    ["vertex out failed (no restart): no slot within 120 s", "", "Traceback (most recent call last):\nValueError: x"],
)
def test_text_without_internal_frames_comes_back_unchanged(text: str) -> None:
    assert short_traceback(text, hint=HINT) == text


def test_what_counts_as_internal() -> None:
    roots = internal_roots()
    sluice_file = str(Path(roots[0]) / "x.py")
    for internal in (
        sluice_file,
        "<frozen runpy>",
        "/usr/lib/python3.11/json/decoder.py",
        "/venv/lib/python3.11/site-packages/pyspark/sql/types.py",
        "/opt/spark/python/lib/pyspark.zip/pyspark/worker.py",
        "/opt/spark/python/lib/py4j-0.10.9.7-src.zip/py4j/protocol.py",
    ):
        assert is_internal(internal, roots), internal
    for user in (
        "/home/ann/jobs/etl.py",
        "/home/ann/.sluice/library/ab12/sluice_job_ab12.py",
        roots[0] + "-mine/job.py",
        "<string>",
    ):
        assert not is_internal(user, roots), user
