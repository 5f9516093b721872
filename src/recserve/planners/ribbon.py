"""Ribbon's pool search (Li et al., SC'21), as the Kairos paper runs it as a baseline (Kairos Sec. 7, 8.2-8.3).

Ribbon picks a heterogeneous pool by Bayesian optimisation: a Gaussian process with a Matern(5/2) kernel
over instance-count vectors, expected improvement (xi = 0.1) as the acquisition, two random starting
points, one online evaluation per step, and up to 200 steps (the bounds and settings of Ribbon's public
code).  Ribbon's own objective is the cheapest pool that meets QoS at a given load; Kairos hands it its own
problem instead (highest allowable throughput under a $/hr budget, every pool under the budget is a
candidate) and reports Ribbon on the best pool that search finds, ignoring the exploration cost (Sec. 8.2).
The objective here is whatever ``evaluate`` returns for a configuration (the caller simulates Ribbon's FCFS
dispatch on it); past 5% of the space (Kairos §8.3 reports Ribbon reaching its best pool after 5-30% of it) the
search stops once no candidate's expected improvement over the best (without the exploration margin) reaches
``tol`` of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import norm

from recserve.errors import RecserveError

MAX_EVALS = 200        # Ribbon's code stops a search after 200 BO steps
INIT_POINTS = 2        # ... after two random configurations
XI = 0.1               # ... with expected improvement's exploration margin 0.1 (objective scaled to [0, 1])
LENGTH_SCALES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # fitted by marginal likelihood each step
NOISE = 1e-6
MIN_SHARE = 0.05       # Kairos §8.3: Ribbon needed 5-30% of the space to reach its best pool; never stop before 5%


@dataclass
class SearchResult:
    config: np.ndarray            # best instance-count vector found
    value: float                  # its objective value
    evaluations: int              # configurations evaluated online
    candidates: int               # size of the search space
    trace: list[tuple[list[int], float]] = field(default_factory=list)  # (config, value) in evaluation order


def matern52(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    d = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0)) / length
    s5 = np.sqrt(5.0) * d
    return (1.0 + s5 + 5.0 * d * d / 3.0) * np.exp(-s5)


class GaussianProcess:
    """Zero-mean GP on standardised targets; the isotropic length scale maximises the marginal likelihood."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x = x
        self.mu, self.sd = float(y.mean()), float(y.std()) or 1.0
        z = (y - self.mu) / self.sd
        best = None
        for length in LENGTH_SCALES:
            k = matern52(x, x, length) + NOISE * np.eye(len(x))
            try:
                chol = cho_factor(k, lower=True)
            except np.linalg.LinAlgError:
                continue
            alpha = cho_solve(chol, z)
            loglik = -0.5 * z @ alpha - np.log(np.diag(chol[0])).sum()
            if best is None or loglik > best[0]:
                best = (loglik, length, chol, alpha)
        if best is None:
            raise RecserveError("Gaussian process: no length scale gives a positive-definite kernel")
        _, self.length, self.chol, self.alpha = best

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = matern52(xs, self.x, self.length)
        mean = ks @ self.alpha
        v = cho_solve(self.chol, ks.T)
        var = np.maximum(1.0 - (ks * v.T).sum(1), 1e-12)
        return self.mu + self.sd * mean, self.sd * np.sqrt(var)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float, xi: float) -> np.ndarray:
    a = mean - best - xi
    z = a / std
    return a * norm.cdf(z) + std * norm.pdf(z)


def bayes_opt(candidates: np.ndarray, evaluate: Callable[[np.ndarray], float], max_evals: int = MAX_EVALS,
              init_points: int = INIT_POINTS, xi: float = XI, tol: float = 1e-3, min_share: float = MIN_SHARE,
              seed: int = 0) -> SearchResult:
    """Maximise ``evaluate`` over the rows of ``candidates`` (a finite set of integer vectors) by GP/EI.

    Coordinates are scaled to [0, 1] by each column's largest value; the objective is scaled by the largest
    value seen so far, so ``xi`` and ``tol`` are fractions of the best.  The convergence stop applies only after
    ``min_share`` of the candidates have been evaluated."""
    cands = np.asarray(candidates)
    if len(cands) == 0:
        raise RecserveError("Bayesian optimisation over an empty candidate set")
    scale = np.maximum(cands.max(axis=0), 1).astype(float)
    xs = cands / scale
    rng = np.random.default_rng(seed)
    seen: list[int] = []
    values: list[float] = []
    remaining = np.ones(len(cands), dtype=bool)

    def run(i: int) -> None:
        seen.append(i)
        values.append(float(evaluate(cands[i])))
        remaining[i] = False

    for i in rng.choice(len(cands), size=min(init_points, len(cands)), replace=False).tolist():
        run(int(i))
    min_evals = math.ceil(min_share * len(cands))
    while len(seen) < min(max_evals, len(cands)):
        y = np.array(values)
        top = y.max()
        if top <= 0:  # nothing served yet: the GP has no shape to follow, keep sampling at random
            run(int(rng.choice(np.flatnonzero(remaining))))
            continue
        gp = GaussianProcess(xs[seen], y / top)
        idx = np.flatnonzero(remaining)
        mean, std = gp.predict(xs[idx])
        if len(seen) >= min_evals and expected_improvement(mean, std, 1.0, 0.0).max() < tol:
            break  # converged: no candidate is expected to beat the best by ``tol`` of it
        run(int(idx[int(np.argmax(expected_improvement(mean, std, 1.0, xi)))]))
    best = int(np.argmax(values))
    return SearchResult(cands[seen[best]].copy(), values[best], len(seen), len(cands),
                        [(cands[i].tolist(), v) for i, v in zip(seen, values, strict=True)])


def ribbon_search(types: Sequence[str], prices: dict[str, float], caps: dict[str, int], budget: float,
                  evaluate: Callable[[dict[str, int]], float], max_evals: int = MAX_EVALS,
                  seed: int = 0) -> SearchResult:
    """Ribbon's BO over every pool of ``types`` under ``budget`` (per-type ``caps``), maximising ``evaluate``
    (the allowable throughput of Ribbon's FCFS dispatch on the pool, in Kairos' comparison)."""
    from recserve.planners.kairos import enumerate_configs

    types = list(types)
    configs = enumerate_configs([prices[t] for t in types], [int(caps.get(t, 10**6)) for t in types], budget)
    return bayes_opt(configs, lambda row: evaluate(dict(zip(types, row.tolist(), strict=True))),
                     max_evals=max_evals, seed=seed)
