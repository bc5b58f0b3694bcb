"""The project around the pipeline, as an operator works it: compared experiments, the rolling run
folders (listed and pruned), queues of experiments on one machine, sweeps on a SLURM cluster,
throwaway sandboxes, and MLflow's UI and team server. Its paths and profile are ``lehr.paths``."""
