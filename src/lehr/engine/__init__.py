"""The training engine: a plain PyTorch package (no Kedro, DVC or MLflow imports).

Modules, in the order a run meets them: ``parts`` and ``config`` (the run's settings, declared
once), ``launch`` (torchrun or in-process) and ``worker``, ``loop`` (the outline of a run),
``start`` (fresh, resume or branch), ``code_identity`` (which code trained a run), ``memory``
(the estimate per GPU), ``step`` (one optimizer step), ``optim`` (AdamW and Muon), ``stopping``
(the stop policies), ``distributed`` (process groups), ``parallel`` (DDP and FSDP2), ``model``,
``schedule`` (LR and data mix), ``data`` (the shard stream), ``guard`` (non-finite steps and
spikes), ``hardware`` (precision profiles), ``evaluation`` (held-out metrics, samples), ``tasks``
(task scoring), ``checkpoint`` (atomic save, exact resume) and ``sharded_checkpoint`` (DCP),
``metrics`` (the run log), ``signals``, ``fp8``, ``soup``, ``export``.
"""
