"""The source coordinator: a split enumerator running inside an OperatorCoordinator.

The enumerator's splits are discovered when the job is submitted (``discover``: byte
ranges of files, row groups of Parquet files, or ranges of numbers), so that a job whose
input does not exist is refused before anything runs; the discovered plan is recorded in
``JobSubmitted``. Readers then ask for splits one at a time, by either protocol:

* operator events: ``{"type": "request-split", "host": h}`` is answered with
  ``{"type": "split", "split": {...}}`` or ``{"type": "no-more-splits"}``;
* the seed protocol (``protocol="input-splits"``): ``RequestNextInputSplit`` is answered
  with ``NextInputSplit`` (the framework turns the same answers into that event).

Both go through the one ``SplitAssigner``; for a source read ``each_split`` it plays the
end game with the time of each request (``CoordinatorContext.now``, from the log). The
coordinator is deterministic (it sends only in answer to its inputs, on the main loop),
so its answers are released in the commit of the request that caused them.
"""

from __future__ import annotations

from typing import Any

from sluice.services.dataplane.errors import SplitError
from sluice.services.dataplane.splits import COMPRESSED_SUFFIXES, plan_splits

from .assigner import SplitAssigner
from .coordinator import CoordinatorContext, OperatorCoordinator

__all__ = ["SourceCoordinator", "SplitEnumerator", "discover", "plan_range", "REQUEST", "SPLIT", "NO_MORE"]

REQUEST, SPLIT, NO_MORE = "request-split", "split", "no-more-splits"


def plan_range(start: int, end: int, per_split: int) -> list[dict[str, Any]]:
    """The numbers ``[start, end)`` in splits of ``per_split``."""
    if end < start:
        raise ValueError(f"a range source needs start <= end, got {start}..{end}")
    if per_split < 1:
        raise ValueError(f"a range source needs at least 1 number per split, got {per_split}")
    return [
        {"format": "range", "start": a, "end": min(a + per_split, end), "index": i}
        for i, a in enumerate(range(start, end, per_split))
    ]


def discover(
    format: str, paths: list[str], split_bytes: int, options: dict[str, str], readers: int = 1
) -> list[dict[str, Any]]:
    """Every split of a source, in order (raises with a clear message when it cannot).
    ``split_bytes`` 0: chosen from the input's size and its ``readers`` (the source's
    parallelism), as Spark's ``maxPartitionBytes``/``openCostInBytes`` do (``splits.auto_split_bytes``)."""
    if format == "range":
        try:
            start, end = int(options["start"]), int(options["end"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"a range source needs integer options start and end, got {options!r}") from exc
        return plan_range(start, end, split_bytes)
    from sluice.services.dataplane import options as reader_options

    splits = plan_splits(
        format,
        paths,
        split_bytes,
        whole_files=reader_options.whole_files(format, options),
        columns=reader_options.parquet_columns(options) if format == "parquet" else None,
        readers=readers,
    )
    if reader_options.transcoded(options):  # a split's bytes are decoded: they must be text, not compressed
        packed = next((s["path"] for s in splits if str(s["path"]).lower().endswith(COMPRESSED_SUFFIXES)), None)
        if packed is not None:
            raise SplitError(
                f"{packed} is compressed, and encoding={reader_options.lookup(options, 'encoding')!r} decodes "
                "the bytes of a split: decompress the files, or convert them to UTF-8 and drop encoding"
            )
    return splits


class SplitEnumerator:
    """Hands out one source's splits on request (FLIP-27's SplitEnumerator)."""

    def __init__(
        self, splits: list[dict[str, Any]], readers: int | None = None, paced: bool = False, scheduled: bool = False
    ) -> None:
        """``paced``: readers ask for a split only after they processed the last one (a
        source read ``each_split``), so the time between requests is a reader's pace and
        the assigner plays the end game with it (see ``assigner``). ``scheduled``: told
        which readers hold a slot (``reader_scheduled``), the enumerator keeps a share only
        for those (a reader waiting for a slot does not hold the running ones back)."""
        self.splits, self.readers, self.paced, self.scheduled = splits, readers, paced, scheduled
        self.assigner = SplitAssigner([s.get("hosts", ()) for s in splits], readers, scheduled)

    def reader_scheduled(self, subtask: int) -> None:
        self.assigner.schedule(subtask)

    def handle_split_request(self, subtask: int, host: str, now: int | None = None) -> dict[str, Any] | None:
        """The split for this request, or None when there are no more splits for it
        (``now``: when it asked, ms, for the end game)."""
        i = self.assigner.next(subtask, host, now if self.paced else None)
        return None if i is None else self.splits[i]

    def add_splits_back(self, subtask: int) -> list[int]:
        return self.assigner.give_back(subtask)

    def finished(self, subtask: int) -> None:
        self.assigner.finish(subtask)

    def snapshot(self) -> Any:
        return self.assigner.snapshot()

    def restore(self, state: Any) -> None:
        self.assigner = SplitAssigner.restore(
            [s.get("hosts", ()) for s in self.splits], state, self.readers, self.scheduled
        )


class SourceCoordinator(OperatorCoordinator):
    deterministic = True

    def __init__(
        self,
        context: CoordinatorContext,
        splits: list[dict[str, Any]],
        protocol: str = "operator-events",
        paced: bool = False,
    ) -> None:
        super().__init__(context)
        self.protocol = protocol
        self.enumerator = SplitEnumerator(splits, context.parallelism, paced, scheduled=True)

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        if not isinstance(event, dict) or event.get("type") != REQUEST:
            raise ValueError(
                f"the source coordinator of {self.context.operator_id!r} got {event!r} from subtask "
                f"{subtask}; it takes only {{'type': '{REQUEST}', 'host': ...}}"
            )
        split = self.enumerator.handle_split_request(subtask, str(event.get("host") or ""), self.context.now)
        body = {"type": NO_MORE} if split is None else {"type": SPLIT, "split": split}
        self.context.send_event(subtask, body, attempt)

    def subtask_failed(self, subtask: int, attempt: int, reason: str | None) -> None:
        self.enumerator.add_splits_back(subtask)

    def subtask_reset(self, subtask: int, attempt: int) -> None:
        # Whatever its earlier attempt held goes back (it may not have been reported failed:
        # an attempt renumbered after a restart of Redis never ran under the log's eyes).
        self.enumerator.add_splits_back(subtask)

    def subtask_scheduled(self, subtask: int, attempt: int) -> None:
        self.enumerator.reader_scheduled(subtask)

    def subtask_ready(self, subtask: int, attempt: int) -> None:
        self.enumerator.reader_scheduled(subtask)  # (running: it holds a slot, whatever was seen before)

    def subtask_finished(self, subtask: int, attempt: int) -> None:
        self.enumerator.finished(subtask)

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return self.enumerator.snapshot()

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.enumerator.restore(state)
