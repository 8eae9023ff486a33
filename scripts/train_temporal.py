"""Train TGN for temporal link prediction on an event stream. Run with --help for every option.

    python scripts/train_temporal.py --dataset wikipedia --data-dir ../shared/datasets/wikipedia --epochs 10
"""

import sys

from gnnscale.temporal.cli import main

if __name__ == "__main__":
    sys.exit(main())
