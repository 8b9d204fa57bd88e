"""The per-node inventory service: cards, topology and health from NVML, published to NATS."""
