"""Child processes started with vfork and driven from the event loop, on asyncio's loop and on
uvloop (the broker's)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from storage import child_process

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
LOOPS: list[Runner] = [asyncio.run, uvloop.run]

# echoes each line back upper-cased; exits 3 when its stdin ends
ECHO = """
import sys
for line in sys.stdin:
    sys.stdout.write(line.upper())
    sys.stdout.flush()
sys.exit(3)
"""


@pytest.mark.parametrize("run", LOOPS, ids=["asyncio", "uvloop"])
def test_the_pipes_are_streams_and_the_exit_code_is_awaited(run: Runner) -> None:
    async def main() -> tuple[list[bytes], int, int | None]:
        child = await child_process.spawn(
            [sys.executable, "-c", ECHO], stdin=child_process.PIPE, stdout=child_process.PIPE
        )
        assert child.stdin is not None and child.stdout is not None
        assert child.returncode is None
        lines = []
        for word in (b"one\n", b"two\n"):
            child.stdin.write(word)
            await child.stdin.drain()
            lines.append(await child.stdout.readline())
        child.stdin.close()
        code = await child.wait()
        assert await child.stdout.read() == b""
        return lines, code, child.returncode

    lines, code, after = run(main())
    assert lines == [b"ONE\n", b"TWO\n"]
    assert code == 3 and after == 3


@pytest.mark.parametrize("run", LOOPS, ids=["asyncio", "uvloop"])
def test_a_killed_child_reports_the_signal_and_concurrent_waits_share_it(run: Runner) -> None:
    async def main() -> list[int]:
        child = await child_process.spawn(
            [sys.executable, "-c", "import time; time.sleep(60)"], stdin=child_process.DEVNULL
        )
        waits = [asyncio.ensure_future(child.wait()) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits)
        child.kill()
        codes = list(await asyncio.wait_for(asyncio.gather(*waits), 10))
        child.kill()  # exited and reaped: nothing to do
        return [*codes, await child.wait()]

    assert run(main()) == [-signal.SIGKILL] * 3


@pytest.mark.parametrize("run", LOOPS, ids=["asyncio", "uvloop"])
def test_communicate_reads_stdout_and_stderr_merged_to_the_end(run: Runner) -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(1)"

    async def main() -> tuple[bytes, int | None]:
        child = await child_process.spawn(
            [sys.executable, "-c", script],
            stdin=child_process.DEVNULL,
            stdout=child_process.PIPE,
            stderr=child_process.STDOUT,
        )
        output, _ = await child.communicate()
        return output, child.returncode

    output, code = run(main())
    assert sorted(output.split()) == [b"err", b"out"]
    assert code == 1


@pytest.mark.parametrize("run", LOOPS, ids=["asyncio", "uvloop"])
def test_a_missing_program_fails_to_start(run: Runner) -> None:
    async def main() -> None:
        await child_process.spawn(["/nonexistent/program"], stdout=child_process.PIPE)

    with pytest.raises(FileNotFoundError):
        run(main())


def test_stderr_cannot_be_a_pipe_of_its_own() -> None:
    async def main() -> None:
        await child_process.spawn([sys.executable, "-c", ""], stderr=child_process.PIPE)

    with pytest.raises(ValueError, match="stderr"):
        asyncio.run(main())
