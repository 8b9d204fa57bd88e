"""What only the tests and the benchmarks use: allocator and placement replicas in this process against
a real nats-server (``replicas``), a 3-server JetStream cluster whose servers can be killed
(``nats_cluster``), a TCP link that holds bytes back (``held_link``), an independent check of the ledger
against Kubernetes (``ledger_check``), a headless Chromium (``browser``), the Docker engine and the
compose stack (``engine``), and waiting on conditions (``waiting``).

Not installed anywhere: it is imported as ``tests.support`` from the repository's root (pytest's
root, ``python -m benchmarks.NAME``). The product's dev mode, which tests use as well, is the
``gpuledger_dev`` package.
"""
