"""Admission by pool capacity (routing/admission): classes, fair shares, deadlines, capacity, fleet view."""

import asyncio
import math

import pytest

from backends.base import UpstreamError
from core.models import DeploymentConfig
from routing.admission.capacity import CapacityEstimate, Slots
from routing.admission.config import AdmissionSettings, ServiceClass
from routing.admission.fair import ServiceLedger, Ticket, whole_slot_shares
from routing.admission.gate import PoolGate
from routing.admission.metrics import AdmissionMetrics
from routing.breaker import CircuitBreaker
from routing.replica import EngineLoad, PeakEwma, Replica


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_gate(slots: Slots, clock: Clock, **settings: object) -> PoolGate:
    config = AdmissionSettings(**settings)
    ledger = ServiceLedger(config.share_window_s, clock=clock)
    return PoolGate("m", config, ledger, AdmissionMetrics(), lambda: slots, clock)


def ticket(clock: Clock, tenant: str = "a", service: str = "standard", cost: float = 100.0,
           weight: float = 1.0, deadline_s: float = 60.0) -> Ticket:  # fmt: skip
    return Ticket(tenant, service, weight, cost, clock.now + deadline_s, clock.now)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancels the admissions still waiting and lets them finish (a started one returned already)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_pool_with_room_starts_requests_without_waiting() -> None:
    clock = Clock()
    gate = make_gate(Slots(4.0), clock)
    held = [ticket(clock) for _ in range(3)]  # standard fills 95 % of four slots: three whole ones
    for t in held:
        await gate.admit(t)
        assert t.started is not None and t.future is None  # no queue, no future: nothing awaited
    assert gate.running["standard"] == 3


async def test_unknown_capacity_never_holds_a_request() -> None:
    clock = Clock()
    gate = make_gate(Slots(None), clock)
    for _ in range(50):
        await gate.admit(ticket(clock))
    assert gate.running["standard"] == 50 and gate.waiting() == 0


async def test_a_full_pool_queues_and_a_release_starts_the_next() -> None:
    clock = Clock()
    gate = make_gate(Slots(2.0), clock)
    first, second, third = (ticket(clock, service="interactive") for _ in range(3))
    await gate.admit(first), await gate.admit(second)
    waiting = asyncio.create_task(gate.admit(third))
    await settle()
    assert not waiting.done() and gate.waiting() == 1
    gate.release(first, 120)
    await asyncio.wait_for(waiting, 1)
    assert third.started is not None and gate.running["interactive"] == 2


async def test_higher_classes_take_freed_slots_first_and_find_headroom() -> None:
    clock = Clock()
    gate = make_gate(Slots(10.0), clock)
    batch = [ticket(clock, "b", "batch") for _ in range(12)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in batch]
    await settle()
    assert gate.running["batch"] == 9  # pool_share 0.9: one slot of ten stays free for the classes above
    interactive = ticket(clock, "i", "interactive")
    await gate.admit(interactive)  # starts at once in the headroom
    assert interactive.started is not None
    late = ticket(clock, "i", "interactive")
    waiting = asyncio.create_task(gate.admit(late))
    await settle()
    assert not waiting.done()  # pool full: it waits, ahead of the three batch requests
    gate.release(batch[0], 100)
    await asyncio.wait_for(waiting, 1)
    assert gate.running["batch"] == 8 and gate.waiting() == 3
    await cancel_all(tasks)
    assert gate.waiting() == 0


