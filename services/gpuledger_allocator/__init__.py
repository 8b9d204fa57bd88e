"""The allocator: owns the global ledger of cards."""
