"""DRA mode of the plugin shim: the kubelet DRA plugin of driver gpu.gpuledger.io (docs/dra.md)."""
