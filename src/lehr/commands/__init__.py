"""lehr's own commands (``python -m lehr``), one module per family, each command's arguments beside
its handler: data (corpus), checkpoints (info, export, eval, lm-eval, generate, compare),
model_folders (branches, runs, prune), ladder, experiments (check, exp, experiments, sandbox),
machines (queue, cluster, shares, join), tracking (mlflow-ui, mlflow-server), and arguments (those
several commands share). The reports they print are computed in ``lehr.reports``."""
