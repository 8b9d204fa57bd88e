"""gpuledger's dev mode: the whole stack on a simulated fleet (``gpuledger dev up``).

The fakes at the seams (NVML driven by a fleet file, kube-apiserver, kubelet's device manager and DRA
side), the simulated and the real control plane on loopback (built from Go modules), the embedded
nats-server, and the local stack that runs every service as its own process. Its own distribution
(``gpuledger-dev``, this folder's pyproject.toml): a development install and the image's dev target
install it; production never does (``pip wheel .`` leaves it out, tests/unit/deploy/test_wheel.py).
"""
