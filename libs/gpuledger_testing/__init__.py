"""Test utilities shared by the tests, the benchmarks and the local stack."""
