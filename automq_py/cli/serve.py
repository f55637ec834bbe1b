"""``automq-py serve``: build the BrokerConfig from the command line and run the broker."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from automq_py import logs
from automq_py.config import BrokerConfig, ConfigError

log = logging.getLogger("automq.serve")

_EPILOG = """\
examples:
  automq-py serve
      embedded: listens on 127.0.0.1:9092, WAL, metadata and objects under ./data
  automq-py serve -c config/server.properties --override node.id=1 \\
      --override listeners=PLAINTEXT://0.0.0.0:9092 \\
      --override advertised.listeners=PLAINTEXT://broker1.example.com:9092
  automq-py serve --s3-url "s3://127.0.0.1:8333?s3-access-key=AK&s3-secret-key=SK\\
&s3-region=us-east-1&s3-endpoint-protocol=http&s3-data-bucket=automq&s3-path-style=true\\
&cluster-id=5kilSYquT962mUNQ8dL7qA"

Properties are applied in order, later wins: the --config file, KAFKA_* variables (with --env),
each --override, --s3-url.
S3 credentials may also come from KAFKA_S3_ACCESS_KEY / KAFKA_S3_SECRET_KEY (as in AutoMQ).
"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the broker",
        description=(
            "Run a Kafka-compatible broker storing its data in S3Stream: a local write-ahead "
            "log, then objects in S3 (or a local directory). It stops gracefully on SIGTERM "
            "or SIGINT."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(p)
    p.set_defaults(run=run)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The options that build a BrokerConfig: ``-c/--config``, ``--override``, ``--s3-url``."""
    p.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help=(
            "a server.properties file (Kafka/AutoMQ property names, Java properties syntax), "
            "e.g. -c config/server.properties; without it the built-in defaults apply"
        ),
    )
    p.add_argument(
        "--override",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help=(
            "set one property over the file, e.g. --override num.partitions=3; "
            "repeatable, the last one for a key wins"
        ),
    )
    p.add_argument(
        "--env",
        action="store_true",
        help=(
            "also take properties from KAFKA_* environment variables, as Kafka's images do "
            "(KAFKA_ADVERTISED_LISTENERS -> advertised.listeners; '__' -> '_', '___' -> '-'), "
            "over the --config file and under --override; AUTOMQ_S3_URL stands for --s3-url"
        ),
    )
    p.add_argument(
        "--s3-url",
        metavar="URL",
        help=(
            "AutoMQ's S3 url (automq-kafka-admin.sh generate-s3-url), e.g. "
            "s3://HOST:PORT?s3-access-key=AK&s3-secret-key=SK&s3-region=us-east-1"
            "&s3-endpoint-protocol=http&s3-data-bucket=BUCKET&s3-path-style=true&cluster-id=ID; "
            "sets s3.data.buckets and cluster.id"
        ),
    )


def load_config(args: argparse.Namespace, command: str) -> BrokerConfig | None:
    """The BrokerConfig the options of :func:`add_config_arguments` describe; on a bad
    property, print it (``automq-py COMMAND: name: why``) and return None (exit code 2)."""
    try:
        return BrokerConfig.load(
            args.config, args.override, args.s3_url, env=os.environ, from_env=args.env
        )
    except ConfigError as e:
        print(f"automq-py {command}: {e}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    # kio's phantom types register hypothesis strategies whenever hypothesis is importable (as
    # in a venv with the test extra); some of them scan the time-zone database, stalling the
    # event loop while schemas load. The broker never generates test data: hide hypothesis.
    if "kio" not in sys.modules:
        sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    config = load_config(args, "serve")
    if config is None:
        return 2
    logs.configure(
        config.log_format,
        "DEBUG" if args.verbose else config.log_level,
        config.logger_levels,
        {"node_id": config.node_id, "cluster_id": config.cluster_id},
    )
    # Kafka logs its effective configuration at start-up; secrets are hidden.
    log.info(
        "broker configuration:\n%s",
        "\n".join(f"\t{k} = {v}" for k, v in config.all_properties().items()),
    )
    from storage.heap import keep_large_buffers_in_heap, pretouch_heap
    from storage.metadata.sqlite_store import StoreInUseError
    from storage.wal.errors import WALError

    keep_large_buffers_in_heap()
    if config.storage.cache_pretouch:
        pretouch_heap(config.storage.wal_cache_size + config.storage.block_cache_size)
    try:
        _run_event_loop(_serve(config))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 130
    except (StoreInUseError, WALError) as e:  # the data is another broker's, or unusable
        log.error("%s", e)
        print(f"automq-py serve: {e}", file=sys.stderr)
        return 1
    _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """Exit once the broker has stopped, its logs flushed, without the interpreter's teardown:
    freeing a heap of 10,000 partitions object by object took over a second of the time
    ``docker stop`` allows, with nothing left to do (every file is closed, everything durable)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _serve(config: BrokerConfig) -> None:
    # Imported here so `serve --help` and config errors need none of the broker's imports;
    # with the cyclic collector paused: the imports make no garbage, yet its ~95 passes over
    # their new objects took 35-60 ms of the ~0.5 s a broker takes to start.
    gc.disable()
    try:
        from automq_py.broker import run as run_broker
    finally:
        gc.enable()
    await run_broker(config)


SWITCH_INTERVAL_S = 0.0005


def _run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (faster sockets), else on asyncio's loop."""
    # The event loop shares the GIL with the WAL's I/O thread and the threads that build
    # objects for upload; Python hands the GIL over every 5 ms by default, so each time the
    # loop woke while an object was being built it could wait that long (produce p99 at
    # 20 MB/s: 39 -> 28 ms with 0.5 ms)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)
