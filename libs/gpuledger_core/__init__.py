"""The pure core of gpuledger: domain types, fit, ledger transitions. No I/O lives here."""
