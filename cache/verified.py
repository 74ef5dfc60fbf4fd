"""Verified semantic hits: an answer serves a paraphrase only once labelled outcomes certify, at 95 %
confidence, that hits at that verifier score are wrong at most δ (the policy's `max_error`) of the time.

Why: the verifier's score does not rank right above wrong equally well on every kind of text (0.96
precision on written paraphrases, 0.77 on natural question pairs at the same static threshold), so one
global threshold cannot promise an error rate. As in vCache (ICLR 2026), the threshold is learned online
from outcomes, per cached entry as well as per namespace (tenant × model × endpoint).

Labels. An outcome is (score, wrong) for one candidate: the verifier's probability that the stored
answer serves the new question, and whether it did. They come from the gateway itself
(cache/labelling.py): a candidate that is not served is "explored": the request goes upstream as any
miss does, and the fresh answer is compared with the candidate's stored one, at no extra upstream cost;
a sampled share of served hits is re-asked upstream in the background (shadow checks); a hit reported
wrong (`x-cache-feedback: wrong`, the admin feedback route) counts as a wrong outcome.

The rule (Learn then Test, fixed-sequence testing; Angelopoulos et al. 2021). For a set of outcomes,
the candidate thresholds are the levels of LEVELS, tested from the strictest down. A level is tested
once at least n_min(δ) outcomes scored at or above it (fewer could not certify δ even without an
error); it passes when the one-sided Clopper-Pearson upper bound on the error rate of those outcomes is
≤ δ. Testing stops at the first tested level that fails; the threshold is the lowest level that passed
(none: nothing serves). Fixed-sequence testing needs no multiplicity correction: the chance that any
passed level's true error exceeds δ is at most 1 − confidence.

A candidate serves when its score is (1) above its entry's veto: the highest score at which the entry
was wrong while wrong more often than δ among its own outcomes scored at least that, and (2) at or
above the threshold certified by its namespace's outcomes, or by its own entry's outcomes alone (an
entry that answers many phrasings alike earns a lower threshold of its own; one that was mostly wrong
at a score never serves at or below it while that record stands). An entry with too little evidence therefore serves
only above its namespace's certified threshold, and a new namespace serves nothing until it has
n_min(δ) outcomes: 150 for δ = 0.02, 299 for 0.01, 59 for 0.05.

State is in this process (each replica learns on its own: more conservative, never less) and bounded
(VerifiedSettings: outcomes kept per namespace and per entry, namespaces and entries kept)."""

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from cache.config import VerifiedSettings

LEVELS = tuple(round(0.30 + 0.01 * i, 2) for i in range(70)) + (0.995, 0.999)  # 0.30 … 0.99, 0.995, 0.999
NOTHING = math.inf  # the threshold when no level is certified
LOOK_EVERY = 16


