"""The training engine: a plain PyTorch package (no Kedro, DVC or MLflow imports).

Modules, in the order a run meets them: ``parts`` and ``config`` (the run's settings, declared
once), ``launch`` (torchrun or in-process) and ``worker``, ``loop`` (the outline of a run),
``start`` (fresh, resume or branch), ``step`` (one optimizer step), ``stopping`` (the stop
policies), ``distributed`` (process groups), ``model``, ``schedule`` (LR and data mix), ``data``
(the shard stream), ``guard`` (non-finite steps), ``hardware`` (precision profiles),
``evaluation`` (held-out metrics, samples), ``checkpoint`` (atomic save, exact resume),
``metrics`` (the run log), ``signals``, ``fp8``, ``soup``, ``export``.
"""
