"""A TCP delay proxy the harness owns (``python -m tools.hosts.proxy``): it forwards every
connection from ``--listen`` to ``--to``, holding each chunk, in each direction, for a delay
drawn uniformly from the range written in ``--delay-file`` (``LOW HIGH`` in milliseconds;
``0 0`` or no file: no delay). Order within a direction is kept (a chunk leaves no earlier
than the one before it). The file is read again every half second, so latency is turned on
and off while connections stay open.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

__all__ = ["Delay", "serve", "main"]


class Delay:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.low = self.high = 0.0
        self._read_at = 0.0

    def draw(self) -> float:
        """Seconds to hold the next chunk."""
        now = time.monotonic()
        if self.path is not None and now - self._read_at > 0.5:
            self._read_at = now
            try:
                low, high = (float(x) for x in self.path.read_text().split()[:2])
                self.low, self.high = max(0.0, low) / 1000, max(low, high) / 1000
            except (OSError, ValueError):
                self.low = self.high = 0.0
        return random.uniform(self.low, self.high) if self.high > 0 else 0.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, chunk = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(send())
    last = 0.0
    try:
        while True:
            chunk = await reader.read(65536)
            last = max(last, time.monotonic() + delay.draw())
            await queue.put((last, chunk))
            if not chunk:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
    finally:
        writer.close()


async def serve(listen: tuple[str, int], to: tuple[str, int], delay: Delay) -> asyncio.Server:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.wait_for(asyncio.open_connection(*to), 10)
        except (TimeoutError, OSError):
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, delay), _pipe(server_r, client_w, delay), return_exceptions=True)

    return await asyncio.start_server(handle, *listen)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.hosts.proxy", description=__doc__)
    p.add_argument("--listen", type=_address, required=True)
    p.add_argument("--to", type=_address, required=True)
    p.add_argument("--delay-file", type=Path, default=None)
    args = p.parse_args(argv)

    async def run() -> None:
        server = await serve(args.listen, args.to, Delay(args.delay_file))
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
