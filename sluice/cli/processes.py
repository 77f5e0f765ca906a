"""The long-running processes: ``sluice jobmanager``, ``taskmanager``, ``projector``."""

from __future__ import annotations

import os
import sys

import click

from sluice.config import advertised_host
from sluice.services.common.shell import stop_on_signals

from .context import Context


def metrics_options(role: str):
    """``--metrics-port`` (env ``SLUICE_<ROLE>_METRICS_PORT``; 0: off) and ``--metrics-host``
    (env ``SLUICE_METRICS_HOST``) for a long-running process."""
    env = f"SLUICE_{role.upper()}_METRICS_PORT"

    def add(f):
        f = click.option(
            "--metrics-host",
            envvar="SLUICE_METRICS_HOST",
            default="0.0.0.0",
            show_default=True,
            metavar="ADDRESS",
            help="The address the metrics endpoint listens on.",
        )(f)
        return click.option(
            "--metrics-port",
            envvar=env,
            default=0,
            show_default=True,
            metavar="PORT",
            type=click.IntRange(0, 65535),
            help=f"Serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: no metrics; ${env}).",
        )(f)

    return add


def serve_metrics(process, role: str, port: int, host: str) -> None:
    """Start the process's metrics endpoint (ConfigError, said by the CLI, when it cannot)."""
    if port:
        from sluice.services.common.metrics import serve

        option = f"--metrics-port (or $SLUICE_{role.upper()}_METRICS_PORT)"
        endpoint = serve(process.metrics, port, host, option=option)
        process.logger.info("serving metrics", url=endpoint.url)


INBOX_RETENTION = click.option(
    "--inbox-retention",
    envvar="SLUICE_INBOX_RETENTION_MS",
    default=600_000,
    show_default=True,
    type=click.IntRange(0),
    help="Milliseconds of consumed (and delivered) traffic its inbox (and outboxes) keep for `sluice inspect tail` "
    "before they are trimmed.",
)


