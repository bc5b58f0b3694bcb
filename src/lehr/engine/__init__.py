"""The training engine: a plain PyTorch package (no Kedro, DVC or MLflow imports).

Modules: ``model`` (the transformer), ``config`` (run configuration), ``schedule`` (LR),
``data`` (shard stream), ``checkpoint`` (atomic save, exact resume), ``hardware`` (precision
profiles), ``evaluation`` (held-out metrics, samples), ``loop`` (the training loop),
``distributed`` (process groups and the torchrun launcher).
"""
