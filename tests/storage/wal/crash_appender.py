"""Child process for the WAL crash test: appends until killed, printing what is durable.

Run as ``python crash_appender.py PATH CAPACITY FIRST_SEQ``. Eight appenders share one
``FileWAL``; after each acknowledged append it prints ``A <offset> <seq>``, after each
completed trim ``T <offset>``. Bodies come from ``body_for(seq)`` so the parent can rebuild them.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
import sys

from storage.wal import FileWAL


def body_for(seq: int) -> bytes:
    rng = random.Random(seq)
    return rng.randbytes(rng.randint(0, 3000))


async def main(path: str, capacity: int, first_seq: int) -> None:
    wal = await FileWAL.open(path, capacity)
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
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