@click.command()
@click.option("--id", "jm_id", default=None, help="JobManager id (default: host and a random suffix).")
@click.option(
    "--storage-root",
    envvar="SLUICE_STORAGE_ROOT",
    default=None,
    help="Where result partitions go (file:// URI; default: <home>/storage).",
)
@click.option(
    "--slot-timeout",
    envvar="SLUICE_SLOT_TIMEOUT_S",
    default=300,
    show_default=True,
    type=int,
    help="Seconds a job may wait for free slots before it fails.",
)
@click.option(
    "--checkpoint-interval",
    envvar="SLUICE_CHECKPOINT_INTERVAL_MS",
    default=2000,
    show_default=True,
    type=int,
    help="Milliseconds between checkpoints of a coordinator that has new inputs.",
)
@click.option(
    "--deploy-timeout",
    envvar="SLUICE_DEPLOY_TIMEOUT_S",
    default=60,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds a deployment may go unanswered (its TaskManager does not "
    "report holding it) before the attempt fails and runs again.",
)
@INBOX_RETENTION
@metrics_options("jobmanager")
@click.pass_obj
def jobmanager(
    obj: Context,
    jm_id: str | None,
    storage_root: str | None,
    slot_timeout: int,
    checkpoint_interval: int,
    deploy_timeout: int,
    inbox_retention: int,
    metrics_port: int,
    metrics_host: str,
) -> None:
    """Run a JobManager: it leads when it holds the lease, and stands by otherwise."""
    from sluice.services.jobmanager import JobManager
    from sluice.services.jobs.core import JobsConfig
    from sluice.services.membership import MembershipConfig

    s = obj.settings
    if deploy_timeout * 1000 < 2 * s.heartbeat_timeout_ms:
        raise click.BadParameter(
            f"{deploy_timeout} s is shorter than twice the heartbeat timeout ({s.heartbeat_timeout_ms} ms): a "
            "TaskManager's slot reports need that long to answer for a deployment; give at least "
            f"{-(-2 * s.heartbeat_timeout_ms // 1000)} s",
            param_hint="--deploy-timeout",
        )
    root = storage_root or (s.home / "storage").resolve().as_uri()
    jm = JobManager(
        obj.log(),
        config=MembershipConfig(s.heartbeat_interval_ms, s.heartbeat_timeout_ms),
        jobs_config=JobsConfig(slot_timeout_ms=slot_timeout * 1000, deploy_timeout_ms=deploy_timeout * 1000),
        lease_ttl_ms=s.lease_ttl_ms,
        jm_id=jm_id,
        storage_root=root,
        checkpoint_interval_ms=checkpoint_interval,
        inbox_retention_ms=inbox_retention,
    )
    serve_metrics(jm, "jobmanager", metrics_port, metrics_host)
    jm.run(stop_on_signals())


@click.command()
@click.option("--slots", default=1, show_default=True, type=int, help="Task slots this TaskManager offers.")
@click.option("--resource-id", default=None, help="Stable id of this TaskManager (default: host and a random suffix).")
@click.option(
    "--advertise-host",
    "--host",
    "host",
    envvar="SLUICE_ADVERTISE_HOST",
    default=None,
    metavar="HOST",
    callback=lambda _ctx, _param, value: advertised_host(value, "--advertise-host ($SLUICE_ADVERTISE_HOST)"),
    help="The name or address other hosts reach this TaskManager on, carried in its registration "
    "(split locality, `sluice status`, errors that name it); $SLUICE_ADVERTISE_HOST. "
    "Default: $SLUICE_HOST or the machine's host name.",
)
@click.option(
    "--spark",
    "spark",
    default=None,
    envvar="SLUICE_SPARK_REMOTE",
    metavar="sc://HOST:PORT",
    help="Spark Connect server the workers use (default: this TaskManager starts one when a task first needs Spark).",
)
@click.option(
    "--io-rate",
    default=0.0,
    type=float,
    envvar="SLUICE_IO_RATE",
    show_default=True,
    metavar="BYTES/S",
    help="Read input splits at most this fast, per slot (0: no limit); "
    "shares a disk fairly, as Flink's rate-limited sources do.",
)
@click.option(
    "--task-partitions",
    default=None,
    type=click.IntRange(min=0),
    envvar="SLUICE_TASK_PARTITIONS",
    metavar="N",
    help="Spark partitions every task reads and shuffles into (0: Spark decides). "
    "Default: each task's share of its server's cores, divided by the slots sharing "
    "it or by its vertex's subtasks when fewer; Spark decides when the cores are not "
    "known (--spark without --spark-cores, or a non-local master).",
)
@click.option(
    "--spark-cores",
    default=None,
    type=click.IntRange(min=1),
    envvar="SLUICE_SPARK_CORES",
    metavar="N",
    help="Cores of the Spark server given with --spark, for the tasks' share of them.",
)
@click.option(
    "--spark-slots",
    default=None,
    type=click.IntRange(min=1),
    envvar="SLUICE_SPARK_SLOTS",
    metavar="N",
    help="How many slots share that server, all TaskManagers together (default: this one's slots).",
)
@click.option(
    "--no-execute",
    is_flag=True,
    hidden=True,
    help="Acknowledge and finish tasks without running them (control-plane benchmarks).",
)
@INBOX_RETENTION
@metrics_options("taskmanager")
@click.pass_obj
def taskmanager(
    obj: Context,
    slots: int,
    resource_id: str | None,
    host: str | None,
    spark: str | None,
    io_rate: float,
    task_partitions: int | None,
    spark_cores: int | None,
    spark_slots: int | None,
    no_execute: bool,
    inbox_retention: int,
    metrics_port: int,
    metrics_host: str,
) -> None:
    """Run a TaskManager: register with the leader, run tasks on one RQ worker per slot,
    heartbeat, and unregister on SIGTERM."""
    from sluice.services.taskmanager import RegistrationConfig, TaskManager

    s = obj.settings
    tm = TaskManager(
        obj.log(),
        resource_id=resource_id,
        slots=slots,
        host=host,
        config=RegistrationConfig(
            heartbeat_interval_ms=s.heartbeat_interval_ms, jobmanager_timeout_ms=s.heartbeat_timeout_ms
        ),
        home=s.home,
        redis_url=obj.url,
        rq_redis_url=obj.rq_url() if not no_execute else None,
        execute=not no_execute,
        spark_remote=spark,
        io_rate=io_rate,
        task_partitions=task_partitions,
        spark_cores=spark_cores,
        spark_slots=spark_slots,
        inbox_retention_ms=inbox_retention,
    )
    serve_metrics(tm, "taskmanager", metrics_port, metrics_host)
    sys.exit(tm.run(stop_on_signals()))


@click.command(hidden=True)
@click.option("--resource-id", required=True)
@click.option("--slot", required=True, type=int)
@click.pass_obj
def worker(obj: Context, resource_id: str, slot: int) -> None:
    """One slot's RQ worker (started by its TaskManager)."""
    from sluice.services.taskmanager.worker import init_worker, warm_up
    from sluice.store.slots import work_slot

    ctx = init_worker(obj.url, obj.settings.prefix, resource_id, slot, obj.settings.rq_redis_url)
    if os.environ.get("SLUICE_SPARK_REMOTE"):
        warm_up()
    work_slot(ctx.log, resource_id, slot, outage=ctx.outage, rq=ctx.rq)


@click.command()
@metrics_options("projector")
@click.pass_obj
def projector(obj: Context, metrics_port: int, metrics_host: str) -> None:
    """Run the projector: keep the read-model tables in step with the log."""
    from sluice.services.projector import Projector

    p = Projector(obj.log())
    serve_metrics(p, "projector", metrics_port, metrics_host)
    p.run(stop_on_signals())


def register(cli: click.Group) -> None:
    for cmd in (jobmanager, taskmanager, projector, worker):
        cli.add_command(cmd)
