"""evaluate: held-out loss, perplexity and bits-per-byte of ``pre_anneal`` and anneal branches,
per source, against a unigram baseline, and every task (``scoring`` beside it, plain Python); curves
and plots across stable + anneal (``lehr.reports.plots``)."""

import pandas as pd

from lehr.params.stages import PretrainParams
from lehr.pipelines.evaluate.scoring import evaluate_models
from lehr.reports.plots import plot_curves, plot_tasks

__all__ = ["evaluate_models", "plot_tasks", "plot_training_curves"]


def plot_training_curves(stable_curve: pd.DataFrame, anneal_curve: pd.DataFrame, pretrain: PretrainParams):
    """The training curves, their task panel labelled with the sample it scored."""
    return plot_curves(stable_curve, anneal_curve, pretrain.task_examples)
