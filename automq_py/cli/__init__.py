"""The ``automq-py`` command: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import logging
import sys

from automq_py.cli import inspect_object, jobs, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="automq-py",
        description="A Kafka-compatible broker on object storage (AutoMQ's S3Stream design).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect_object.add_parser(sub)
    serve.add_parser(sub)
    jobs.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
