"""evaluate: held-out loss, perplexity and bits-per-byte of ``pre_anneal`` and anneal branches,
per source, against a unigram baseline, and every task (``lehr.scoring``, plain Python); curves
and plots across stable + anneal (``lehr.reporting``)."""

from lehr.reporting import plot_curves, plot_tasks
from lehr.scoring import evaluate_models

__all__ = ["evaluate_models", "plot_curves", "plot_tasks"]
