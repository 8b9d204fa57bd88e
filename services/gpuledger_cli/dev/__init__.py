"""The local development stack: every service as its own process on a simulated fleet."""
