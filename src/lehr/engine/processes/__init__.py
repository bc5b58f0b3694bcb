"""More than one process: starting them, their process groups, how the model is spread, and each
run's share of the machine's cores or GPUs (``shares``, which one-process runs claim too)."""
