"""The queue a learned engine is allowed beyond its slots (`routing.admission.engine_queue`): an engine that
keeps a request waiting while long prefills fill its steps must not have its learned slots locked or walked
down by the gateway's own cap, and configured slots (`max_concurrency`) stay exact."""

from routing.admission.admission import Admission
from routing.admission.capacity import CapacityEstimate
from routing.admission.config import AdmissionSettings
from routing.admission.metrics import AdmissionMetrics
from routing.replica import EngineLoad, Replica
from tests.test_admission import replica

TRUE_CAPACITY = 40


def prefill_bound_engine(
    estimate: CapacityEstimate, engine: Replica, scrapes: int, seed: float
) -> list[float]:
    """A saturated pool: the gateway keeps as many requests at the engine as the estimate allows; the engine
    runs all but one of them (a long prompt's prefill chunks leave one waiting each step) up to its true
    capacity, the rest wait. One scrape per second; returns the slots seen after each."""
    seen = []
    slots = seed
    for second in range(1, scrapes + 1):
        outstanding = int(slots)
        running = min(outstanding - 1, TRUE_CAPACITY)
        engine.engine = EngineLoad(waiting=outstanding - running, running=running, kv_usage=0.4, at=second)
        slots = estimate.slots([engine], float(second)).total or seed
        seen.append(slots)
    return seen


def seeded(engine_queue: int) -> tuple[CapacityEstimate, Replica]:
    estimate = CapacityEstimate(stale_s=5.0, kv_high=0.98, window_s=60.0, engine_queue=engine_queue)
    engine = replica("engine")
    engine.engine = EngineLoad(waiting=3, running=11, kv_usage=0.4, at=0.0)  # first seen saturated at 11
    estimate.slots([engine], 0.0)
    return estimate, engine


def test_without_a_queue_the_learned_slots_fall_while_prefill_keeps_one_waiting() -> None:
    estimate, engine = seeded(engine_queue=0)
    seen = prefill_bound_engine(estimate, engine, 300, 11.0)
    assert seen[-1] < 11  # each minute the peak leaves the window one lower: the engine starves


def test_with_a_queue_the_learned_slots_climb_to_what_the_engine_runs_and_hold() -> None:
    estimate, engine = seeded(engine_queue=2)
    seen = prefill_bound_engine(estimate, engine, 300, 13.0)
    assert seen[60] >= TRUE_CAPACITY  # one more a scrape: the engine's own count leads
    assert seen[-1] == TRUE_CAPACITY + 2  # it runs 40 and holds 2 of its own: no further growth
    assert max(seen) <= TRUE_CAPACITY + 3


def test_configured_slots_get_no_queue_and_a_full_kv_cache_still_stops_new_requests() -> None:
    estimate = CapacityEstimate(stale_s=5.0, kv_high=0.98, engine_queue=2)
    fixed, learned = replica("fixed", max_concurrency=8), replica("learned")
    learned.engine = EngineLoad(waiting=3, running=24, kv_usage=0.5, at=1.0)
    assert estimate.slots([fixed, learned], 1.0).total == 8 + 24 + 2
    learned.engine = EngineLoad(waiting=0, running=10, kv_usage=0.99, at=2.0)
    learned.outstanding = 10
    assert estimate.slots([fixed, learned], 2.0).total == 8 + 10


def test_the_gateway_hands_its_setting_to_the_estimate() -> None:
    engine = replica("engine")
    engine.engine = EngineLoad(waiting=3, running=24, kv_usage=0.5, at=1.0)
    for engine_queue, expected in ((None, 24), (0, 24), (2, 26), (5, 29)):  # off by default
        settings = (
            AdmissionSettings() if engine_queue is None else AdmissionSettings(engine_queue=engine_queue)
        )
        admission = Admission(
            settings, lambda: {"m": [engine]}, AdmissionMetrics(), stale_s=5.0, clock=lambda: 1.0
        )
        assert admission._slots("m").total == expected
