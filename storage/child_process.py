"""Child processes started without copying the broker's address space.

uvloop starts a subprocess with ``fork()``: the kernel copies the parent's page tables and
marks every page copy-on-write, so the event loop stalls while it does (46-50 ms with 512 MiB in
use, measured here) and every page written afterwards takes a fault (0.21 s of CPU to write to
those 512 MiB once more). CPython's :class:`subprocess.Popen` starts one with ``vfork()``
(1.4 ms, no faults after), so :func:`spawn` starts the child with it and connects its pipes to
the event loop as asyncio streams.

:class:`ChildProcess` offers the part of :class:`asyncio.subprocess.Process` the broker uses.
Its exit is awaited through a pidfd (Linux 5.3+) the event loop watches, or else in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Sequence
from typing import IO, Any

from storage import loop_cpu

PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL

_STREAM_LIMIT = 1 << 16  # asyncio's default StreamReader limit


class ChildProcess:
    """A started child: its pid, its pipes as asyncio streams, its exit."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
    ) -> None:
        self._popen = popen
        self.stdin = stdin
        self.stdout = stdout
        self._exited: asyncio.Future[int] | None = None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: the signal that ended it); None while it runs."""
        return self._popen.poll()

    def kill(self) -> None:
        """SIGKILL (nothing if it has exited and been waited for)."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()

    async def wait(self) -> int:
        """Wait for the child to exit; its exit code."""
        code = self._popen.poll()
        if code is None:
            if self._exited is None:
                self._exited = _watch_exit(self._popen)
            code = await asyncio.shield(self._exited)
        if self.stdin is not None:
            self.stdin.close()  # nothing reads it any more
        return code

    async def communicate(self) -> tuple[bytes, None]:
        """Read its stdout to the end and wait for it to exit (stdin is closed first)."""
        if self.stdin is not None and not self.stdin.is_closing():
            self.stdin.close()
        output = await self.stdout.read() if self.stdout is not None else b""
        await self.wait()
        return output, None


async def spawn(
    args: Sequence[str],
    *,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    limit: int = _STREAM_LIMIT,
) -> ChildProcess:
    """Start ``args`` (``stdin``/``stdout``/``stderr`` as for :class:`subprocess.Popen`);
    the pipes asked for with :data:`PIPE` come back as ``stdin`` (a StreamWriter) and
    ``stdout`` (a StreamReader of at most ``limit`` bytes per line)."""
    if stderr == PIPE:
        raise ValueError("stderr=PIPE is not supported: use STDOUT or a file")
    loop = asyncio.get_running_loop()
    # bufsize=0: the transports write and read the descriptors themselves; the child runs on
    # the process's CPUs, not on the one the event loop's thread may be pinned to
    with loop_cpu.spawning():
        popen = subprocess.Popen(list(args), stdin=stdin, stdout=stdout, stderr=stderr, bufsize=0)
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    try:
        if popen.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.streams.FlowControlMixin(loop=loop), popen.stdin
            )
            writer = asyncio.StreamWriter(transport, protocol, None, loop)
        if popen.stdout is not None:
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            await loop.connect_read_pipe(lambda: _ReadProtocol(reader, loop=loop), popen.stdout)
    except BaseException:
        if writer is not None:
            writer.close()
        popen.kill()
        popen.wait()
        raise
    return ChildProcess(popen, writer, reader)


class _ReadProtocol(asyncio.StreamReaderProtocol):
    """A StreamReaderProtocol whose transport closes at the end of the pipe (uvloop's would
    stay open, half-closed, until closed by hand)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


def _watch_exit(popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """A future of the child's exit code, set when the event loop sees its pidfd readable."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):  # no pidfds here, or the child is already reaped
        return asyncio.ensure_future(asyncio.to_thread(popen.wait))
    exited: asyncio.Future[int] = loop.create_future()

    def on_exit() -> None:
        code = popen.poll()
        if code is None:
            return  # (not yet reaped: the pidfd stays readable)
        loop.remove_reader(pidfd)
        os.close(pidfd)
        if not exited.done():
            exited.set_result(code)

    loop.add_reader(pidfd, on_exit)
    on_exit()  # it may have exited before the reader was added
    return exited
