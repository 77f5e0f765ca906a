"""The long-running processes: ``sluice jobmanager``, ``taskmanager``, ``projector``."""

from __future__ import annotations

import sys

import click

from sluice.services.common.shell import stop_on_signals

from .context import Context


@click.command()
@click.option("--id", "jm_id", default=None, help="JobManager id (default: host and a random suffix).")
@click.pass_obj
def jobmanager(obj: Context, jm_id: str | None) -> None:
    """Run a JobManager: it leads when it holds the lease, and stands by otherwise."""
    from sluice.services.jobmanager import JobManager
    from sluice.services.membership import MembershipConfig

    s = obj.settings
    jm = JobManager(obj.log(), config=MembershipConfig(s.heartbeat_interval_ms, s.heartbeat_timeout_ms),
                    lease_ttl_ms=s.lease_ttl_ms, jm_id=jm_id)
    jm.run(stop_on_signals())


@click.command()
@click.option("--slots", default=1, show_default=True, type=int, help="Task slots this TaskManager offers.")
@click.option("--resource-id", default=None, help="Stable id of this TaskManager (default: host and a random suffix).")
@click.option("--host", default=None, help="Host name reported for locality (default: $SLUICE_HOST or the machine's).")
@click.pass_obj
def taskmanager(obj: Context, slots: int, resource_id: str | None, host: str | None) -> None:
    """Run a TaskManager: register with the leader, heartbeat, and unregister on SIGTERM."""
    from sluice.services.taskmanager import RegistrationConfig, TaskManager

    s = obj.settings
    tm = TaskManager(obj.log(), resource_id=resource_id, slots=slots, host=host,
                     config=RegistrationConfig(heartbeat_interval_ms=s.heartbeat_interval_ms,
                                               jobmanager_timeout_ms=s.heartbeat_timeout_ms))
    sys.exit(tm.run(stop_on_signals()))


@click.command()
@click.pass_obj
def projector(obj: Context) -> None:
    """Run the projector: keep the read-model tables in step with the log."""
    from sluice.services.projector import Projector

    Projector(obj.log()).run(stop_on_signals())


def register(cli: click.Group) -> None:
    for cmd in (jobmanager, taskmanager, projector):
        cli.add_command(cmd)
