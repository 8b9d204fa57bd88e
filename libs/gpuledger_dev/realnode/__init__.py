"""A real node for the e2e suite and ``gpuledger dev up --node real``: kubelet, containerd, runc."""
