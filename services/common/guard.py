"""Run a command that dies with the process that started it.

``python -m sluice.services.common.guard SIGNUM PARENT_PID CMD...`` asks Linux to send
SIGNUM when its parent dies (PR_SET_PDEATHSIG, which survives exec), checks the parent is
still there, then becomes CMD. Used instead of ``preexec_fn``, which is unsafe in a
process with threads (gRPC's fork handlers can hang the child between fork and exec).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["guarded"]


def guarded(cmd: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """``cmd``, wrapped so that it gets ``sig`` when the calling process dies (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-m", "sluice.services.common.guard", str(int(sig)), str(os.getpid()), *cmd]


def main(argv: list[str]) -> None:
    sig, parent, cmd = int(argv[0]), int(argv[1]), argv[2:]
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # the parent is already gone
        sys.exit(1)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
