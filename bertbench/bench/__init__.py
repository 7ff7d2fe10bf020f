"""Measurement helpers shared by the benchmarks: synchronised step timing, FLOP counts, matmul peak."""