@pytest.mark.parametrize(("weights", "share"), [((1.0, 1.0), 0.5), ((2.0, 1.0), 2 / 3)])
async def test_backlogged_tenants_are_served_tokens_in_their_weights(weights: tuple[float, float],
                                                                     share: float) -> None:  # fmt: skip
    clock = Clock()
    gate = make_gate(Slots(1.0), clock)
    served = {"a": 0.0, "b": 0.0}
    holder = ticket(clock, "x")
    await gate.admit(holder)
    queued = [ticket(clock, tenant, cost=cost, weight=w)  # b asks for twice the tokens per request
              for _ in range(60) for tenant, cost, w in (("a", 100.0, weights[0]), ("b", 200.0, weights[1]))]  # fmt: skip
    tasks = [asyncio.create_task(gate.admit(t)) for t in queued]
    await settle()
    current = holder
    for _ in range(60):
        clock.now += 0.1
        gate.release(current, int(current.cost))
        await settle()
        current = next(
            t for t in queued if t.started is not None and t.tenant != "x" and not getattr(t, "done", 0)
        )
        current.done = 1  # type: ignore[attr-defined]
        served[current.tenant] += current.cost
    assert served["a"] / (served["a"] + served["b"]) == pytest.approx(share, abs=0.05)
    await cancel_all(tasks)


async def test_without_fairness_a_class_is_first_come_first_served() -> None:
    clock = Clock()
    gate = make_gate(Slots(1.0), clock, fair=False)
    holder = ticket(clock, "x")
    await gate.admit(holder)
    order = [ticket(clock, "a") for _ in range(5)] + [ticket(clock, "b") for _ in range(5)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in order]
    await settle()
    current, started = holder, []
    for _ in range(6):
        gate.release(current, 100)
        await settle()
        current = next(t for t in order if t.started is not None and t not in started)
        started.append(current)
    assert [t.tenant for t in started] == ["a"] * 5 + ["b"]
    await cancel_all(tasks)


async def test_a_request_that_cannot_start_in_time_is_refused_at_once_with_retry_after() -> None:
    clock = Clock()
    gate = make_gate(Slots(1.0), clock)
    holder = ticket(clock)
    await gate.admit(holder)
    for _ in range(4):  # the measured rate: one slot freed every 2 s
        clock.now += 2.0
        gate.release(holder, 100)
        holder = ticket(clock)
        await gate.admit(holder)
    queued = [ticket(clock) for _ in range(5)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in queued]
    await settle()
    late = ticket(clock, deadline_s=3.0)  # five ahead at ~0.5/s: ~12 s, past its 3 s deadline
    with pytest.raises(UpstreamError) as refused:
        await gate.admit(late)
    assert refused.value.status == 429 and refused.value.code == "pool_saturated"
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 5
    assert gate.waiting() == 5
    await cancel_all(tasks)
    assert gate.waiting() == 0


async def test_a_wait_that_runs_out_is_a_429_not_a_timeout() -> None:
    gate = make_gate(Slots(1.0), Clock())
    gate._clock = asyncio.get_running_loop().time  # real time for the deadline
    now = gate._clock()
    await gate.admit(Ticket("a", "standard", 1.0, 10.0, now + 60, now))
    short = Ticket("a", "standard", 1.0, 10.0, now + 0.2, now)
    with pytest.raises(UpstreamError) as refused:
        await gate.admit(short)
    assert refused.value.status == 429 and gate.waiting() == 0


async def test_waiting_requests_get_503_when_the_pool_goes_down() -> None:
    clock = Clock()
    slots = [Slots(1.0)]
    config = AdmissionSettings()
    gate = PoolGate("m", config, ServiceLedger(30, clock=clock), AdmissionMetrics(), lambda: slots[0], clock)
    await gate.admit(ticket(clock))
    waiting = asyncio.create_task(gate.admit(ticket(clock)))
    await settle()
    slots[0] = Slots(0.0, down=True, retry_after_s=12.0)
    gate.tick()
    with pytest.raises(UpstreamError) as refused:
        await waiting
    assert refused.value.status == 503 and refused.value.retry_after_s == 12.0 and gate.waiting() == 0
    await gate.admit(ticket(clock))  # a new one is not held: the router tries ejected deployments anyway


