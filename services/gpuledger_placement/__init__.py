"""gpuledger-placement: the kube-scheduler extender and placement over NATS."""
