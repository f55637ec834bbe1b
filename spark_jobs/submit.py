"""Entry script for ``spark-submit``: the ``automq-py compact|retention|gc`` commands on the
SparkContext spark-submit sets up (its ``--master``, ``--conf`` and resources)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master local[4] \\
        spark_jobs/submit.py compact -c config/server.properties --dry-run

The arguments after the script are the command's (see ``automq-py compact --help``);
``--runner spark`` is implied, and the master is spark-submit's, so ``--master`` and
``--runner`` are refused here. On a real cluster the executors must import this package:
pass ``--py-files automq_py.zip`` (a zip of ``automq_py``, ``protocol``, ``storage`` and
``spark_jobs``) or install the wheel on every worker.
"""

from __future__ import annotations

import os
import sys

JOB_COMMANDS = ("compact", "retention", "gc")


def main(argv: list[str]) -> int:
    for arg in argv:
        option = arg.split("=", 1)[0]
        if option in ("--master", "--runner"):
            print(
                f"submit.py: {option} is spark-submit's here: pass --master to spark-submit, "
                "before the script",
                file=sys.stderr,
            )
            return 2
    # The script's own directory (spark_jobs/) is first on sys.path; its modules are only
    # meant to be imported as spark_jobs.*.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        from automq_py.cli import main as cli_main
    except ImportError as e:
        print(
            f"submit.py: cannot import automq_py ({e}); install the package in the driver's "
            "python (PYSPARK_DRIVER_PYTHON) or pass --py-files automq_py.zip",
            file=sys.stderr,
        )
        return 2
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command is None:
        return cli_main(argv)  # --help
    if command not in JOB_COMMANDS:
        print(f"submit.py: runs {', '.join(JOB_COMMANDS)}, not {command!r}", file=sys.stderr)
        return 2
    # After the command, so the command's parser takes it. SparkRunner(master=None) then
    # uses the master spark-submit gave the running JVM.
    return cli_main([*argv, "--runner", "spark"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