async def test_the_fleet_view_splits_a_class_grant_by_demand() -> None:
    clock = Clock()
    gate = make_gate(Slots(10.0), clock)
    gate.others = {"batch": 30.0}  # another replica has 30 batch requests running or waiting
    tasks = [asyncio.create_task(gate.admit(ticket(clock, "b", "batch"))) for _ in range(10)]
    await settle()
    # grant 9 slots to batch fleet-wide, this replica's part: 9 × 10/40
    assert gate.running["batch"] == math.ceil(9 * 10 / 40)
    gate.others = {"interactive": 5.0, "batch": 30.0}  # interactive demand elsewhere: batch gets less
    assert gate.allowance()["batch"] < 9 * 10 / 40
    await cancel_all(tasks)


def test_whole_slots_go_by_weight_and_the_odd_one_to_the_tenant_behind() -> None:
    assert whole_slot_shares(12, {"heavy": (20, 2.0), "light": (30, 1.0)}, {}) == {"heavy": 8, "light": 4}
    # a tenant asking less than its share keeps only what it asks; the others split the rest by weight
    assert whole_slot_shares(12, {"small": (2, 1.0), "a": (30, 1.0), "b": (30, 3.0)}, {}) == {
        "small": 2, "a": 3, "b": 7}  # fmt: skip
    # 7 slots cannot go 2 : 1: the odd one goes to whoever was served fewer weighted tokens
    demands = {"heavy": (20, 2.0), "light": (30, 1.0)}
    assert whole_slot_shares(7, demands, {"heavy": 1.0, "light": 2.0}) == {"heavy": 5, "light": 2}
    assert whole_slot_shares(7, demands, {"heavy": 2.0, "light": 1.0}) == {"heavy": 4, "light": 3}
    assert whole_slot_shares(12, {"a": (3, 1.0), "b": (4, 1.0)}, {}) == {"a": 3, "b": 4}  # room for all
    assert whole_slot_shares(5, {"idle": (0, 1.0)}, {}) == {}


async def test_the_fleet_view_splits_a_class_grant_by_tenant_weight_with_fair_sharing() -> None:
    """Two tenants of weights 2 : 1 behind different replicas: the class's grant goes 2 : 1 between them,
    whatever their queues' lengths (by demand it went 20 : 30 here)."""
    clock = Clock()
    gate = make_gate(Slots(12.0), clock)
    gate.others = {"standard": 30.0}
    gate.others_tenants = {"standard": {"light": (30.0, 1.0)}}
    tickets = [ticket(clock, "heavy", weight=2.0) for _ in range(20)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in tickets]
    await settle()
    # the standard class's share, 11 whole slots of 12 × 0.95, goes 7 : 4 (2 : 1 as near as whole slots go)
    assert gate.allowance()["standard"] == 7
    assert gate.running["standard"] == 7
    assert gate.tenant_demand()["standard"] == {"heavy": (20, 2.0)}
    # the same tenant on both replicas: this replica's part is its share of that tenant's fleet demand
    gate.others_tenants = {"standard": {"heavy": (20.0, 2.0), "light": (10.0, 1.0)}}
    gate.others = {"standard": 30.0}
    assert gate.allowance()["standard"] == pytest.approx(7 * 20 / 40)  # heavy's 7 slots, by its demand here
    await cancel_all(tasks)
    for t in [t for t in tickets if t.started is not None]:
        gate.release(t, 100)
    assert gate.tenant_demand()["standard"] == {}  # cancelled while waiting or released: nothing left


async def test_without_fair_sharing_the_fleet_split_stays_by_demand() -> None:
    clock = Clock()
    gate = make_gate(Slots(12.0), clock, fair=False)
    gate.others = {"standard": 30.0}
    gate.others_tenants = {"standard": {"light": (30.0, 1.0)}}
    tasks = [asyncio.create_task(gate.admit(ticket(clock, "heavy", weight=2.0))) for _ in range(20)]
    await settle()
    assert gate.allowance()["standard"] == pytest.approx(12 * 0.95 * 20 / 50)
    await cancel_all(tasks)


