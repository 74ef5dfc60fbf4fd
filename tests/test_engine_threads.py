"""threads.py: the thread count follows the cores other processes leave free (from /proc), OpenMP waits."""

import os
from pathlib import Path

import pytest

from backends.local_engine.engine.threads import CpuShare, _busy_ticks, _own_ticks, configure_openmp

STAT = (
    "cpu  {all} 0 0 0 0 0 0 0 0 0\ncpu0 {c0} 0 0 {i0} 0 0 0 0 0 0\ncpu1 {c1} 0 0 {i1} 0 0 0 0 0 0\nintr 1 2\n"
)
SELF = "4242 (python3 (x)) S 1 1 1 0 -1 4194304 0 0 0 0 {utime} {stime} 0 0 20 0 3 0 1 1 1\n"


class FakeProc:
    """A /proc with two CPUs whose busy ticks and this process's ticks the test advances."""

    def __init__(self, root: Path) -> None:
        (root / "self").mkdir(parents=True)
        self.root, self.busy, self.own = root, [0, 0], 0
        self.write()

    def advance(self, busy0: int, busy1: int, own: int) -> None:
        self.busy = [self.busy[0] + busy0, self.busy[1] + busy1]
        self.own += own
        self.write()

    def write(self) -> None:
        (self.root / "stat").write_text(
            STAT.format(all=sum(self.busy), c0=self.busy[0], c1=self.busy[1], i0=5, i1=5)
        )
        (self.root / "self" / "stat").write_text(SELF.format(utime=self.own, stime=0))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def share(proc: FakeProc) -> CpuShare:
    cpu = CpuShare(2, period=1.0, proc=str(proc.root))
    cpu.cpus, cpu.hz = {0, 1}, 100
    return cpu


def test_all_threads_while_only_this_process_works(proc: FakeProc) -> None:
    cpu = share(proc)
    assert cpu.allowed(now=0.0) == 2
    proc.advance(100, 100, own=200)  # both cores busy for a second, all of it ours
    assert cpu.allowed(now=1.0) == 2


def test_one_thread_while_a_neighbour_keeps_a_core_busy_and_two_when_it_leaves(proc: FakeProc) -> None:
    cpu = share(proc)
    cpu.allowed(now=0.0)
    proc.advance(100, 100, own=100)  # someone else used one core for the whole second
    assert cpu.allowed(now=1.0) == 1
    proc.advance(100, 100, own=100)  # we run one thread, it keeps its core
    assert cpu.allowed(now=1.5) == 1  # within the period: no new reading
    assert cpu.allowed(now=2.0) == 1
    proc.advance(30, 30, own=60)  # the neighbour has gone
    assert cpu.allowed(now=3.0) == 2


def test_a_light_neighbour_leaves_both_threads(proc: FakeProc) -> None:
    cpu = share(proc)
    cpu.allowed(now=0.0)
    proc.advance(100, 40, own=110)  # 0.3 of a core used by others
    assert cpu.allowed(now=1.0) == 2


@pytest.mark.parametrize(("yield_above", "threads"), [(0.5, 1), (0.9, 2)])
def test_how_much_of_a_core_others_may_take_before_a_thread_is_given_up(
    proc: FakeProc, yield_above: float, threads: int
) -> None:
    cpu = CpuShare(2, period=1.0, proc=str(proc.root), yield_above=yield_above)
    cpu.cpus, cpu.hz = {0, 1}, 100
    cpu.allowed(now=0.0)
    proc.advance(100, 70, own=100)  # others used 0.7 of a core
    assert cpu.allowed(now=1.0) == threads


def test_unreadable_proc_means_all_threads(tmp_path: Path) -> None:
    cpu = CpuShare(2, period=0.0, proc=str(tmp_path / "missing"))
    assert cpu.allowed(now=0.0) == 2 and cpu.allowed(now=1.0) == 2
    assert CpuShare(1).allowed() == 1


def test_parsers_read_the_real_files() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc here")
    assert _own_ticks(Path("/proc/self/stat").read_text()) >= 0
    assert _busy_ticks(os.sched_getaffinity(0), Path("/proc/stat").read_text()) > 0
    assert CpuShare(2).allowed() in (1, 2)


def test_openmp_waits_follow_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    configure_openmp(adaptive=True)
    assert os.environ["GOMP_SPINCOUNT"] == "30000" and "OMP_WAIT_POLICY" not in os.environ
    configure_openmp(adaptive=False)  # a fixed child of an adaptive parent drops the inherited spins
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    configure_openmp(adaptive=True)
    assert os.environ["GOMP_SPINCOUNT"] == "7"  # the user's value stays
