"""A real Kubernetes control plane on loopback: built from Go modules, started for tests and ``dev up``."""
