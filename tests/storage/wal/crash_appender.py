"""Child process for the WAL crash test: appends until killed, printing what is durable.

Run as ``python crash_appender.py PATH CAPACITY FIRST_SEQ [INLINE_MAX]``. Eight appenders share
one ``FileWAL`` (``inline_commit_max`` INLINE_MAX); it first prints ``M ring`` when the event
loop's commits go through an io_uring (else ``M loop``), then after each acknowledged append
``A <offset> <seq>``, after each completed trim ``T <offset>``. Bodies come from
``body_for(seq)`` so the parent can rebuild them.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
import sys

from storage.wal import FileWAL, file_wal


def body_for(seq: int) -> bytes:
    rng = random.Random(seq)
    return rng.randbytes(rng.randint(0, 3000))


async def main(path: str, capacity: int, first_seq: int, inline_max: int) -> None:
    wal = await FileWAL.open(path, capacity, inline_commit_max=inline_max)
    print(f"M {'ring' if wal._async is not None else 'loop'}", flush=True)
    for _ in wal.recover():
        pass
    seqs = itertools.count(first_seq)
    acked: collections.deque[int] = collections.deque()

    async def appender() -> None:
        while True:
            seq = next(seqs)
            result = await wal.append(body_for(seq))
            print(f"A {result.offset} {seq}", flush=True)
            acked.append(result.offset)
            # keep about a quarter of the ring live, so the writer laps the ring many times
            if result.next_offset - wal.trim_offset > capacity // 2:
                while acked and result.next_offset - acked[0] > capacity // 4:
                    acked.popleft()
                target = acked[0]
                await wal.trim(target)
                print(f"T {target}", flush=True)

    await asyncio.gather(*(appender() for _ in range(8)))


if __name__ == "__main__":
    inline_max = int(sys.argv[4]) if len(sys.argv) > 4 else file_wal.INLINE_COMMIT_MAX
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), inline_max))
