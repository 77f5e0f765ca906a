"""The long-running processes: ``sluice jobmanager``, ``taskmanager``, ``projector``."""

from __future__ import annotations

import sys

import click

from sluice.config import Settings
from sluice.services.common.shell import stop_on_signals

from .context import Context
from .options import setting_option, setting_options


def metrics_options(role: str):
    """``--metrics-port`` (the setting ``<role>_metrics_port``, ``$SLUICE_<ROLE>_METRICS_PORT``;
    0: off) and ``--metrics-host`` (``metrics_host``) for a long-running process."""
    return setting_options(f"{role}_metrics_port", "metrics_host")


def serve_metrics(process, role: str, settings: Settings) -> None:
    """Start the process's metrics endpoint (ConfigError, said by the CLI, when it cannot)."""
    port = getattr(settings, f"{role}_metrics_port")
    if port:
        from sluice.services.common.metrics import serve

        option = f"--metrics-port (or $SLUICE_{role.upper()}_METRICS_PORT)"
        endpoint = serve(process.metrics, port, settings.metrics_host, option=option)
        process.logger.info("serving metrics", url=endpoint.url)


INBOX_RETENTION = setting_option("inbox_retention_ms")


@click.command()
@click.option("--id", "jm_id", default=None, help="JobManager id (default: host and a random suffix).")
@setting_options(
    "storage_root",
    "slot_timeout_s",
    "checkpoint_interval_ms",
    "deploy_timeout_s",
    "speculation",
    "snapshot_interval_ms",
    "fact_retention",
)
@INBOX_RETENTION
@metrics_options("jobmanager")
@click.pass_obj
def jobmanager(obj: Context, jm_id: str | None) -> None:
    """Run a JobManager: it leads when it holds the lease, and stands by otherwise."""
    s = obj.start("jobmanager")
    from sluice.services.jobmanager import JobManager
    from sluice.services.jobmanager.retention import FactRetention
    from sluice.services.jobs.core import JobsConfig
    from sluice.services.jobs.speculation import SpeculationConfig
    from sluice.services.membership import MembershipConfig

    jm = JobManager(
        obj.log(),
        config=MembershipConfig(s.heartbeat_interval_ms, s.heartbeat_timeout_ms),
        jobs_config=JobsConfig(
            slot_timeout_ms=s.slot_timeout_s * 1000,
            deploy_timeout_ms=s.deploy_timeout_s * 1000,
            speculation=SpeculationConfig.parse(s.speculation),
        ),
        lease_ttl_ms=s.lease_ttl_ms,
        jm_id=jm_id,
        storage_root=s.storage_root_uri(),
        checkpoint_interval_ms=s.checkpoint_interval_ms,
        inbox_retention_ms=s.inbox_retention_ms,
        fact_retention=FactRetention.parse(s.fact_retention, where="fact_retention"),
    )
    serve_metrics(jm, "jobmanager", s)
    jm.run(stop_on_signals())


@click.command()
@click.option("--slots", default=1, show_default=True, type=int, help="Task slots this TaskManager offers.")
@click.option("--resource-id", default=None, help="Stable id of this TaskManager (default: host and a random suffix).")
@setting_options(
    "advertise_host", "spark_remote", "io_rate", "task_partitions", "spark_cores", "spark_slots", "worker_redis_wait_s"
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
def taskmanager(obj: Context, slots: int, resource_id: str | None, no_execute: bool) -> None:
    """Run a TaskManager: register with the leader, run tasks on one RQ worker per slot,
    heartbeat, and unregister on SIGTERM."""
    s = obj.start("taskmanager")
    from sluice.services.taskmanager import RegistrationConfig, TaskManager

    tm = TaskManager(
        obj.log(),
        resource_id=resource_id,
        slots=slots,
        host=s.advertise_host,
        config=RegistrationConfig(
            heartbeat_interval_ms=s.heartbeat_interval_ms, jobmanager_timeout_ms=s.heartbeat_timeout_ms
        ),
        home=s.home,
        redis_url=obj.url,
        rq_redis_url=obj.rq_url() if not no_execute else None,
        execute=not no_execute,
        spark_remote=s.spark_remote,
        io_rate=s.io_rate,
        task_partitions=s.task_partitions,
        spark_cores=s.spark_cores,
        spark_slots=s.spark_slots,
        inbox_retention_ms=s.inbox_retention_ms,
    )
    serve_metrics(tm, "taskmanager", s)
    sys.exit(tm.run(stop_on_signals()))


@click.command(hidden=True)
@click.option("--resource-id", required=True)
@click.option("--slot", required=True, type=int)
@click.pass_obj
def worker(obj: Context, resource_id: str, slot: int) -> None:
    """One slot's RQ worker (started by its TaskManager)."""
    from sluice.services.taskmanager.worker import init_worker, warm_up
    from sluice.store.slots import work_slot

    ctx = init_worker(obj.url, obj.settings.prefix, resource_id, slot, rq_url=obj.settings.rq_redis_url)
    if obj.settings.spark_remote:
        warm_up()
    work_slot(ctx.log, resource_id, slot, outage=ctx.outage, rq=ctx.rq)


@click.command()
@metrics_options("projector")
@click.pass_obj
def projector(obj: Context) -> None:
    """Run the projector: keep the read-model tables in step with the log."""
    s = obj.start("projector")
    from sluice.services.projector import Projector

    p = Projector(obj.log())
    serve_metrics(p, "projector", s)
    p.run(stop_on_signals())


def register(cli: click.Group) -> None:
    for cmd in (jobmanager, taskmanager, projector, worker):
        cli.add_command(cmd)
