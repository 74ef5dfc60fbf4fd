"""Quality against cost for a router: the curve, APGR and CPT, next to the random router and the oracle.

A router scores each question (higher = more in need of the strong model). Sending the top share c
to the strong model gives quality q(c). PGR(c) = (q(c) − q_weak) / (q_strong − q_weak); APGR is the
area under PGR over c in [0, 1] (random routing: 0.5); CPT(x) is the least c with PGR(c) ≥ x.
"""

from dataclasses import dataclass

import numpy as np


@dataclass
class Curve:
    shares: np.ndarray  # share of questions sent to the strong model, 0..1
    quality: np.ndarray  # mean correctness at that share
    q_weak: float
    q_strong: float

    def pgr(self) -> np.ndarray:
        return (self.quality - self.q_weak) / (self.q_strong - self.q_weak)

    def apgr(self) -> float:
        pgr, x = self.pgr(), self.shares
        return float(np.sum((pgr[1:] + pgr[:-1]) * np.diff(x)) / 2)

    def cpt(self, target: float) -> float:
        """Least strong-model share recovering `target` of the quality gap."""
        reached = np.flatnonzero(self.pgr() >= target - 1e-12)
        return float(self.shares[reached[0]]) if len(reached) else 1.0

    def at(self, share: float) -> float:
        return float(np.interp(share, self.shares, self.quality))


def routing_curve(scores: np.ndarray, weak: np.ndarray, strong: np.ndarray, seed: int = 0) -> Curve:
    """Send questions to the strong model in order of falling score (ties broken at random)."""
    jitter = np.random.default_rng(seed).random(len(scores))
    order = np.lexsort((jitter, -np.asarray(scores, dtype=float)))
    gain = (strong - weak)[order]
    quality = (weak.sum() + np.concatenate([[0.0], np.cumsum(gain)])) / len(weak)
    shares = np.arange(len(weak) + 1) / len(weak)
    return Curve(shares, quality, float(weak.mean()), float(strong.mean()))


def oracle_scores(weak: np.ndarray, strong: np.ndarray) -> np.ndarray:
    return strong - weak


def random_curve(weak: np.ndarray, strong: np.ndarray) -> Curve:
    """The expected curve of random routing: a straight line from weak-only to strong-only."""
    shares = np.linspace(0, 1, 101)
    quality = weak.mean() + shares * (strong.mean() - weak.mean())
    return Curve(shares, quality, float(weak.mean()), float(strong.mean()))


def summary(name: str, curve: Curve) -> dict[str, float | str]:
    return {"router": name, "apgr": round(curve.apgr(), 4), "cpt50": round(curve.cpt(0.5), 4),
            "cpt80": round(curve.cpt(0.8), 4), **{f"q@{p}%": round(curve.at(p / 100), 4) for p in (0, 20, 50, 80, 100)}}  # fmt: skip


def print_table(title: str, rows: list[dict[str, float | str]]) -> None:
    print(f"\n{title}")
    keys = list(rows[0])
    print("  ".join(f"{k:>10}" for k in keys))
    for row in rows:
        print("  ".join(f"{v:>10}" if isinstance(v, str) else f"{v:>10.4f}" for v in row.values()))


def bootstrap_apgr(
    scores: np.ndarray, weak: np.ndarray, strong: np.ndarray, samples: int = 1000, seed: int = 0
) -> np.ndarray:
    """APGR of the router on `samples` resamplings (with replacement) of the questions."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(scores), size=(samples, len(scores)))
    return np.array(
        [routing_curve(scores[p], weak[p], strong[p], seed=i).apgr() for i, p in enumerate(picks)]
    )


def random_apgr(weak: np.ndarray, strong: np.ndarray, samples: int = 1000, seed: int = 0) -> np.ndarray:
    """APGR of `samples` random orderings of the same questions (the random router's spread)."""
    rng = np.random.default_rng(seed)
    return np.array(
        [routing_curve(rng.random(len(weak)), weak, strong, seed=i).apgr() for i in range(samples)]
    )


def interval(replicates: np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval."""
    low, high = np.percentile(replicates, [2.5, 97.5])
    return float(low), float(high)
