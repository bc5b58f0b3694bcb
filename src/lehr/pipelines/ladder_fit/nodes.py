"""ladder_fit: the scaling law through every rung's endpoints (``lehr.reports.scaling_fit``) and its
plot (``lehr.reports.plots``)."""

from __future__ import annotations

import json
import logging

import matplotlib.pyplot as plt

from lehr.params.ladder import LadderParams
from lehr.reports.plots import plot_ladder
from lehr.reports.scaling_fit import report

log = logging.getLogger(__name__)


def fit_ladder(rungs: dict[int, dict], ladder: LadderParams) -> tuple[dict, plt.Figure]:
    missing = sorted(set(ladder.sizes) - set(rungs))
    if missing:
        raise ValueError(
            f"the ladder has no rung of size(s) {missing} yet: train them first (`make ladder` trains "
            "every size in ladder.sizes)"
        )
    recipes = {json.dumps(rungs[s].get("overrides", {}), sort_keys=True) for s in ladder.sizes}
    if len(recipes) > 1:
        raise ValueError(
            f"the ladder's rungs trained with different model overrides ({' / '.join(sorted(recipes))}): "
            "a law through them would mix recipes. Retrain the stale rungs: `make ladder` re-runs each "
            "rung whose recipe changed"
        )
    fitted = {
        **report([rungs[s] for s in ladder.sizes], ladder.flop_budgets, ladder.bootstrap),
        "family": ladder.family(json.loads(recipes.pop())),
    }
    log.info("ladder: %s", fitted["status"])
    return fitted, plot_ladder(fitted)
