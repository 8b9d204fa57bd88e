"""gpuledger-plugin: the kubelet device plugin that hands containers the cards the ledger holds."""
