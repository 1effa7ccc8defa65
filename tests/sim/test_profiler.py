"""The online affinity profiler: per-class token rates from engine stats, and the
assignment that unloads the busiest pool."""

from __future__ import annotations

import pytest

from rollart_sdk.sim.profiler import profile, propose


def stats(pool: str, hw: str, tags: dict[str, tuple[float, float, float, float]]) -> dict:
    """tags: tag -> (prefill s, prefill tokens, decode s, decode tokens)."""
    return {"pool": pool, "hardware_name": hw,
            "tag_prefill_s": {t: v[0] for t, v in tags.items()},
            "tag_tokens": {t: [v[1], v[3]] for t, v in tags.items()},
            "tag_decode_s": {t: v[2] for t, v in tags.items()}}


def test_wrong_static_mapping_is_swapped_and_rates_are_per_class():
    # Static: prefill-heavy "FL" on the bandwidth class, decode-heavy "M" on the compute class.
    # H800 prefill 1e-4 s/token, decode 1e-3 s/token; H20 prefill 7e-4, decode 8e-4.
    s = [stats("H800", "H800", {"M": (0.1, 1_000, 100.0, 100_000)}),
         stats("H20", "H20", {"FL": (70.0, 100_000, 8.0, 10_000)})]
    p = profile(s)
    assert p.prefill_s_per_token == pytest.approx({"H800": 1e-4, "H20": 7e-4})
    assert p.decode_s_per_token == pytest.approx({"H800": 1e-3, "H20": 8e-4})
    prop = propose(p, {"FL": "H20", "M": "H800"})
    assert prop.hw_mapping == {"FL": "H800", "M": "H20"}
    assert max(prop.load_s.values()) < max(prop.current_load_s.values())
    assert prop.prefill_decode_ratio == pytest.approx(70.1 / 108.0)


def test_a_class_without_a_measurement_borrows_the_roofline_ratio():
    s = [stats("A", "H800", {"x": (1.0, 10_000, 1.0, 1_000)}),
         stats("B", "H20", {"y": (0.0, 0, 2.0, 2_000)})]  # no prefill seen on H20
    p = profile(s, roofline={"H800": (1e15, 3e12), "H20": (1.5e14, 4e12)})
    assert p.prefill_s_per_token["H20"] == pytest.approx(1e-4 * 1e15 / 1.5e14)
