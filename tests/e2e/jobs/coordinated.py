"""A transform with its own OperatorCoordinator: the coordinator greets every subtask when
it starts (before they run: the greeting waits in their inboxes), each subtask tags its
rows with the greeting and thanks the coordinator, which records the thanks in its
checkpointed state. With ``explode=1`` the coordinator raises on the first thanks. The
Greeter is not deterministic (it sends from its own thread).

With $SLUICE_TEST_GATE set (in the TaskManager's environment), subtask 1 waits until that
file exists before it thanks the coordinator (tests: a JobManager killed between the two
thanks)."""

import os
import time
from pathlib import Path

from pyspark.sql import functions as F

from sluice.api import Job, task_context
from sluice.services.coordination.coordinator import OperatorCoordinator


class Greeter(OperatorCoordinator):
    def __init__(self, context):
        super().__init__(context)
        self.state = {"greeted": False, "thanks": []}
        self.explode = False

    def start(self):
        if self.state["greeted"]:
            return  # restored: the greetings went out before the checkpoint

        # From the coordinator's own thread, as blocking work would be: state and sends
        # change together under the context's lock.
        def greet():
            with self.context.lock:
                for i in range(self.context.parallelism):
                    self.context.send_event(i, {"hello": f"greeting-{i}"})
                self.state["greeted"] = True

        self.context.call_async(greet)

    def handle_event_from_operator(self, subtask, attempt, event):
        if self.explode:
            raise RuntimeError(f"the greeter cannot take thanks from subtask {subtask}")
        self.state["thanks"].append([subtask, attempt, event["rows"]])

    def checkpoint_coordinator(self, checkpoint_id):
        return self.state

    def reset_to_checkpoint(self, checkpoint_id, state):
        self.state = state


class ExplodingGreeter(Greeter):
    def __init__(self, context):
        super().__init__(context)
        self.explode = True


def tag(df):
    ctx = task_context()
    greeting = ctx.next_event(timeout_s=60)
    if greeting is None:
        raise RuntimeError("no greeting from the coordinator")
    out = df.withColumn("greeting", F.lit(greeting["hello"]))
    rows = out.count()
    if ctx.subtask == 1:
        wait_at_gate()
    ctx.send_to_coordinator({"rows": rows})
    return out


def wait_at_gate(limit_s=120):
    gate = os.environ.get("SLUICE_TEST_GATE")
    if not gate:
        return
    deadline = time.monotonic() + limit_s
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gate {gate} did not open within {limit_s} s")
        time.sleep(0.05)


def job(params):
    j = Job("coordinated")
    nums = j.read_range("nums", 0, int(params.get("n", 1000)), per_split=100, parallelism=2)
    tagged = nums.key_by("id").map("tag", tag, parallelism=2)
    tagged.with_coordinator(ExplodingGreeter if params.get("explode") == "1" else Greeter)
    tagged.write_parquet("out", params["output"])
    return j.graph()
