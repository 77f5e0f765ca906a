"""The components' log lines inside the simulation: structlog routed into the running
world's notes (shown in a failing seed's trace), rendered only when a trace shows them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["Line", "Notes", "quiet_logging"]


class Line:
    """A component's log line in the notes, rendered only if a trace shows it (most seeds
    pass, and formatting every line cost more than the step that logged it)."""

    __slots__ = ("step", "elapsed_ms", "line")

    def __init__(self, step: int, elapsed_ms: int, line: Any) -> None:
        self.step, self.elapsed_ms, self.line = step, elapsed_ms, line

    def __str__(self) -> str:
        return f"step {self.step:>5} t={self.elapsed_ms / 1000:8.3f}s  | {self.line}"

    def __radd__(self, other: str) -> str:
        return other + str(self)


class _Rendered:
    """A structlog event, rendered as ConsoleRenderer would when it is shown."""

    __slots__ = ("event",)
    _render: Any = None

    def __init__(self, event: Any) -> None:
        self.event = event

    def __str__(self) -> str:
        import structlog

        if _Rendered._render is None:
            _Rendered._render = structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            )
        return str(_Rendered._render(None, "", dict(self.event)))


def _defer(logger: Any, name: str, event: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (_Rendered(event),), {}


class Notes:
    """structlog's output inside the simulation: a line in the running world's notes."""

    current: Simulation | None = None

    def msg(self, message: Any) -> None:
        if Notes.current is not None:
            Notes.current.log_line(message)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def quiet_logging() -> None:
    """Route the components' log lines into the simulation's notes (shown in a failing
    seed's trace) instead of stderr."""
    import logging

    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, _defer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=lambda *args: Notes(),
        cache_logger_on_first_use=False,
    )
