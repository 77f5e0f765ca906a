"""Which locations Spark itself reads or writes, and whether it can reach them.

Spark touches a job's files in three places; Sluice's own layer (``fs``) does the rest:

* the **storage root**: producers write their exchange partitions there
  (``exchange.write_partition``: ``df.write.parquet``) and consumers read them
  (``exchange.read_inputs``: ``spark.read.parquet``); TaskManagers also prepare and
  remove a task's output directory there as a local path;
* a **sink's path**: Spark writes an attempt's files into its staging directory there
  (``exchange.write_sink``), before ``fs`` publishes them;
* the task's **temp dir** (materialized splits, chunks): always the TaskManager's own disk.

Inputs are not on that list: a source's splits are copied by ``fs`` (ranged reads) into
the temp dir, and Spark reads the copy. So ``s3://`` inputs need no Spark connector.

Spark (the pyspark wheel's Hadoop) reaches local paths and ``file://`` only; it has no
``s3://`` file system at all, and reaches S3 as ``s3a://`` only with the hadoop-aws and AWS
SDK jars, which the wheel does not ship. :func:`problems` says, for the storage root and
the sinks of a job, what Spark cannot reach and what to do; the JobManager refuses such a
job at submission, before any task runs. It refuses what is sure to fail: an S3 location
(``s3://``, ``s3a://``, ``s3n://``) for either, and any storage root but a local one; a
sink on another scheme (``hdfs://`` on a Spark configured for it) is let through.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.services.dataplane import fs

__all__ = ["problem", "problems"]

_SPARK_WRITES = {
    "storage root": "Spark writes and reads the job's exchange partitions there, and TaskManagers manage it "
    "as a local path",
    "sink": "Spark writes the sink's files there before Sluice publishes them",
}

_HOW = (
    "use a file:// path on a file system every host mounts at the same path (SeaweedFS with weed mount, "
    "NFS, ...; README 'Storage on S3')"
)


def problem(what: str, location: str, name: str = "") -> str | None:
    """Why Spark cannot reach ``location`` (``what``: "storage root" or "sink"), or None when it can."""
    scheme = fs.scheme_of(location) if isinstance(location, str) else None
    if scheme in ("", "file"):
        return None
    label = f"{what} {name!r} writes to {location!r}, which" if name else f"the {what} {location!r}"
    why = _SPARK_WRITES[what]
    if scheme == "s3":
        return (
            f"{label} cannot be used: {why}, and Spark has no s3:// file system (it reaches S3 "
            "only as s3a:// with the hadoop-aws and AWS SDK jars, which the pyspark wheel does not ship). "
            f"Inputs may stay on s3:// (Sluice copies them itself); for this, {_HOW}"
        )
    if scheme in ("s3a", "s3n"):
        return (
            f"{label} cannot be used: {why}; {scheme}:// needs the hadoop-aws and AWS SDK jars "
            "in every Spark, and Sluice's own file operations (publishing, _schema.json) do not speak "
            f"{scheme}:// yet. {_HOW[0].upper()}{_HOW[1:]}"
        )
    if what == "storage root":
        return (
            f"{label} cannot be used: {why}, and TaskManagers manage only file:// roots (scheme {scheme!r}). "
            f"{_HOW[0].upper()}{_HOW[1:]}"
        )
    # A sink on another scheme (hdfs://, the simulation's sim://) is the deployment's to
    # make reachable; if Sluice's own layer cannot publish there, the task says so (fs).
    return None


def problems(storage_root: str, sinks: Iterable[tuple[str, str]]) -> list[str]:
    """Every location of a job Spark must reach and cannot: the storage root, then each sink
    (``(vertex name, path)``)."""
    found = [problem("storage root", storage_root)]
    found.extend(problem("sink", path, name) for name, path in sinks)
    return [p for p in found if p is not None]
