"""The gpuledger command line."""
