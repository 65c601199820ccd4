"""The seeded Monte Carlo run agrees with the analytic renewal model within its 95% CI."""

from __future__ import annotations

import time

import pytest

from stormwatch.plan import ettr_first_order, ettr_renewal, simulate_ettr

DAY = 86_400.0

# (interval s, write s, MTTF s, downtimes per category s, probabilities, horizon days)
CASES = [
    # Llama-3-like: MTTF 3.09 h, two kinds of failure.
    (465.0, 10.0, 11_135.0, [240.0, 720.0], [0.15, 0.85], 54.0),
    # long intervals: first order is off here, the renewal model is not.
    (3600.0, 60.0, 7200.0, [600.0], [1.0], 90.0),
    # rare failures, cheap checkpoints
    (1800.0, 5.0, 86_400.0, [120.0, 900.0, 60.0], [0.5, 0.3, 0.2], 120.0),
]


@pytest.mark.parametrize("case", CASES)
def test_monte_carlo_agrees_with_the_renewal_model_within_its_ci(case: tuple) -> None:
    tau, delta, mttf, downs, probs, days = case
    start = time.monotonic()
    mc = simulate_ettr(
        interval_s=tau,
        checkpoint_write_s=delta,
        mttf_s=mttf,
        downtimes_s=downs,
        probabilities=probs,
        horizon_s=days * DAY,
        replicas=400,
        seed=7,
    )
    mean_down = sum(d * p for d, p in zip(downs, probs, strict=True))
    assert mc.ci_low <= ettr_renewal(tau, delta, mttf, mean_down) <= mc.ci_high
    assert mc.half_width < 0.005
    assert time.monotonic() - start < 5.0


def test_monte_carlo_agrees_with_the_first_order_model_where_it_applies() -> None:
    """First order charges failures to wall time and keeps only first-order terms, so it
    is within its own second-order error (lambda * (D + tau + delta))**2 of the truth."""
    tau, delta, mttf, down = 600.0, 5.0, 86_400.0, 300.0
    mc = simulate_ettr(
        interval_s=tau,
        checkpoint_write_s=delta,
        mttf_s=mttf,
        downtimes_s=[down],
        probabilities=[1.0],
        horizon_s=120 * DAY,
        replicas=400,
        seed=3,
    )
    second_order = ((down + tau + delta) / mttf) ** 2
    assert second_order < 2e-4
    first = ettr_first_order(tau, delta, mttf, down)
    assert abs(mc.mean - first) <= mc.half_width + second_order


def test_same_seed_same_result() -> None:
    kwargs = dict(
        interval_s=600.0,
        checkpoint_write_s=10.0,
        mttf_s=5000.0,
        downtimes_s=[100.0],
        probabilities=[1.0],
        horizon_s=10 * DAY,
        replicas=20,
    )
    assert simulate_ettr(seed=1, **kwargs) == simulate_ettr(seed=1, **kwargs)
    assert simulate_ettr(seed=1, **kwargs) != simulate_ettr(seed=2, **kwargs)


def test_rejects_mismatched_categories_and_too_few_replicas() -> None:
    with pytest.raises(ValueError, match="same length"):
        simulate_ettr(
            interval_s=1,
            checkpoint_write_s=1,
            mttf_s=1,
            downtimes_s=[1, 2],
            probabilities=[1.0],
            horizon_s=10,
            replicas=10,
            seed=0,
        )
    with pytest.raises(ValueError, match="replicas"):
        simulate_ettr(
            interval_s=1,
            checkpoint_write_s=1,
            mttf_s=1,
            downtimes_s=[1],
            probabilities=[1.0],
            horizon_s=10,
            replicas=1,
            seed=0,
        )
