"""Every line of the input with the Spark partition it was read in and the shuffle
partitions of the task's session: what a task's share of its Spark server
(services/taskmanager/share.py) makes of its input, seen from the job's own code."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job


def tag(lines: DataFrame) -> DataFrame:
    shuffles = lines.sparkSession.conf.get("spark.sql.shuffle.partitions")
    return lines.select("value", F.spark_partition_id().alias("pid"), F.lit(shuffles).alias("shuffles"))


def job(params):
    j = Job("partitions")
    lines = j.read_text("lines", params["input"], parallelism=1, split_bytes=int(params["split_bytes"]))
    lines.map("tag", tag).write_parquet("out", params["output"])
    return j.graph()
