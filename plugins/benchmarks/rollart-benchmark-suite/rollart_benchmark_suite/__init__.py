"""The SDK's benchmarks, run by ``rollart bench NAME`` (each prints a table and can write
JSON); registered through ``rollart_register_benchmarks`` by :mod:`.plugin`. Before this
package they were ``rollart_sdk.bench`` in the core (docs/benchmarks.md has every figure)."""
