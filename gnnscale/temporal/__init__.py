"""Memory-based temporal GNNs: node memory state, TGN, and their training loop."""

from gnnscale.temporal.memory import MemoryConfig, MemoryState, TemporalMemory, TimeEncoder
from gnnscale.temporal.tgn import TGN, LinkPredictor, Neighborhood, TemporalAttention, TGNConfig

__all__ = ["LinkPredictor", "MemoryConfig", "MemoryState", "Neighborhood", "TGN", "TGNConfig", "TemporalAttention",
           "TemporalMemory", "TimeEncoder"]