def test_settings_refuse_a_lower_class_with_a_larger_share() -> None:
    with pytest.raises(ValueError, match="may not fill more"):
        AdmissionSettings(classes={"batch": ServiceClass(rank=2, ttft_s=1, itl_s=1, queue_deadline_s=1,
                                                         pool_share=1.0),
                                   "standard": ServiceClass(rank=1, ttft_s=1, itl_s=1, queue_deadline_s=1,
                                                            pool_share=0.5)})  # fmt: skip


class _Backend:
    def __init__(
        self, name: str, max_concurrency: int | None = None, send_priority: bool | None = None
    ) -> None:
        self.name = name
        self.config = DeploymentConfig(name=name, base_url="http://127.0.0.1:9/v1", model="m",
                                       max_concurrency=max_concurrency, send_priority=send_priority)  # fmt: skip


def replica(name: str, max_concurrency: int | None = None, send_priority: bool | None = None) -> Replica:
    breaker = CircuitBreaker(3, 30.0, 1)
    backend = _Backend(name, max_concurrency, send_priority)
    return Replica(backend, breaker, PeakEwma(10.0), True)  # type: ignore[arg-type]


def test_a_pool_is_preemptible_only_when_every_live_deployment_takes_a_priority() -> None:
    estimate = CapacityEstimate(stale_s=5.0, kv_high=0.98)
    vllm = replica("vllm", max_concurrency=4)  # an OpenAI-compatible upstream: no priority unless told
    engine = replica("engine", max_concurrency=4, send_priority=True)
    assert not estimate.slots([vllm, engine], 0.0).preemptible
    assert estimate.slots([engine], 0.0).preemptible
    vllm.breaker.trip()  # an ejected deployment takes no request: the live ones decide
    assert estimate.slots([vllm, engine], 0.0).preemptible


async def test_where_engines_preempt_a_higher_class_starts_beside_lower_ones_holding_every_slot() -> None:
    clock = Clock()
    gate = make_gate(Slots(4.0, preemptible=True), clock)
    batch = [ticket(clock, "b", "batch") for _ in range(6)]
    tasks = [asyncio.create_task(gate.admit(t)) for t in batch]
    await settle()
    assert gate.running["batch"] == 3  # 90 % of 4: three whole slots
    chats = [ticket(clock, "i", "interactive") for _ in range(5)]
    for chat in chats[:4]:  # the engine takes batch slots back: all four interactive start at once
        await gate.admit(chat)
        assert chat.started is not None
    fifth = asyncio.create_task(gate.admit(chats[4]))
    await settle()
    assert not fifth.done()  # its own class and above still fill the pool: it waits
    gate.release(batch[0], 100)  # a lower slot freed: batch stays held (the pool is over-full) ...
    await settle()
    assert not fifth.done() and gate.running["batch"] == 2 and gate.waiting() == 4
    gate.release(chats[0], 100)  # ... an interactive one freed: the waiting interactive starts
    await asyncio.wait_for(fifth, 1)
    assert gate.running == {"interactive": 4, "standard": 0, "batch": 2}
    await cancel_all(tasks)


async def test_without_preemption_a_higher_class_waits_for_a_freed_slot() -> None:
    clock = Clock()
    gate = make_gate(Slots(4.0), clock)
    tasks = [asyncio.create_task(gate.admit(ticket(clock, "b", "batch"))) for _ in range(6)]
    await settle()
    chats = [ticket(clock, "i", "interactive") for _ in range(2)]
    await gate.admit(chats[0])  # the one slot batch leaves free
    second = asyncio.create_task(gate.admit(chats[1]))
    await settle()
    assert not second.done() and gate.running["interactive"] == 1
    await cancel_all([*tasks, second])


