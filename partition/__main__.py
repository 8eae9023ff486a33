"""``python -m partition ...`` and ``python -m partition verify DIR``; see :mod:`partition.cli`."""

import sys

from partition.cli import main

if __name__ == "__main__":
    sys.exit(main())
