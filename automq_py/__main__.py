import sys

from automq_py.cli import main

sys.exit(main())
