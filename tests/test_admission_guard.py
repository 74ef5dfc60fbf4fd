"""Latency feedback (routing/admission/guard.py): a class's share of a saturated pool is cut while a class
above it misses its TTFT target, given back as the target is met, shared across replicas, and can be off."""

import asyncio

import pytest
from redis.asyncio import Redis

from routing.admission.admission import Admission
from routing.admission.capacity import Slots
from routing.admission.config import AdmissionSettings, SloGuardSettings
from routing.admission.guard import SloGuard
from routing.admission.metrics import AdmissionMetrics
from tests.policies_support import REDIS_URL
from tests.test_admission import Clock, cancel_all, make_gate, settle, ticket
from tests.test_admission_fleet import ticket as loop_ticket
from tests.test_admission_fleet import two_replicas


def guard(clock: Clock, **settings: object) -> SloGuard:
    config = AdmissionSettings(slo_guard=SloGuardSettings(**settings))
    return SloGuard(config.slo_guard, config.classes, clock)


def miss(g: SloGuard, clock: Clock, service: str = "interactive", n: int = 10, ttft_s: float = 5.0) -> None:
    for _ in range(n):
        g.observe_ttft(service, ttft_s)  # type: ignore[arg-type]
        clock.now += 0.01


def test_misses_above_cut_the_lower_classes_and_meeting_gives_it_back() -> None:
    clock = Clock()
    g = guard(clock)
    miss(g, clock, n=10)  # interactive's target is 1 s: ten misses
    g.adjust(lambda service: True)
    assert g.factor == {"interactive": 1.0, "standard": 0.7, "batch": 0.7}
    clock.now += 0.5
    g.adjust(lambda service: True)  # within interval_s: nothing moves
    assert g.factor["batch"] == 0.7
    for _ in range(20):  # the misses stay in the window: cut after cut, down to the floor
        clock.now += 1.0
        miss(g, clock, n=1)
        g.adjust(lambda service: True)
    assert g.factor["batch"] == 0.1
    clock.now += 30.0  # the misses leave the window; met requests come in
    miss(g, clock, n=20, ttft_s=0.2)
    assert g.adjust(lambda service: True) is True
    assert g.factor["batch"] == pytest.approx(0.15)
    for _ in range(20):
        clock.now += 1.0
        g.adjust(lambda service: True)
    assert g.factor == {"interactive": 1.0, "standard": 1.0, "batch": 1.0}


def test_a_class_is_cut_only_for_misses_above_it_and_only_while_it_runs() -> None:
    clock = Clock()
    g = guard(clock)
    miss(g, clock, service="standard", n=10)  # standard misses its 2.5 s target
    g.adjust(lambda service: service != "batch")  # batch holds no slot: its misses are not batch's doing
    assert g.factor == {"interactive": 1.0, "standard": 1.0, "batch": 1.0}
    clock.now += 1.0
    g.adjust(lambda service: True)
    assert g.factor == {"interactive": 1.0, "standard": 1.0, "batch": 0.7}
    clock.now += 1.0
    miss(g, clock, service="batch", n=50)  # a class's own misses never cut it
    g.adjust(lambda service: True)
    assert g.factor["batch"] == 0.7 * 0.7 and g.factor["standard"] == 1.0


def test_too_few_outcomes_or_few_misses_cut_nothing() -> None:
    clock = Clock()
    g = guard(clock)
    miss(g, clock, n=9)  # below min_samples
    g.adjust(lambda service: True)
    assert g.factor["batch"] == 1.0
    clock.now += 1.0
    miss(g, clock, n=191, ttft_s=0.5)  # 9 missed of 200: 4.5 %, within max_miss
    g.adjust(lambda service: True)
    assert g.factor["batch"] == 1.0


def test_the_fleets_outcomes_count_and_off_means_off() -> None:
    clock = Clock()
    g = guard(clock)
    g.others = {"interactive": (0.0, 12.0)}  # another replica's interactive requests missed
    g.adjust(lambda service: True)
    assert g.factor["batch"] == 0.7 and g.local() == {}
    off = guard(clock, enabled=False)
    off.others = {"interactive": (0.0, 12.0)}
    miss(off, clock, n=20)
    assert off.adjust(lambda service: True) is False and off.factor["batch"] == 1.0 and off.local() == {}


async def test_a_cut_share_holds_the_lower_class_back_in_the_gate() -> None:
    clock = Clock()
    gate = make_gate(Slots(10.0), clock)
    miss(gate.guard, clock, n=10)
    gate.guard.adjust(lambda service: True)
    gate.guard.factor["batch"] = 0.3  # 10 slots × 0.9 × 0.3: two whole slots
    batch = [ticket(clock, "b", "batch") for _ in range(6)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in batch]
    await settle()
    assert gate.running["batch"] == 2 and gate.waiting() == 4
    gate.guard.factor["batch"] = 1.0
    gate.tick()  # a grown factor lets the queue start what fits
    await settle()
    assert gate.running["batch"] == 6
    await cancel_all(tasks)


async def test_admission_feeds_the_guard_from_its_ticks() -> None:
    admission = Admission(AdmissionSettings(tick_s=0.01), lambda: {}, AdmissionMetrics(), stale_s=5.0)
    gate = admission.gate("pool")
    gate._capacity = lambda: Slots(10.0)
    now = asyncio.get_running_loop().time()
    await gate.admit(loop_ticket("b", "batch", now))  # batch holds a slot
    for _ in range(10):
        gate.guard.observe_ttft("interactive", 3.0)
    admission.start()
    await asyncio.sleep(0.1)
    await admission.aclose()
    assert gate.guard.factor["batch"] == 0.7
    assert admission.metrics.share_factor.labels("pool", "batch")._value.get() == 0.7


async def test_replicas_see_each_others_outcomes_through_redis() -> None:
    redis = Redis.from_url(REDIS_URL)
    a, b, sync_a, sync_b = two_replicas(AdmissionSettings(), (redis, redis))
    for _ in range(12):  # b's interactive requests miss; a runs the batch
        b.gate("pool").guard.observe_ttft("interactive", 3.0)
    await sync_b.sync()
    await sync_a.sync()
    guard_a = a.gates["pool"].guard
    assert guard_a.others == {"interactive": (0.0, 12.0)} and guard_a.local() == {}
    assert guard_a.adjust(lambda service: service == "batch") is False and guard_a.factor["batch"] == 0.7
    await redis.aclose()
