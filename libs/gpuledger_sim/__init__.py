"""Trace replay: the FGD paper's simulator protocol over gpuledger's own placement code."""
