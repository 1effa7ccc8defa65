"""The SDK's benchmarks, run by ``rollart bench NAME`` (each prints a table and can write
JSON); registered through ``rollart_register_benchmarks`` by :mod:`.plugin`. Before this
package they were ``rollart_sdk.bench`` in the core (docs/benchmarks.md has every figure)."""

from pathlib import Path

# The rollart-sdk checkout's examples/ (configs some benchmarks run by default): this
# package is installed editable from plugins/benchmarks/rollart-benchmark-suite/ there.
EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
