"""Pure-torch GNN layers on :class:`~gnnscale.batch.Block` s; no DGL needed at import or run time."""

from gnnscale.nn.gat import GATConv
from gnnscale.nn.gcn import GCNConv
from gnnscale.nn.link import DotDecoder, MLPDecoder, link_loss, make_decoder
from gnnscale.nn.model import GNN, ModelConfig
from gnnscale.nn.sage import SAGEConv

__all__ = ["DotDecoder", "GATConv", "GCNConv", "GNN", "MLPDecoder", "ModelConfig", "SAGEConv", "link_loss",
           "make_decoder"]
