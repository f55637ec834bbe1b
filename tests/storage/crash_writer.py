"""A writer process for crash tests: appends to streams and prints every acknowledged append.

Run as ``python -m tests.storage.crash_writer CONFIG_JSON``. Lines on stdout:
``STREAM <id>`` once per stream, then ``ACK <stream> <offset> <count>`` after each append is
durable. Payloads are derived from (stream, offset) so the checker can rebuild them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys

from storage.config import S3StreamConfig
from storage.s3_storage import S3Storage
from storage.stream import S3Stream, StreamClient


def payload_for(stream_id: int, offset: int, size: int) -> bytes:
    seed = hashlib.sha256(f"{stream_id}:{offset}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def writer(stream: S3Stream, rng: random.Random) -> None:
    while True:
        count = rng.randint(1, 5)
        offset = stream.next_offset
        payload = payload_for(stream.stream_id, offset, rng.randint(100, 4000))
        got = await stream.append(payload, count)
        assert got == offset
        print(f"ACK {stream.stream_id} {offset} {count} {len(payload)}", flush=True)


async def main(config_json: str) -> None:
    spec = json.loads(config_json)
    config = S3StreamConfig.from_properties(spec["properties"])
    storage = await S3Storage.start(config)
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(spec["streams"])]
    for s in streams:
        print(f"STREAM {s.stream_id}", flush=True)
    rng = random.Random(spec.get("seed", 0))
    await asyncio.gather(*(writer(s, random.Random(rng.random())) for s in streams))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
