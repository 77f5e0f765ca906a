"""The one settings object (sluice/config.py): every setting of the README's table set
through its flag, its SLUICE_* variable and the settings file; flag > variable > file >
default; each kind of bad value refused with a message that names the setting (as flag,
variable and file key), the value and what is allowed; `sluice config show`, secrets
redacted. Fast: the settings object and click's parser, no Redis, no Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from sluice.cli.main import _register, cli
from sluice.cli.options import flags_of
from sluice.config import Settings, load, resolve, specs
from sluice.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SPECS = specs()
_register()

# A value other than the default for each setting: (as written on the command line and in a
# variable, as written in the TOML file, as the settings object holds it).
SAMPLES: dict[str, tuple[str, str, Any]] = {
    "redis_url": ("redis://db.example.com:6380/0", '"redis://db.example.com:6380/0"', "redis://db.example.com:6380/0"),
    "redis_password": ("hunter2", '"hunter2"', "hunter2"),
    "rq_redis_url": ("rediss://queues:6379", '"rediss://queues:6379"', "rediss://queues:6379"),
    "redis_wait_replicas": ("1", "1", 1),
    "redis_wait_timeout_ms": ("250", "250", 250),
    "prefix": ("blue", '"blue"', "blue"),
    "home": ("/srv/sluice", '"/srv/sluice"', Path("/srv/sluice")),
    "heartbeat_interval_ms": ("250", "250", 250),
    "heartbeat_timeout_ms": ("9000", "9000", 9000),
    "lease_ttl_ms": ("4500", "4500", 4500),
    "log_level": ("debug", '"DEBUG"', "DEBUG"),
    "log_json": ("", "true", True),
    "host": ("node3.example.com", '"node3.example.com"', "node3.example.com"),
    "spark_master": ("local[4]", '"local[4]"', "local[4]"),
    "spark_connect_host": ("0.0.0.0", '"0.0.0.0"', "0.0.0.0"),
    "spark_log_level": ("info", '"INFO"', "INFO"),
    "spark_cds": ("off", '"off"', "off"),
    "s3_endpoint": ("http://127.0.0.1:8333", '"http://127.0.0.1:8333"', "http://127.0.0.1:8333"),
    "redis_appendfsync": ("always", '"always"', "always"),
    "spark_servers": ("per-taskmanager", '"per-taskmanager"', "per-taskmanager"),
    "storage_root": ("file:///shared/storage", '"file:///shared/storage"', "file:///shared/storage"),
    "slot_timeout_s": ("45", "45", 45),
    "checkpoint_interval_ms": ("700", "700", 700),
    "deploy_timeout_s": ("90", "90", 90),
    "speculation": ("2,30000", '"2,30000"', "2,30000"),
    "snapshot_interval_ms": ("1500", "1500", 1500),
    "fact_retention": ("30d", '"30d"', "30d"),
    "inbox_retention_ms": ("0", "0", 0),
    "metrics_host": ("127.0.0.1", '"127.0.0.1"', "127.0.0.1"),
    "jobmanager_metrics_port": ("9101", "9101", 9101),
    "taskmanager_metrics_port": ("9102", "9102", 9102),
    "projector_metrics_port": ("9103", "9103", 9103),
    "advertise_host": ("node7.example.com", '"node7.example.com"', "node7.example.com"),
    "spark_remote": ("sc://spark.example.com:15002", '"sc://spark.example.com:15002"', "sc://spark.example.com:15002"),
    "io_rate": ("1048576", "1048576", 1048576.0),
    "task_partitions": ("3", "3", 3),
    "spark_cores": ("8", "8", 8),
    "spark_slots": ("4", "4", 4),
    "worker_redis_wait_s": ("120", "120", 120.0),
    "ui_host": ("0.0.0.0", '"0.0.0.0"', "0.0.0.0"),
    "ui_port": ("9999", "9999", 9999),
    "ui_token": ("s3cret-token", '"s3cret-token"', "s3cret-token"),
}

# One bad value of each kind: (setting, as given, what the message must say is allowed).
BAD = [
    ("heartbeat_interval_ms", "soon", "give a whole number of milliseconds above 0"),
    ("lease_ttl_ms", "0", "give a whole number of milliseconds above 0"),
    ("slot_timeout_s", "-5", "give a whole number of seconds above 0"),
    ("inbox_retention_ms", "-1", "give a whole number of milliseconds, 0 or more"),
    ("io_rate", "fast", "give a number of bytes a second, 0 or more"),
    ("speculation", "0.5,100", "give 'off' (the default), 'on'"),
    ("jobmanager_metrics_port", "70000", "give a port number from 0 to 65535"),
    ("log_json", "maybe", "give true or false"),
    ("log_level", "LOUD", "give one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("spark_log_level", "LOUD", "give a log4j level: one of OFF, FATAL, ERROR, WARN"),
    ("redis_appendfsync", "no", "give everysec or always"),
    ("spark_servers", "many", "give shared or per-taskmanager"),
    ("redis_url", "http://db:6379", "is not a Redis URL: give a redis://, rediss:// (TLS) or unix:// URL"),
    ("rq_redis_url", "db:6379", "is not a Redis URL"),
    ("prefix", "two words", "is not a usable key prefix: give 1-64 letters, digits, '_', '.' or '-'"),
    ("ui_host", "not an address", "is not a host name or address"),
    ("spark_connect_host", "two words", "is not a host name or address"),
    ("advertise_host", "0.0.0.0", "is where a server listens, not an address other hosts can reach"),
    ("spark_remote", "http://spark:15002", "is not a Spark Connect URL: give sc://HOST:PORT"),
    ("s3_endpoint", "s3.example.com", "is not an S3 endpoint"),
    ("fact_retention", "forever", "is not a fact retention: give 'keep'"),
]


ARGUMENTS = {"run": [str(README)]}
"""What a command needs besides options to parse (`sluice run FILE`)."""


def parse(global_args: list[str], path: list[str], args: list[str]) -> dict[str, Any]:
    """The flags of settings a command line gives (parsed by the real commands, not run)."""
    ctx = cli.make_context("sluice", [*global_args, *path])
    cmd: click.Command = cli
    for i, name in enumerate(path):
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, name
        cmd = sub
        rest = list(path[i + 1 :]) if i + 1 < len(path) else [*args, *ARGUMENTS.get(name, [])]
        ctx = cmd.make_context(name, rest, parent=ctx)
    return dict(flags_of(ctx))


def flag_args(name: str, text: str) -> list[str]:
    flag = SPECS[name].flag
    assert flag is not None
    return [flag.split("/")[0]] if SPECS[name].is_bool else [flag, text]


def held(settings: Settings, name: str) -> Any:
    value = getattr(settings, name)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def readme_rows() -> dict[str, list[str]]:
    """The README's settings table: file key -> its cells."""
    section = README.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z0-9_]+)` \|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


# --- the README's table is the settings object's ---------------------------------------------


def test_the_readme_table_lists_every_setting_with_its_flag_variable_and_default() -> None:
    rows = readme_rows()
    assert list(rows) == list(SPECS), "the README's settings table and sluice/config.py list other settings"
    for name, (key, flag, env, dflt, _meaning) in rows.items():
        spec = SPECS[name]
        assert key == f"`{spec.key}`"
        assert env == f"`{spec.env}`", name
        if spec.flag is None:
            assert flag == "—", name
        else:
            assert flag.startswith(f"`{spec.flag}`"), name
            for command in spec.commands:
                assert command in flag, f"{name}: the README does not say `sluice {command}` takes {spec.flag}"
        value = Settings.model_fields[name].default
        assert dflt == ("unset" if value is None else f"`{value}`"), name


def test_the_configuration_page_lists_every_setting() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text().split("\n## Every setting\n", 1)[1]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| .*? \| `(SLUICE_[A-Z0-9_]+)` \|", page, re.M)
    assert rows == [(name, spec.env) for name, spec in SPECS.items()]


def test_every_setting_has_a_sample_and_secrets_have_no_flag() -> None:
    assert set(SAMPLES) == set(SPECS)
    for name, spec in SPECS.items():
        assert (spec.flag is None) == spec.secret, f"{name}: a flag is for what is not a secret (it shows in `ps`)"


# --- each setting through a flag, the environment and the file -------------------------------

FLAGGED = [
    pytest.param(name, command, id=f"{name}-{command or 'sluice'}")
    for name, spec in SPECS.items()
    if spec.flag
    for command in (spec.commands or ("",))
]


@pytest.mark.parametrize(("name", "command"), FLAGGED)
def test_a_flag_sets_it(name: str, command: str, tmp_path: Path) -> None:
    text, _, expected = SAMPLES[name]
    if command:  # the command's own flag
        flags = parse([], command.split(), flag_args(name, text))
    else:  # a flag every command takes, before the command
        flags = parse(flag_args(name, text), ["config", "show"], [])
    assert list(flags) == [name]
    resolved = resolve(flags, environ={"SLUICE_HOME": str(tmp_path)})
    assert held(resolved.settings, name) == expected
    assert resolved.origin[name] == "flag"


@pytest.mark.parametrize("name", list(SPECS))
def test_a_variable_sets_it(name: str, tmp_path: Path) -> None:
    text, _, expected = SAMPLES[name]
    resolved = resolve(environ={"SLUICE_HOME": str(tmp_path), SPECS[name].env: text or "1"})
    assert held(resolved.settings, name) == expected
    assert resolved.origin[name] == "env"


@pytest.mark.parametrize("name", list(SPECS))
def test_the_file_sets_it(name: str, tmp_path: Path) -> None:
    _, toml, expected = SAMPLES[name]
    path = tmp_path / "settings.toml"
    path.write_text(f"{SPECS[name].key} = {toml}\n")
    resolved = resolve(config=path, environ={})
    assert held(resolved.settings, name) == expected
    assert resolved.origin[name] == "file" and resolved.file == path


def test_without_anything_each_setting_has_its_default(tmp_path: Path) -> None:
    resolved = resolve(environ={"SLUICE_HOME": str(tmp_path)})
    assert {n: o for n, o in resolved.origin.items() if n != "home"} == {n: "default" for n in SPECS if n != "home"}
    assert resolved.settings.heartbeat_interval_ms == 1000 and resolved.settings.prefix == "sluice"
    assert resolved.file is None and resolved.settings.rq_url is None


# --- precedence ------------------------------------------------------------------------------


def test_a_flag_beats_a_variable_which_beats_the_file_which_beats_the_default(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('prefix = "file"\nlease_ttl_ms = 4000\nslot_timeout_s = 30\n')
    flags = parse(["--prefix", "flag", "--config", str(path)], ["jobmanager"], [])
    environ = {"SLUICE_PREFIX": "env", "SLUICE_LEASE_TTL_MS": "3500"}
    resolved = resolve(flags, config=path, environ=environ)
    s = resolved.settings
    assert (s.prefix, s.lease_ttl_ms, s.slot_timeout_s, s.checkpoint_interval_ms) == ("flag", 3500, 30, 2000)
    assert [resolved.source(n) for n in ("prefix", "lease_ttl_ms", "slot_timeout_s", "checkpoint_interval_ms")] == [
        "flag",
        "env",
        f"file {path}",
        "default",
    ]


def test_the_file_is_sluice_toml_in_the_home_unless_one_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "sluice.toml").write_text('prefix = "in-home"\n')
    other = tmp_path / "other.toml"
    other.write_text('prefix = "named"\n')
    assert load({"home": str(home)}, environ={}).prefix == "in-home"
    assert load(environ={"SLUICE_HOME": str(home)}).prefix == "in-home"
    assert load({"home": str(home)}, config=other, environ={}).prefix == "named"
    assert load({"home": str(home)}, environ={"SLUICE_CONFIG": str(other)}).prefix == "named"
    assert load({"home": str(tmp_path)}, environ={}).prefix == "sluice"  # no sluice.toml there: none read


def test_an_empty_variable_is_unset(tmp_path: Path) -> None:
    resolved = resolve(environ={"SLUICE_HOME": str(tmp_path), "SLUICE_SLOT_TIMEOUT_S": ""})
    assert resolved.settings.slot_timeout_s == 300 and resolved.origin["slot_timeout_s"] == "default"


def test_rq_url_is_the_logs_redis_unless_given() -> None:
    assert load({"redis_url": "redis://a:1"}, environ={}).rq_url == "redis://a:1"
    assert load({"redis_url": "redis://a:1", "rq_redis_url": "redis://b:2"}, environ={}).rq_url == "redis://b:2"


# --- bad values --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "allowed"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_naming_the_setting_the_value_and_what_is_allowed(
    name: str, value: str, allowed: str, tmp_path: Path
) -> None:
    spec = SPECS[name]
    path = tmp_path / "s.toml"
    path.write_text(f"{name} = {json.dumps(value)}\n")
    env = {"SLUICE_HOME": str(tmp_path)}
    for flags, environ, config, spelled in (
        ({name: value}, env, None, spec.flag.split("/")[0] if spec.flag else name),
        ({}, {**env, spec.env: value}, None, f"${spec.env}"),
        ({}, env, path, name),
    ):
        with pytest.raises(ConfigError) as caught:
            resolve(flags, config=config, environ=environ)
        message = str(caught.value)
        where = f" in {path}" if config else ""
        assert message.startswith(f"{spelled}={value!r}{where} "), message
        assert allowed in message, message
        assert (
            f"(setting {name}: " in message
            and f"${spec.env}" in message
            and f"key {name} in the settings file" in message
        )
        assert "pydantic" not in message and "Traceback" not in message


def test_a_heartbeat_timeout_not_longer_than_the_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat timeout \(900 ms\) must be longer than the heartbeat interval"):
        load({"heartbeat_interval_ms": 1000, "heartbeat_timeout_ms": 900}, environ={})
    with pytest.raises(ConfigError, match=r"\$SLUICE_HEARTBEAT_INTERVAL_MS"):
        load(environ={"SLUICE_HEARTBEAT_INTERVAL_MS": "6000"})


def test_a_secrets_bad_value_is_not_shown(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("redis_password = 12345\n")  # a number, not text
    with pytest.raises(ConfigError) as caught:
        load(config=path, environ={})
    assert "12345" not in str(caught.value) and f"redis_password=*** in {path} is not allowed" in str(caught.value)


def test_a_bad_url_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load({"redis_url": "http://sluice:hunter2@db:6379"}, environ={})
    assert "hunter2" not in str(caught.value) and "--redis='http://sluice:***@db:6379' is not a Redis URL" in str(
        caught.value
    )


def test_an_unknown_key_in_the_file_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("slot_timeout = 30\n")
    with pytest.raises(ConfigError, match=rf"slot_timeout in {re.escape(str(path))} is not a setting: the keys are "):
        load(config=path, environ={})


def test_a_file_that_is_not_toml_or_not_there_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("prefix = \n")
    with pytest.raises(ConfigError, match=rf"the settings file {re.escape(str(path))} cannot be read as TOML"):
        load(config=path, environ={})
    with pytest.raises(ConfigError, match=r"--config='.*nope.toml': no such settings file"):
        load(config=tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match=r"\$SLUICE_CONFIG='.*nope.toml': no such settings file"):
        load(environ={"SLUICE_CONFIG": str(tmp_path / "nope.toml")})


def test_a_deploy_timeout_under_twice_the_heartbeat_timeout_is_refused_by_the_jobmanager(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["--home", str(tmp_path), "--heartbeat-timeout", "40000", "jobmanager", "--deploy-timeout", "60"],
        env={"SLUICE_REDIS_URL": "redis://127.0.0.1:1"},
    )
    assert isinstance(result.exception, ConfigError), result.output
    assert "--deploy-timeout=60 s is shorter than twice the heartbeat timeout (40000 ms)" in str(result.exception)
    assert "give at least 80 s" in str(result.exception)


def test_the_cli_says_a_bad_value_in_one_line_and_exits_1(tmp_path: Path) -> None:
    from sluice.cli.main import run_command

    runner = CliRunner()
    with runner.isolation(env={"SLUICE_HOME": str(tmp_path), "SLUICE_LEASE_TTL_MS": "soon"}) as streams:
        with pytest.raises(SystemExit) as exited:
            run_command(cli, args=["config", "show"])
        said = streams[1].getvalue().decode()
    assert exited.value.code == 1
    assert said.startswith("error: $SLUICE_LEASE_TTL_MS='soon' is not allowed: give a whole number of milliseconds")
    assert "Traceback" not in said and said.count("\n") == 1


# --- handing the values on ---------------------------------------------------------------------


def test_values_from_flags_and_the_file_reach_the_variables_until_the_command_ends(tmp_path: Path) -> None:
    import os

    path = tmp_path / "s.toml"
    path.write_text('redis_password = "from-file"\nsnapshot_interval_ms = 1234\n')
    seen: dict[str, str | None] = {}
    NAMES = ("SLUICE_REDIS_PASSWORD", "SLUICE_SNAPSHOT_INTERVAL_MS", "SLUICE_PREFIX", "SLUICE_CONFIG")

    @cli.command("probe-environ", hidden=True)
    @click.pass_obj
    def probe(obj: Any) -> None:
        assert obj.settings.prefix == "flagged"  # resolved, and handed on
        seen.update({k: os.environ.get(k) for k in NAMES})

    try:
        before = {k: os.environ.get(k) for k in NAMES}
        result = CliRunner().invoke(cli, ["--config", str(path), "--prefix", "flagged", "probe-environ"])
        assert result.exit_code == 0, result.output
        assert seen == {
            "SLUICE_REDIS_PASSWORD": "from-file",
            "SLUICE_SNAPSHOT_INTERVAL_MS": "1234",
            "SLUICE_PREFIX": "flagged",
            "SLUICE_CONFIG": str(path.resolve()),  # the processes it starts read the same file
        }
        assert {k: os.environ.get(k) for k in before} == before  # given back when the command ended
    finally:
        cli.commands.pop("probe-environ", None)


# --- sluice config show -----------------------------------------------------------------------


def show(args: list[str], env: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), *args, "config", "show", "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_config_show_says_each_value_and_where_it_came_from(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text("slot_timeout_s = 30\nlease_ttl_ms = 4000\n")
    body = show(["--lease-ttl", "2500"], {"SLUICE_PREFIX": "blue"}, tmp_path)
    got = body["settings"]
    assert body["file"] == str(path)
    assert got["lease_ttl_ms"] == {
        "value": 2500,
        "source": "flag",
        "flag": "--lease-ttl",
        "env": "SLUICE_LEASE_TTL_MS",
        "key": "lease_ttl_ms",
    }
    assert (got["prefix"]["value"], got["prefix"]["source"]) == ("blue", "env")
    assert (got["slot_timeout_s"]["value"], got["slot_timeout_s"]["source"]) == (30, "file")
    assert (got["deploy_timeout_s"]["value"], got["deploy_timeout_s"]["source"]) == (60, "default")
    assert list(got) == list(SPECS)


def test_config_show_redacts_secrets_and_passwords_in_urls(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text('redis_password = "file-secret"\n')
    env = {
        "SLUICE_REDIS_URL": "rediss://sluice:url-secret@db.example.com:6380/0",
        "SLUICE_RQ_REDIS_URL": "redis://rq:rq-secret@queues:6379",
        "SLUICE_UI_TOKEN": "token-secret",
    }
    text = CliRunner().invoke(cli, ["--home", str(tmp_path), "config", "show"], env=env).output
    as_json = CliRunner().invoke(cli, ["--home", str(tmp_path), "config", "show", "--json"], env=env).output
    for out in (text, as_json):
        for secret in ("file-secret", "url-secret", "rq-secret", "token-secret"):
            assert secret not in out
        assert "rediss://sluice:***@db.example.com:6380/0" in out and "redis://rq:***@queues:6379" in out
    got = json.loads(as_json)["settings"]
    assert got["redis_password"]["value"] == got["ui_token"]["value"] == "***"
    assert re.search(r"^redis_password +\*\*\* +\(file .*sluice\.toml\)$", text, re.M), text
    assert re.search(r"^ui_token +\*\*\* +\(env\)$", text, re.M), text
    assert re.search(r"^prefix +sluice +\(default\)$", text, re.M), text
    assert text.startswith(f"settings file: {tmp_path / 'sluice.toml'}\n")


def test_config_show_refuses_a_bad_value(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "config", "show"], env={"SLUICE_UI_PORT": "http"})
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith("$SLUICE_UI_PORT='http' is not allowed: give a port number")
