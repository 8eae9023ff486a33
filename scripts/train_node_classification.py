"""Train a GNN for node classification. Run with --help for every option.

    python scripts/train_node_classification.py --dataset cora --data-dir ../shared/datasets/cora --model gcn
"""

import sys

from gnnscale.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
