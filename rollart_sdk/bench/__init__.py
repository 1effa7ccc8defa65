"""Benchmarks run by ``rollart bench NAME`` (each prints a table and can write JSON)."""
