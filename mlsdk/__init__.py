"""MLSDK-compatible API on the simulated MN-Core 2 (filled in by later steps)."""
