"""CPU-side samplers on DGL's C++ kernels; they return ids and block structure, never features."""

from samplers.neighbor import NeighborSampler, NodeLoader, SamplerConfig, add_self_loops

__all__ = ["NeighborSampler", "NodeLoader", "SamplerConfig", "add_self_loops"]
