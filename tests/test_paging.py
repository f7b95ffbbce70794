"""Contiguous vs paged KV allocation: waste, concurrency and the analytic expectation."""
from __future__ import annotations

import pytest

from engine.projection.paging import PagingConfig, compare, expected_contiguous_waste_pct, make_requests, simulate

CONFIG = PagingConfig()   # 32K tokens of KV, max_len 2048, blocks of 16, 300 requests


@pytest.fixture(scope="module")
def comparison():
    return compare(CONFIG)


def test_every_request_finishes_under_both_modes(comparison):
    assert comparison.contiguous.finished == CONFIG.n_requests
    assert comparison.paged.finished == CONFIG.n_requests
    for result in (comparison.contiguous, comparison.paged):
        assert all(s.allocated_tokens <= CONFIG.capacity_tokens for s in result.steps)
        assert all(s.used_tokens <= s.allocated_tokens for s in result.steps)


def test_paging_wastes_less_than_one_block_per_request(comparison):
    paged = comparison.paged
    for s in paged.steps:
        assert s.allocated_tokens - s.used_tokens < CONFIG.block_size * max(s.running, 1)
    assert paged.mean_waste_tokens < CONFIG.block_size
    assert paged.waste_pct < 4.0                       # FACTS: paging reaches ~96% use


def test_contiguous_waste_matches_the_exact_count(comparison):
    """Each request holds max_len for its o steps and uses p+1 .. p+o tokens along the way."""
    used = sum(r.output * r.prompt + r.output * (r.output + 1) / 2 for r in comparison.requests)
    held = sum(CONFIG.max_len * r.output for r in comparison.requests)
    assert comparison.contiguous.waste_pct == pytest.approx(100 * (1 - used / held), rel=1e-9)


def test_contiguous_waste_matches_the_analytic_expectation(comparison):
    # Uniform p in [32, 512], o in [16, 512]: E[p] = 272, E[o] = 264,
    # E[o^2] = Var + E[o]^2 = (497^2 - 1) / 12 + 264^2.
    e_p, e_o = (32 + 512) / 2, (16 + 512) / 2
    e_o2 = (497 ** 2 - 1) / 12 + e_o ** 2
    expected = 100 * (1 - (e_o * e_p + (e_o2 + e_o) / 2) / (2048 * e_o))
    assert expected_contiguous_waste_pct(CONFIG) == pytest.approx(expected)
    assert comparison.contiguous.waste_pct == pytest.approx(expected, abs=2.0)
    assert 60 <= comparison.contiguous.waste_pct <= 80   # FACTS: 60-80% wasted


def test_paged_fits_more_requests_and_finishes_sooner(comparison):
    contiguous, paged = comparison.contiguous, comparison.paged
    assert contiguous.max_running <= CONFIG.capacity_tokens // CONFIG.max_len
    assert paged.mean_running > 2 * contiguous.mean_running
    assert paged.max_running > contiguous.max_running
    assert paged.makespan < contiguous.makespan


def test_seeded_and_deterministic():
    assert make_requests(CONFIG) == make_requests(CONFIG)
    assert make_requests(CONFIG) != make_requests(PagingConfig(seed=1))
    a, b = simulate(CONFIG, "paged"), simulate(CONFIG, "paged")
    assert a == b


def test_tight_memory_forces_preemption_but_still_finishes():
    tight = PagingConfig(capacity_tokens=2048, n_requests=40, arrival_rate=5.0)
    result = simulate(tight, "paged")
    assert result.finished == 40
    assert result.preemptions > 0


def test_bad_mode_or_capacity():
    with pytest.raises(ValueError):
        simulate(CONFIG, "buddy")
    with pytest.raises(ValueError):
        simulate(PagingConfig(capacity_tokens=1024), "contiguous")
