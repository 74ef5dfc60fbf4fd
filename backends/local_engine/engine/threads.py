"""How many CPU threads a step uses (issue 14): all of them while the cores are ours, one when they are not.

With OpenMP threads that spin briefly between parallel regions (GOMP_SPINCOUNT=30000) a second thread pays
at every step size: batch-1 int4 decode 11.2 ms/step against 17.2 on one thread, and through the server
1 / 4 / 16 / 32 clients at ~75 / 209 / 318 / 354 tok/s against 60 / 157 / 240 / 295 with sleeping (PASSIVE)
waits and one thread for steps of <= 8 tokens (studies/README.md, "Client table"). Next to a process that keeps
a core busy the same setting collapses (16 clients 87 against 200 tok/s), because every parallel region waits
for the thread the neighbour displaced. `CpuShare` therefore watches how much of this process's CPUs other
processes use (/proc/stat against /proc/self/stat, at most every `period` seconds) and lowers the thread
count to the cores left free; measuring steps instead (a per-size chooser with retries, tried first) did not
see a neighbour that was there from the start.

`configure_openmp` sets the process's OpenMP waits before torch starts: short spins when the thread count
follows the free cores, PASSIVE (sleep at once) for the fixed rule.
"""

import math
import os
import time

SPIN_COUNT = "30000"


def configure_openmp(adaptive: bool) -> None:
    """Call before torch is imported (libgomp reads these once); leaves values the user set alone."""
    if adaptive:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    else:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if os.environ.get("GOMP_SPINCOUNT") == SPIN_COUNT:  # ours, inherited from an adaptive parent: it
            del os.environ["GOMP_SPINCOUNT"]  # would override PASSIVE's zero spins


def _busy_ticks(cpus: set[int], stat: str) -> int | None:
    """Busy clock ticks (all but idle and iowait) summed over `cpus`, from /proc/stat's text."""
    total, seen = 0, 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = [int(v) for v in rest.split()]
        total += sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
        seen += 1
    return total if seen else None


def _own_ticks(stat: str) -> int:
    """This process's user + system clock ticks, from /proc/self/stat's text."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


class CpuShare:
    """Threads a step may use: `most`, less the cores other processes kept busy over the last `period`."""

    def __init__(
        self, most: int, period: float = 0.25, proc: str = "/proc", yield_above: float = 0.5
    ) -> None:
        """`yield_above`: a thread is given up for each core's worth of others' use beyond this fraction."""
        self.most, self.period, self.proc = max(1, most), period, proc
        self.yield_above = yield_above
        try:
            self.cpus = os.sched_getaffinity(0)
        except AttributeError:  # not Linux
            self.cpus = set(range(os.cpu_count() or 1))
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.threads = self.most
        self._last: tuple[float, int, int] | None = None

    def allowed(self, now: float | None = None) -> int:
        if self.most == 1:
            return 1
        now = time.monotonic() if now is None else now
        if self._last is not None and now - self._last[0] < self.period:
            return self.threads
        sample = self._sample()
        if sample is None:
            return self.most
        if self._last is not None:
            elapsed_ticks = (now - self._last[0]) * self.hz
            others = ((sample[0] - self._last[1]) - (sample[1] - self._last[2])) / max(elapsed_ticks, 1e-9)
            spare = len(self.cpus) - math.ceil(max(others, 0.0) - self.yield_above)
            self.threads = max(1, min(self.most, spare))
        self._last = (now, *sample)
        return self.threads

    def _sample(self) -> tuple[int, int] | None:
        try:
            with open(f"{self.proc}/stat") as system, open(f"{self.proc}/self/stat") as own:
                busy = _busy_ticks(self.cpus, system.read())
                mine = _own_ticks(own.read())
        except (OSError, ValueError, IndexError):
            return None
        return None if busy is None else (busy, mine)