def exceeds(errors: int, n: int, max_error: float, confidence: float) -> bool:
    """Whether the one-sided Clopper-Pearson upper bound on a binomial rate (errors of n) exceeds max_error:
    it does unless seeing at most `errors` would be rarer than 1 − confidence were the rate max_error."""
    if n <= 0 or errors >= n:
        return True
    return binomial_cdf(errors, n, max_error) > 1.0 - confidence


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p): the pmf by its ratio recurrence, in log space, summed."""
    i = np.arange(k, dtype=np.float64)
    steps = np.log((n - i) / (i + 1)) + math.log(p / (1.0 - p))
    log_pmf = n * math.log1p(-p) + np.concatenate(([0.0], np.cumsum(steps)))
    top = float(log_pmf.max())
    return min(1.0, math.exp(top) * float(np.exp(log_pmf - top).sum()))


def minimum_outcomes(max_error: float, confidence: float) -> int:
    """The fewest outcomes that can certify max_error: all of them right."""
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - max_error))


def certified_threshold(scores: np.ndarray, wrong: np.ndarray, max_error: float, confidence: float) -> float:
    """The lowest level of LEVELS that fixed-sequence testing certifies (module docstring); NOTHING if none."""
    if scores.size == 0:
        return NOTHING
    n_min = minimum_outcomes(max_error, confidence)
    order = np.argsort(-scores, kind="stable")
    ordered, errors = scores[order], np.cumsum(wrong[order])
    passed = NOTHING
    for level in reversed(LEVELS):
        n = int(np.searchsorted(-ordered, -level, side="right"))  # outcomes scored ≥ level
        if n < n_min:
            continue
        if exceeds(int(errors[n - 1]), n, max_error, confidence):
            break
        passed = level
    return passed


@dataclass
class Certificate:
    """The threshold certified for one δ, and the looks taken to certify it."""

    threshold: float = NOTHING
    looks: int = 0
    at: int = 0  # outcomes added when the last look was taken


@dataclass
class Outcomes:
    """A bounded window of (score, wrong) outcomes and the threshold certified from it per δ in use.

    Thresholds are re-tested as outcomes arrive, and testing again and again at 95 % would certify a bad
    level sooner or later. So a threshold may only fall at a "look", taken once at least n_min(δ) outcomes
    are held and then whenever the outcomes added since the last look reach those added before it (the
    evidence doubles; once the window is full, whenever a window's worth is new); look k tests at confidence 1 − (1 − c)·6/(π²k²), so the looks' error chances sum to
    at most 1 − c. A wrong outcome re-tests at once at the last look's confidence: it can only raise it."""

    limit: int
    confidence: float
    scores: deque[float] = field(init=False)
    wrong: deque[bool] = field(init=False)
    added: int = 0
    _certificates: dict[float, Certificate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores, self.wrong = deque(maxlen=self.limit), deque(maxlen=self.limit)

    def track(self, max_errors: Iterable[float]) -> "Outcomes":
        """Starts the looks for these δ now, before a decision asks for them."""
        for max_error in max_errors:
            self._certificates.setdefault(max_error, Certificate())
        return self

    def add(self, score: float, wrong: bool) -> None:
        self.scores.append(score)
        self.wrong.append(wrong)
        self.added += 1
        for max_error, certificate in self._certificates.items():
            due = self.added - certificate.at >= max(LOOK_EVERY, min(certificate.at, self.limit))
            if due and len(self.scores) >= minimum_outcomes(max_error, self.confidence):
                certificate.looks += 1
                certificate.at = self.added
                certificate.threshold = self._compute(max_error, certificate.looks)
            elif wrong and certificate.looks:
                certificate.threshold = max(
                    certificate.threshold, self._compute(max_error, certificate.looks)
                )

    def threshold(self, max_error: float) -> float:
        certificate = self._certificates.get(max_error)
        if certificate is None:  # a δ seen for the first time: its looks start now
            certificate = self._certificates[max_error] = Certificate()
        return certificate.threshold

    def errors(self) -> int:
        return int(sum(self.wrong))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The window as arrays: scores (float64) and wrong (0/1)."""
        scores = np.fromiter(self.scores, dtype=np.float64, count=len(self.scores))
        return scores, np.fromiter(self.wrong, dtype=np.int64, count=len(self.wrong))

    def _compute(self, max_error: float, look: int) -> float:
        scores, wrong = self.arrays()
        confidence = 1.0 - (1.0 - self.confidence) * 6.0 / (math.pi**2 * look * look)
        return certified_threshold(scores, wrong, max_error, confidence)

    def __len__(self) -> int:
        return len(self.scores)


@dataclass
class EntryOutcomes:
    """One entry's own outcomes, and per δ the score at or below which its own record forbids it."""

    own: Outcomes
    _vetoes: dict[float, float] = field(default_factory=dict)

    def add(self, score: float, wrong: bool) -> None:
        self.own.add(score, wrong)
        self._vetoes.clear()

    def veto(self, max_error: float) -> float:
        """The highest score at which this entry was wrong while, counting its outcomes scored at least
        that, it was wrong more often than max_error (-inf: none). One look-alike that scored high among
        many right paraphrases does not close an entry; an entry mostly wrong at a score does."""
        cached = self._vetoes.get(max_error)
        if cached is None:
            scores, wrong = self.own.arrays()
            order = np.argsort(-scores, kind="stable")
            errors, counts = np.cumsum(wrong[order]), np.arange(1, scores.size + 1)
            bad = (wrong[order] == 1) & (errors > max_error * counts)
            cached = self._vetoes[max_error] = float(scores[order][bad].max()) if bad.any() else -math.inf
        return cached


@dataclass(frozen=True)
class Decision:
    serve: bool
    threshold: float  # the threshold that applied (NOTHING when none is certified)


class VerifiedLearner:
    """Outcomes per namespace and per entry, and the serve decision they certify."""

    def __init__(self, settings: VerifiedSettings) -> None:
        self.settings = settings
        self._namespaces: OrderedDict[str, Outcomes] = OrderedDict()
        self._entries: OrderedDict[str, EntryOutcomes] = OrderedDict()
        self._max_errors: set[float] = set()  # every δ a decision has asked for: new outcomes track them

    def decide(self, namespace: str, key: str, score: float, max_error: float) -> Decision:
        """Whether the entry `key` may serve a question it scores `score` for, at error bound max_error."""
        self._max_errors.add(max_error)
        pool = self._namespaces.get(namespace)
        threshold = pool.threshold(max_error) if pool is not None else NOTHING
        entry = self._entries.get(key)
        if entry is not None:
            veto = entry.veto(max_error)
            if score <= veto:
                return Decision(False, max(threshold, veto))
            threshold = min(threshold, entry.own.threshold(max_error))
        return Decision(score >= threshold, threshold)

    def record(self, namespace: str, key: str, score: float, wrong: bool, pooled: bool = True) -> None:
        """One labelled outcome of entry `key` in `namespace` (`pooled`: also one of the namespace's)."""
        if pooled:
            pool = self._namespaces.get(namespace)
            if pool is None:
                pool = self._namespaces[namespace] = self._outcomes(self.settings.outcomes_per_namespace)
                _trim(self._namespaces, self.settings.max_namespaces)
            self._namespaces.move_to_end(namespace)
            pool.add(score, wrong)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = EntryOutcomes(self._outcomes(self.settings.outcomes_per_entry))
            _trim(self._entries, self.settings.max_entries)
        self._entries.move_to_end(key)
        entry.add(score, wrong)

    def _outcomes(self, limit: int) -> Outcomes:
        return Outcomes(limit, self.settings.confidence).track(self._max_errors)

    def forget(self, namespace: str | None = None) -> None:
        """Drops the outcomes of one namespace (None: all), e.g. when its entries are flushed."""
        if namespace is None:
            self._namespaces.clear()
            self._entries.clear()
        else:
            self._namespaces.pop(namespace, None)

    def snapshot(self, max_error: float) -> dict[str, dict[str, float | int]]:
        """Per namespace: outcomes, wrong ones, and the threshold certified for max_error (admin, tests)."""
        return {
            name: {"outcomes": len(o), "wrong": o.errors(), "threshold": o.threshold(max_error)}
            for name, o in self._namespaces.items()
        }


def _trim(table: OrderedDict, limit: int) -> None:
    while len(table) > limit:
        table.popitem(last=False)
