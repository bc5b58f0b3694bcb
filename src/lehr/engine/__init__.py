"""The training engine: a plain PyTorch package (no Kedro, DVC or MLflow imports).

What a step computes sits at the top, where a newcomer looks first: ``model`` (the transformer),
``optim`` (AdamW and Muon: the optimizer, Muon's work over the processes, Newton-Schulz),
``schedule`` (the learning rate, the batch-size warmup and the data mix over the steps),
``batches`` (the shard stream a step draws from), ``config`` (a run's settings, declared once in
parts), ``hardware`` (precision profiles), ``fp8`` and ``memory`` (the estimate per GPU).

The rest is grouped by what it does:

- ``run``: one run from start to end: ``loop`` (its outline), ``start`` (fresh, resume or
  branch), ``update`` (the update of one optimizer step), ``guard`` (non-finite steps and
  spikes), ``plan`` (the learning rates and decisions of a plan, old and new on a resume),
  ``stopping`` (the stop policies), ``metrics`` (the run's log and its clock: ``RunLog``),
  ``tail`` (the tail average) and ``signals``;
- ``processes``: more than one process: ``launch`` (torchrun or in-process) and ``worker`` (each
  process's entry), ``distributed`` (process groups), ``parallel`` (DDP and FSDP2) and ``shares``
  (which cores or GPUs a run may use);
- ``artifacts``: what a run leaves: ``checkpoint`` (atomic, verified, exact resume),
  ``sharded_checkpoint`` (DCP under FSDP), ``run_saves`` (a run's checkpoints as the loop
  takes them), ``state`` (a checkpoint's ``state.json``, read there only), ``code_identity``
  (which code trained it), ``soup`` and ``export``;
- ``evals``: how a model is scored: ``evaluation`` (held-out loss and bits per byte, samples)
  and ``tasks`` (task scoring by log-likelihood).
"""
