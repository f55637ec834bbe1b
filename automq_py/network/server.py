"""SocketServer: accepts Kafka client connections and runs their requests.

Per connection, requests are handled one at a time in arrival order and responses are written
in that order (Kafka mutes a connection while a request is in flight; clients pipeline and
match responses by correlation id in order). Oversized or malformed frames close the
connection; so does an unsupported API version, except for ApiVersions, which is answered
with the KIP-511 fallback. Idle connections close after ``connections.max.idle.ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from automq_py.apis import KafkaApis
from automq_py.apis.context import CLIENT_HOST
from protocol.api_keys import ApiKey
from protocol.errors import InvalidRequestError, ProtocolError, UnsupportedVersionError
from protocol.framing import FrameDecoder
from protocol.messages import decode_request

log = logging.getLogger("automq.network")

READ_SIZE = 256 * 1024


class SocketServer:
    def __init__(
        self,
        apis: KafkaApis,
        *,
        max_request_size: int,
        idle_timeout_s: float,
    ) -> None:
        self.apis = apis
        self.max_request_size = max_request_size
        self.idle_timeout_s = idle_timeout_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=READ_SIZE)
        log.info("listening on %s:%d", host, port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            CLIENT_HOST.set(f"/{peer[0]}")
        try:
            await self._run(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except ProtocolError as e:
            log.info("closing connection from %s: %s", peer, e)
        except TimeoutError:
            log.debug("closing idle connection from %s", peer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an unexpected error", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(self.max_request_size)
        while True:
            data = await asyncio.wait_for(reader.read(READ_SIZE), self.idle_timeout_s)
            if not data:
                return
            for frame in decoder.feed(data):
                try:
                    request = decode_request(frame, self.apis.supported)
                except UnsupportedVersionError as e:
                    if e.api_key != ApiKey.API_VERSIONS:
                        raise
                    writer.writelines(self.apis.unsupported_api_versions(e.correlation_id))
                    await writer.drain()
                    continue
                except InvalidRequestError:
                    raise
                response = await self.apis.handle(request)
                if response is not None:
                    writer.writelines(response)
                    await writer.drain()
