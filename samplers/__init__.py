"""CPU-side samplers in vectorised numpy; they return ids and block structure, never features."""

from samplers.neighbor import NeighborSampler, SamplerConfig, add_self_loops

__all__ = ["NeighborSampler", "SamplerConfig", "add_self_loops"]
