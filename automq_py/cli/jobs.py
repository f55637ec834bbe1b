"""``automq-py compact|retention|gc``: run a storage job against a broker.

Each command builds the broker's configuration as ``serve`` does (the job reads and writes
the same object store), picks a runner (Spark, or threads in this process), checks that the
broker answers, then calls its driver in :mod:`spark_jobs.jobs`, which reads metadata from
the broker's controller and commits through it. The last line printed sums up the counters
the driver returns.

Exit codes: 0 done, 1 the job failed (broker unreachable, a unit failed, Spark could not
start), 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from automq_py.cli.serve import add_config_arguments, load_config

# How long the reachability check waits for the broker's TCP handshake.
CONNECT_TIMEOUT_S = 10.0

_CONFIG_NOTE = """\
The configuration is the broker's (-c, --override, --s3-url, applied in that order, later
wins): the job reads and writes the same object store. --bootstrap-server defaults to the
first of its advertised.listeners. The runner is Spark when pyspark and Java 17+ are
installed (local[*], or --master URL), else threads in this process; under spark-submit use
spark_jobs/submit.py. Exit codes: 0 done, 1 the job failed, 2 bad usage or configuration.
"""

_COMMANDS: dict[str, tuple[str, str, str]] = {
    "compact": (
        "compact stream set objects and stream objects",
        "Compact the objects of the stream store, as AutoMQ does: stream set objects (SSO) "
        "are rewritten into stream objects and one new SSO, small stream objects of a stream "
        "are merged, expired ranges are dropped. Sources are marked destroyed by one commit "
        "through the broker; an interrupted job leaves only uncommitted objects, which expire.",
        """\
examples:
  automq-py compact -c config/server.properties
      compact everything; Spark local[*] when available, else in-process
  automq-py compact -c config/server.properties --kind sso --dry-run
      print the stream set object compaction plan, change nothing
  automq-py compact -c config/server.properties --kind key
      key compaction of compacted topics whose dirty share reached min.cleanable.dirty.ratio
  automq-py compact -c config/server.properties --bootstrap-server broker1:9092 \\
      --master spark://spark-master:7077
  PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master yarn \\
      --py-files automq_py.zip spark_jobs/submit.py compact -c server.properties
""",
    ),
    "retention": (
        "apply retention.ms / retention.bytes: trim streams, mark old objects destroyed",
        "Apply every topic's retention.ms and retention.bytes: compute the partitions' new "
        "start offsets, trim their streams, and mark destroyed the objects wholly below the "
        "start offsets; they are deleted after s3.object.delete.retention.minutes.",
        """\
examples:
  automq-py retention -c config/server.properties
  automq-py retention -c config/server.properties --dry-run
      print the new start offsets and the objects that would go, change nothing
  automq-py retention --override log.retention.ms=3600000 --runner local
""",
    ),
    "gc": (
        "delete expired uncommitted objects, destroyed objects and orphans",
        "Collect the object store's garbage: PREPARED objects whose deadline passed (left by "
        "a killed upload or job), destroyed objects past s3.object.delete.retention.minutes, "
        "and objects in the bucket that no metadata names.",
        """\
examples:
  automq-py gc -c config/server.properties
  automq-py gc -c config/server.properties --dry-run
      list what would be deleted, delete nothing
  automq-py gc --s3-url "s3://127.0.0.1:8333?s3-access-key=AK&s3-secret-key=SK\\
