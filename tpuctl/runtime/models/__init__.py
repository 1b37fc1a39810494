"""Small models bundled with the runtime (examples, tests and benchmarks)."""
