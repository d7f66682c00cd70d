"""Model families: one parameterized decoder and the registry of HF architectures."""
