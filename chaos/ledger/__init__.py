"""chaos/ledger."""
