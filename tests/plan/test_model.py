"""Young/Daly intervals and the analytic ETTR models against their closed forms."""

from __future__ import annotations

import math

import pytest

from stormwatch.plan import (
    daly_interval,
    ettr_first_order,
    ettr_renewal,
    solve_downtime_for_target,
    young_interval,
)


@pytest.mark.parametrize(
    ("delta", "mttf"),
    [(10.0, 11_135.0), (60.0, 3600.0), (1.0, 19_000.0), (300.0, 86_400.0)],
)
def test_young_and_daly_match_closed_forms(delta: float, mttf: float) -> None:
    young = math.sqrt(2 * delta * mttf)
    x = delta / (2 * mttf)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - delta
    assert young_interval(delta, mttf) == pytest.approx(young, rel=1e-12)
    assert daly_interval(delta, mttf) == pytest.approx(daly, rel=1e-12)


def test_daly_is_mttf_when_checkpoint_costs_two_mttfs() -> None:
    assert daly_interval(delta=200.0, mttf=100.0) == 100.0


def test_daly_lands_near_the_exact_optimum_of_the_renewal_model() -> None:
    delta, mttf, down = 10.0, 11_135.0, 300.0
    grid = [delta * 1.001**k for k in range(1, 8000)]
    best = max(grid, key=lambda t: ettr_renewal(t, delta, mttf, down))
    assert daly_interval(delta, mttf) == pytest.approx(best, rel=0.02)


def test_first_order_and_renewal_agree_when_periods_are_short() -> None:
    # (tau + delta) / M = 0.01: the models differ only at second order.
    assert ettr_first_order(100.0, 10.0, 11_000.0, 300.0) == pytest.approx(
        ettr_renewal(100.0, 10.0, 11_000.0, 300.0), abs=1e-3
    )


def test_renewal_formula() -> None:
    tau, delta, mttf, down = 1800.0, 60.0, 7200.0, 600.0
    expected = tau / (math.expm1((tau + delta) / mttf) * (mttf + down))
    assert ettr_renewal(tau, delta, mttf, down) == pytest.approx(expected, rel=1e-12)


def test_solved_downtime_reaches_the_target_exactly() -> None:
    delta, mttf = 1.0, 19_000.0
    budget = solve_downtime_for_target(0.97, delta, mttf)
    assert budget is not None
    tau = daly_interval(delta, mttf)
    assert ettr_renewal(tau, delta, mttf, budget) == pytest.approx(0.97, abs=1e-6)
    assert ettr_renewal(tau, delta, mttf, budget + 1.0) < 0.97


def test_solver_says_unreachable_when_checkpoints_alone_cost_too_much() -> None:
    assert solve_downtime_for_target(0.97, delta=60.0, mttf=3600.0) is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delta": 0.0, "mttf": 10.0}, "delta"),
        ({"delta": 1.0, "mttf": -1.0}, "mttf"),
    ],
)
def test_invalid_model_inputs_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        young_interval(**kwargs)
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        daly_interval(**kwargs)
