"""Benchmarks: commands that print performance figures next to their goals."""