def test_capacity_is_configured_or_learned_from_a_saturated_engine() -> None:
    estimate = CapacityEstimate(stale_s=5.0, kv_high=0.98)
    fixed, learned = replica("fixed", max_concurrency=8), replica("learned")
    assert estimate.slots([fixed, learned], 0.0).total is None  # not seen saturated yet: not held
    learned.engine = EngineLoad(waiting=3, running=24, kv_usage=0.5, at=1.0)
    assert estimate.slots([fixed, learned], 1.0).total == 32
    learned.engine = EngineLoad(waiting=0, running=24, kv_usage=0.5, at=2.0)  # full, nothing waits: probe up
    assert estimate.slots([fixed, learned], 2.0).total == 33
    assert estimate.slots([fixed, learned], 2.5).total == 33  # one step per scrape, not per call
    learned.engine = EngineLoad(waiting=0, running=10, kv_usage=0.99, at=3.0)  # KV full: nothing new there
    learned.outstanding = 10
    assert estimate.slots([fixed, learned], 3.0).total == 18
    fixed.breaker.trip()
    assert estimate.slots([fixed, learned], 3.0).total == 10
    learned.breaker.trip()
    down = estimate.slots([fixed, learned], 3.0)
    assert down.down and 29 <= down.retry_after_s <= 30


def test_the_window_forgets_old_service_and_keeps_no_stale_buckets() -> None:
    clock = Clock()
    ledger = ServiceLedger(window_s=30.0, clock=clock)
    ledger.charge("a", 300.0, 1.0)
    ledger.charge("b", 300.0, 2.0)
    assert ledger.service(["a", "b", "c"]) == {"a": 300.0, "b": 150.0, "c": 0.0}
    for _ in range(100):  # an hour of traffic later
        clock.now += 36.0
        ledger.charge("b", 1.0, 1.0)
    assert ledger.local() == {"b": 1.0} and len(ledger._window) <= 10


def test_a_policy_names_only_known_classes() -> None:
    from policies.policy import Policy

    assert Policy(routing={"service_class": "batch", "weight": 2}).routing["weight"] == 2
    with pytest.raises(ValueError, match="service_class"):
        Policy(routing={"service_class": "gold"})
    with pytest.raises(ValueError, match="weight"):
        Policy(routing={"weight": 0})


async def test_a_small_pool_still_keeps_a_whole_slot_free_for_the_classes_above() -> None:
    clock = Clock()
    gate = make_gate(Slots(8.0), clock)
    tasks = [asyncio.create_task(gate.admit(ticket(clock, "b", "batch"))) for _ in range(10)]
    await settle()
    assert gate.running["batch"] == 7  # 90 % of 8 is 7.2 slots: 7 whole ones
    chat = ticket(clock, "i", "interactive")
    await gate.admit(chat)
    assert chat.started is not None
    await cancel_all(tasks)


def test_a_step_spent_on_prefill_does_not_shrink_the_learned_capacity() -> None:
    """Requests wait while a step's budget goes to prefill chunks with slots free: the capacity is the most
    the engine ran while requests waited over the window, not the latest count."""
    estimate = CapacityEstimate(stale_s=5.0, kv_high=0.98, window_s=60.0)
    engine = replica("engine")
    for at, running in ((1.0, 8), (2.0, 3), (3.0, 2), (4.0, 6)):
        engine.engine = EngineLoad(waiting=2, running=running, kv_usage=0.5, at=at)
        assert estimate.slots([engine], at).total == 8
    engine.engine = EngineLoad(waiting=1, running=5, kv_usage=0.5, at=70.0)  # the peak left the window
    assert estimate.slots([engine], 70.0).total == 5


def test_the_expected_wait_uses_the_fleets_queue_and_rate() -> None:
    clock = Clock()
    gate = make_gate(Slots(4.0), clock)
    gate.others_queued, gate.others_rate = {"interactive": 2.0, "standard": 6.0}, 2.0
    assert gate.expected_wait("standard") == pytest.approx(8 / 2.0)  # nothing freed here yet: theirs alone
    assert gate.expected_wait("interactive") == pytest.approx(2 / 2.0)
    for _ in range(4):
        clock.now += 0.5
        gate.rate.tick()
    assert gate.expected_wait("standard") == pytest.approx(8 / (2.0 + 4 / 1.5))
