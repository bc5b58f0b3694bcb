"""Fitting a scaling law to a ladder's endpoints: L(N, D) = E + A / N^alpha + B / D^beta.

Chinchilla's approach 3 (Hoffmann et al. 2022), as Besiroglu et al. 2024 re-did it: the Huber
loss (delta 1e-3) of log L against the log of the law written as a log-sum-exp,
``LSE(a - alpha log N, b - beta log D, e)`` with ``A = exp(a)``, ``B = exp(b)``, ``E = exp(e)``,
minimised by L-BFGS from every point of a grid of starts, the best kept. Intervals come from
refitting resampled endpoints (a bootstrap), and a fit that did not converge, or that has fewer
endpoints than parameters, says so instead of giving a number.

N is the parameter count as the stage metrics give it (``n_params``, embeddings included); D the
tokens trained, decay included; C = the engine's FLOPs per token x D.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber, logsumexp
from tqdm.auto import tqdm

HUBER_DELTA = 1e-3
PARAMS = ("a", "b", "e", "alpha", "beta")
MIN_POINTS = len(PARAMS) + 1  # one more endpoint than the law has parameters
# Starts as Hoffmann et al.'s grid, a little coarser: 4 x 4 x 3 x 3 x 3 = 432 fits.
GRID = {
    "a": np.linspace(0, 25, 4),
    "b": np.linspace(0, 25, 4),
    "e": np.linspace(-1, 1.5, 3),
    "alpha": np.linspace(0.1, 0.8, 3),
    "beta": np.linspace(0.1, 0.8, 3),
}


TOLERANCES = {"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10_000}


class FitError(ValueError):
    """Too few endpoints, or no start that converged."""


@dataclass(frozen=True)
class Law:
    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
        with np.errstate(over="ignore"):  # a power past float range is a term of 0: the limit it tends to
            return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(d, self.beta)

    def optimal(self, flops: float, flops_per_param_token: float = 6.0) -> tuple[float, float]:
        """N*(C) and D*(C) minimising L under C = k N D (k = 6: the usual count), as Hoffmann et al.'s
        closed form: N* = G (C / k)^(beta / (alpha + beta)), G = (alpha A / (beta B))^(1 / (alpha + beta))."""
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1 / (a + b))
        n = g * (flops / flops_per_param_token) ** (b / (a + b))
        return n, flops / (flops_per_param_token * n)

    def as_dict(self) -> dict:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}


def _objective(
    theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, scale: float = 1.0
) -> tuple[float, np.ndarray]:
    """The Huber loss and its gradient: exact, where L-BFGS's finite differences cost six
    evaluations a step (the fit took most of `make ladder`'s fit stage and of its test)."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    pred = logsumexp(terms, axis=0)
    r = pred - log_l
    w = np.exp(terms - pred)  # d pred / d (a, b, e): each term's share of the sum
    d_pred = np.stack([w[0], w[1], w[2], -w[0] * log_n, -w[1] * log_d])  # ... and d (alpha, beta)
    slope = np.clip(r, -HUBER_DELTA, HUBER_DELTA)  # Huber's derivative
    return float(huber(HUBER_DELTA, r).sum() * scale), (d_pred @ slope) * scale


def fit(n: np.ndarray, d: np.ndarray, loss: np.ndarray, starts: dict = GRID) -> Law:
    """The law through the endpoints (N, D, held-out loss in nats); refused, saying why, when the
    endpoints are too few or no start converged."""
    n, d, loss = (np.asarray(x, dtype=np.float64) for x in (n, d, loss))
    if len(loss) < MIN_POINTS or len(set(n)) < 2 or len(set(d)) < 2:
        raise FitError(
            f"{len(loss)} endpoints of {len(set(n))} sizes and {len(set(d))} token counts: the law has "
            f"{len(PARAMS)} parameters, so a fit needs at least {MIN_POINTS} endpoints over at least 2 "
            "sizes and 2 token counts. Add sizes (ladder.sizes) or budgets (ladder.budgets)."
        )
    args = (np.log(n), np.log(d), np.log(loss))
    best = None
    for start in itertools.product(*starts.values()):  # scipy's tolerances: where is the basin?
        r = minimize(_objective, np.array(start), args=args, method="L-BFGS-B", jac=True)
        if r.success and np.all(np.isfinite(r.x)) and (best is None or r.fun < best.fun):
            best = r
    if best is not None:
        # Then to its bottom, the loss divided by delta: residuals of ~1e-2 lie on Huber's linear
        # part, where the plain sum is so small that L-BFGS stops near its start (a bootstrap
        # refit would then barely move, and its intervals would shrink to nothing).
        polish = (*args, 1 / HUBER_DELTA)
        best = minimize(_objective, best.x, args=polish, method="L-BFGS-B", jac=True, options=TOLERANCES)
    if best is None or not best.success or not np.all(np.isfinite(best.x)):
        raise FitError(f"no start of {math.prod(len(v) for v in starts.values())} converged")
    a, b, e, alpha, beta = best.x
    return Law(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)


def bootstrap(n, d, loss, law: Law, resamples: int, seed: int = 0) -> list[Law]:
    """Refits to endpoints drawn with replacement, each started from ``law`` (the full fit) rather
    than the whole grid; resamples of too few distinct points, or that do not converge, are left out."""
    n, d, loss = (np.asarray(x, dtype=np.float64) for x in (n, d, loss))
    rng = np.random.default_rng(seed)
    laws = []
    for _ in tqdm(range(resamples), desc="bootstrap refits", unit="fit", mininterval=1.0):
        pick = rng.integers(0, len(loss), len(loss))
        try:
            laws.append(fit(n[pick], d[pick], loss[pick], _start_at(law)))
        except FitError:
            continue
    return laws


def _start_at(law: Law) -> dict:
    """One start for ``fit``: the full fit's parameters (a refit to nearly the same points)."""
    return {
        "a": [math.log(law.A)],
        "b": [math.log(law.B)],
        "e": [math.log(law.E)],
        "alpha": [law.alpha],
        "beta": [law.beta],
    }


def interval(values: list[float]) -> list[float]:
    """The 2.5% and 97.5% points."""
    lo, hi = np.percentile(np.asarray(values, dtype=np.float64), [2.5, 97.5])
    return [float(lo), float(hi)]


def isoflop(points: list[dict], flops: float) -> dict | None:
    """Approach 2 at one FLOP budget: each size's loss at that budget, interpolated in log tokens
    between its endpoints, and a parabola in log N through them, whose minimum is N*. None with
    fewer than 3 sizes whose endpoints span the budget."""
    at = []
    for size in sorted({p["n_params"] for p in points}):
        rung = sorted((p for p in points if p["n_params"] == size), key=lambda p: p["tokens"])
        tokens = flops / rung[0]["flops_per_token"]
        lo = [p for p in rung if p["tokens"] <= tokens]
        hi = [p for p in rung if p["tokens"] >= tokens]
        if lo and hi:
            p, q = lo[-1], hi[0]
            w = 0.0 if p is q else math.log(tokens / p["tokens"]) / math.log(q["tokens"] / p["tokens"])
            at.append((size, tokens, (1 - w) * p["loss"] + w * q["loss"]))
    if len(at) < 3:
        return None
    x = np.log([s for s, _, _ in at])
    c2, c1, c0 = np.polyfit(x, [loss for _, _, loss in at], 2)
    optimum = math.exp(-c1 / (2 * c2)) if c2 > 0 else None  # a parabola open downwards has no minimum
    return {
        "flops": flops,
        "sizes": [{"n_params": s, "tokens": t, "loss": loss} for s, t, loss in at],
        "parabola": [float(c2), float(c1), float(c0)],
        "n_opt": optimum,
        # A minimum outside the sizes measured is the parabola's extrapolation, not a measurement.
        "n_opt_within_sizes": optimum is not None and at[0][0] <= optimum <= at[-1][0],
    }


CHINCHILLA = {"alpha": 0.34, "beta": 0.28, "tokens_per_param": 20.0}  # Hoffmann et al. 2022


def endpoints(rungs: list[dict]) -> list[dict]:
    """Every (rung, budget) endpoint, with its rung's size and FLOPs per token."""
    return [
        {**e, "n_params": r["n_params"], "flops_per_token": r["flops_per_token"], "depth": r["depth"]}
        for r in sorted(rungs, key=lambda r: r["n_params"])
        for e in r["endpoints"]
    ]


def report(rungs: list[dict], flop_budgets: list[float], resamples: int, seed: int = 0) -> dict:
    """The ladder's fit as ``ladder.json`` holds it: the law with intervals, the isoFLOP view, the
    compute-optimal sizes at ``flop_budgets``, and the held-out-rung check. Every part that could
    not be computed says why (``status``) instead of holding a number."""
    points = endpoints(rungs)
    n, d, loss = (np.array([p[k] for p in points], dtype=np.float64) for k in ("n_params", "tokens", "loss"))
    # C = k N D: k is the engine's FLOPs per token per parameter, fitted over the rungs (6 for
    # a count of the weight matmuls alone; attention adds to it at short widths).
    k = float(np.sum(n * np.array([p["flops_per_token"] for p in points])) / np.sum(n * n))
    out: dict = {"points": points, "flops_per_param_token": k, "chinchilla": CHINCHILLA}
    try:
        law = fit(n, d, loss)
    except FitError as e:
        return out | {"status": f"not fitted: {e}"}
    laws = bootstrap(n, d, loss, law, resamples, seed)
    out |= {
        "status": "fitted",
        "law": law.as_dict(),
        "bootstrap": {"resamples": resamples, "converged": len(laws)},
        "bootstrap_laws": [w.as_dict() for w in laws],
    }
    if len(laws) >= 10:
        out["intervals"] = {
            key: interval([getattr(w, key) for w in laws]) for key in ("E", "A", "B", "alpha", "beta")
        }
    out["curves"] = _curves(law, points, k)
    out["optimal"] = [_optimal(law, laws, c, k) for c in flop_budgets]
    out["isoflop"] = [v for c in flop_budgets if (v := isoflop(points, c)) is not None]
    out["holdout"] = _holdout(points)
    out["leave_one_out"] = _leave_one_out(points, law)
    return out


def _curves(law: Law, points: list[dict], k: float) -> dict:
    """The fitted law as the plot draws it: each size's loss against FLOPs, past its endpoints on
    both sides, and the compute-optimal frontier over the whole range."""
    out = {}
    for size in sorted({p["n_params"] for p in points}):
        rung = sorted((p for p in points if p["n_params"] == size), key=lambda p: p["tokens"])
        tokens = np.geomspace(rung[0]["tokens"] / 2, rung[-1]["tokens"] * 2, 40)
        out[str(size)] = {
            "flops": (tokens * rung[0]["flops_per_token"]).tolist(),
            "loss": law.loss(size, tokens).tolist(),
        }
    flops = np.geomspace(min(p["flops"] for p in points) / 2, max(p["flops"] for p in points) * 2, 40)
    n, d = (np.array(v) for v in zip(*(law.optimal(c, k) for c in flops), strict=True))
    out["compute-optimal"] = {"flops": flops.tolist(), "loss": law.loss(n, d).tolist()}
    return out


def _optimal(law: Law, laws: list[Law], flops: float, k: float) -> dict:
    n_opt, d_opt = law.optimal(flops, k)
    row: dict = {"flops": flops, "n_params": n_opt, "tokens": d_opt, "tokens_per_param": d_opt / n_opt}
    if len(laws) >= 10:
        opts = [w.optimal(flops, k) for w in laws]
        row["intervals"] = {
            "n_params": interval([o[0] for o in opts]),
            "tokens": interval([o[1] for o in opts]),
            "tokens_per_param": interval([o[1] / o[0] for o in opts]),
        }
    return row


def _holdout(points: list[dict]) -> dict:
    """Fit on every rung but the largest and predict the largest's endpoints: the error says how
    far the ladder's extrapolation can be trusted."""
    largest = max(p["n_params"] for p in points)
    train = [p for p in points if p["n_params"] != largest]
    test = [p for p in points if p["n_params"] == largest]
    try:
        n, d, loss = (
            np.array([p[k] for p in train], dtype=np.float64) for k in ("n_params", "tokens", "loss")
        )
        law = fit(n, d, loss)
    except FitError as e:
        return {"status": f"not fitted: {e}"}
    rows = []
    for p in test:
        predicted = float(law.loss(p["n_params"], p["tokens"]))
        # bits per byte scale with the loss: the same held-out windows, so the same bytes per token
        rows.append(
            {
                "tokens": p["tokens"],
                "loss": p["loss"],
                "predicted_loss": predicted,
                "bpb": p["bpb"],
                "predicted_bpb": p["bpb"] * predicted / p["loss"],
                "error": predicted / p["loss"] - 1,
            }
        )
    return {
        "status": "fitted",
        "n_params": largest,
        "endpoints": rows,
        "max_abs_error": max(abs(r["error"]) for r in rows),
    }


def _leave_one_out(points: list[dict], law: Law) -> dict:
    """Each endpoint predicted by the law refitted without it: how well the law interpolates at a
    point it did not see. The default run is one (the depth-3 rung's largest budget: its model,
    stable phase and anneal), so its row says what a prediction of that run is worth beyond the fit
    through it. Each refit starts from the full fit, and from the whole grid where that stalls."""
    rows = []
    for i, p in enumerate(points):
        n, d, loss = (
            np.array([q[k] for j, q in enumerate(points) if j != i]) for k in ("n_params", "tokens", "loss")
        )
        try:
            try:
                refit = fit(n, d, loss, _start_at(law))
            except FitError:
                refit = fit(n, d, loss)
        except FitError as e:
            return {"status": f"not fitted: {e}"}
        predicted = float(refit.loss(p["n_params"], p["tokens"]))
        rows.append(
            {
                "depth": p["depth"],
                "tokens": p["tokens"],
                "loss": p["loss"],
                "error": predicted / p["loss"] - 1,
            }
        )
    return {"status": "fitted", "endpoints": rows, "max_abs_error": max(abs(r["error"]) for r in rows)}


def predict(fitted: dict, n_params: float, tokens: float) -> dict:
    """The held-out loss and bits per byte the committed fit predicts at (N, D), with the interval
    of its bootstrap refits."""
    if fitted.get("status") != "fitted":
        raise FitError(
            f"the ladder's fit has no law to predict with ({fitted.get('status')}): run `make ladder`"
        )
    for name, value in (("--params", n_params), ("--tokens", tokens)):
        if not (math.isfinite(value) and value > 0):
            raise FitError(
                f"{name} {value} is no count to predict at: give a positive, finite number (e.g. 2e6)"
            )
    law = Law(**fitted["law"])
    loss = float(law.loss(n_params, tokens))
    # nats -> bits per byte: the ratio every endpoint shows (one set of held-out windows)
    per = float(np.median([p["bpb"] / p["loss"] for p in fitted["points"]]))
    out: dict = {"n_params": n_params, "tokens": tokens, "loss": loss, "bpb": loss * per}
    # Past the ladder's largest rung or budget the law extrapolates: the interval says how well
    # the rungs pin it, not whether the law still holds there.
    largest = {
        "n_params": max(p["n_params"] for p in fitted["points"]),
        "tokens": max(p["tokens"] for p in fitted["points"]),
    }
    out["beyond"] = {k: largest[k] for k, v in (("n_params", n_params), ("tokens", tokens)) if v > largest[k]}
    samples = [Law(**w) for w in fitted.get("bootstrap_laws", [])]
    if len(samples) >= 10:
        losses = [float(w.loss(n_params, tokens)) for w in samples]
        out["loss_interval"] = interval(losses)
        out["bpb_interval"] = [v * per for v in out["loss_interval"]]
    return out
