"""``python -m automq_py.health [HOST:PORT]``: exit 0 when a broker answers ApiVersions;
``--readyz HOST:PORT``: exit 0 when the broker's ``/readyz`` on its metrics port answers 200.

The container's health check (the image asks ``/readyz``: not ready while the WAL recovers).
It uses the socket and http.client modules and ``ApiKey`` only (no broker imports), so a check
every few seconds costs a few milliseconds: one ApiVersions v0 request, and its response must
carry the request's correlation id and error code 0; or one GET.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import struct
import sys

from protocol.api_keys import ApiKey

CORRELATION_ID = 0x48454C54  # "HELT"
CLIENT_ID = b"automq-py-health"


def check(host: str, port: int, timeout: float) -> str | None:
    """None when the broker at ``host:port`` answered ApiVersions without error, else why."""
    header = (
        struct.pack(">hhih", ApiKey.API_VERSIONS, 0, CORRELATION_ID, len(CLIENT_ID)) + CLIENT_ID
    )
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(header)) + header)
            size = struct.unpack(">i", _read(s, 4))[0]
            if not 6 <= size <= 1 << 20:
                return f"response size {size}"
            correlation_id, error_code = struct.unpack(">ih", _read(s, 6))
    except OSError as e:
        return str(e)
    if correlation_id != CORRELATION_ID:
        return f"correlation id {correlation_id}"
    return None if error_code == 0 else f"ApiVersions error code {error_code}"


def check_ready(host: str, port: int, timeout: float) -> str | None:
    """None when ``/readyz`` at ``host:port`` answered 200, else why not."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        body = response.read(512).decode(errors="replace").strip()
    except OSError as e:
        return str(e)
    finally:
        connection.close()
    return None if response.status == 200 else f"/readyz answered {response.status}: {body}"


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m automq_py.health",
        description="Exit 0 when the broker answers an ApiVersions request (or, with "
        "--readyz, when its /readyz answers 200), 1 otherwise.",
    )
    parser.add_argument(
        "bootstrap", nargs="?", default="127.0.0.1:9092", help="HOST:PORT (127.0.0.1:9092)"
    )
    parser.add_argument(
        "--readyz",
        metavar="HOST:PORT",
        help="ask the broker's metrics port instead: ready means serving (WAL recovered, "
        "listeners open, registered in a cluster)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (3)")
    args = parser.parse_args(argv)
    address = args.readyz or args.bootstrap
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if args.readyz:
        why = check_ready(host, int(port), args.timeout)
    else:
        why = check(host, int(port), args.timeout)
    if why is not None:
        print(f"unhealthy: {address}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
