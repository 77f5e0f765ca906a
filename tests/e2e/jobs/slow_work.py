"""Every line of the input, copied to Parquet after Spark work that takes ``SLOW_S`` a split
on subtask 0 and ``FAST_S`` on the others (a sleep inside ``mapInPandas``: in the Spark
server's Python worker, not in the reader). The source is read ``each_split``, so a reader
asks for its next split only once the Spark work on the last one is done."""

from pyspark.sql import DataFrame

from sluice.api import Job, task_context

FAST_S, SLOW_S = 0.5, 4.0


def work(lines: DataFrame) -> DataFrame:
    delay = SLOW_S if task_context().subtask == 0 else FAST_S

    def slowly(batches):
        import time

        time.sleep(delay)  # once per partition: a split's rows are one partition
        yield from batches

    return lines.mapInPandas(slowly, lines.schema)


def job(params):
    j = Job("slow-work")
    lines = j.read_text(
        "lines",
        params["input"],
        parallelism=int(params.get("parallelism", 2)),
        split_bytes=int(params.get("split_bytes", 2048)),
        each_split=params.get("each_split") != "no",
    )
    lines.map("work", work).write_parquet("out", params["output"])
    return j.graph()