&s3-region=us-east-1&s3-endpoint-protocol=http&s3-data-bucket=automq&s3-path-style=true\\
&cluster-id=5kilSYquT962mUNQ8dL7qA"
""",
    ),
}


def add_parser(sub: Any) -> None:
    for name, (summary, description, examples) in _COMMANDS.items():
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            help=summary,
            description=description,
            epilog=examples + "\n" + _CONFIG_NOTE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_config_arguments(p)
        p.add_argument(
            "--bootstrap-server",
            metavar="HOST:PORT",
            help="the broker to read metadata from and commit through "
            "(default: the configuration's first advertised listener)",
        )
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="print the plan and change nothing",
        )
        p.add_argument(
            "--runner",
            choices=("auto", "spark", "local"),
            default="auto",
            help="where units run: spark, local (threads in this process), or auto = spark "
            "when pyspark and Java 17+ are installed, else local (default: auto)",
        )
        p.add_argument(
            "--master",
            metavar="URL",
            help="Spark master URL, e.g. local[4] or spark://host:7077; implies --runner spark "
            "(default: local[*], or spark-submit's master)",
        )
        if name == "compact":
            p.add_argument(
                "--kind",
                choices=("sso", "so", "key", "all"),
                default="all",
                help="sso: stream set objects, so: stream objects, key: compacted topics "
                "(the last record per key; cleanup.policy=compact), all: the three (default: all)",
            )
        p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command: str = args.command
    prog = f"automq-py {command}"
    config = load_config(args, command)
    if config is None:
        return 2
    if args.bootstrap_server is not None:
        address = parse_host_port(args.bootstrap_server)
        if address is None:
            print(
                f"{prog}: --bootstrap-server {args.bootstrap_server!r} is not HOST:PORT",
                file=sys.stderr,
            )
            return 2
    else:
        first = config.advertised_listeners[0]
        address = (first.host, first.port)
    bootstrap = format_host_port(*address)

    # Imported here so `--help` and configuration errors need none of the jobs' imports.
    from spark_jobs.runner import RunnerError, UnitFailedError, make_runner

    try:
        runner = make_runner(args.runner, args.master)
    except RunnerError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2

    async def job() -> dict[str, int]:
        try:
            await check_reachable(*address)
        except OSError as e:
            raise BrokerUnreachableError(
                f"cannot reach the broker at {bootstrap} ({_reason(e)}); start it "
                "(automq-py serve) or pass --bootstrap-server HOST:PORT"
            ) from e
        from spark_jobs import jobs

        drivers: dict[str, Callable[..., Awaitable[dict[str, int]]]] = {
            "compact": jobs.run_compaction,
            "retention": jobs.run_retention,
            "gc": jobs.run_gc,
        }
        extra = {"kind": args.kind} if command == "compact" else {}
        return await drivers[command](
            config.storage, bootstrap, runner, dry_run=args.dry_run, out=sys.stdout, **extra
        )

    started = time.monotonic()
    try:
        with runner:
            counters = asyncio.run(job())
    except BrokerUnreachableError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except ConnectionError as e:
        print(f"{prog}: lost the connection to the broker at {bootstrap}: {e}", file=sys.stderr)
        return 1
    except (RunnerError, UnitFailedError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; uncommitted objects expire by themselves", file=sys.stderr)
        return 130
    print(summary(command, counters, time.monotonic() - started, dry_run=args.dry_run))
    return 0


class BrokerUnreachableError(Exception):
    """The broker did not accept a TCP connection."""


async def check_reachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Open and close a TCP connection to ``host:port``; raises OSError (TimeoutError too)."""
    async with asyncio.timeout(timeout):
        _, writer = await asyncio.open_connection(host, port)
    writer.close()
    await writer.wait_closed()


def _reason(error: OSError) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer in {CONNECT_TIMEOUT_S:g} s"
    if error.errno is not None:
        return os.strerror(error.errno).lower()
    return str(error) or type(error).__name__


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>\d{1,5})$")


def parse_host_port(text: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> (host, port); None when malformed."""
    match = _HOST_PORT.match(text.strip())
    if match is None:
        return None
    port = int(match["port"])
    if not 0 < port < 65536:
        return None
    return match["v6"] or match["host"], port


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def summary(command: str, counters: dict[str, int], seconds: float, *, dry_run: bool) -> str:
    """The command's last line: ``compact: done in 1.2 s: objects_compacted=3, ...``."""
    state = "dry run (nothing changed)" if dry_run else "done"
    figures = ", ".join(f"{k}={v}" for k, v in counters.items()) or "nothing to report"
    return f"{command}: {state} in {seconds:.1f} s: {figures}"
