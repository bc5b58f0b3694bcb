"""The project around the pipeline, as an operator works it: which parameters DVC tracks,
compared experiments, the rolling run folders (listed and pruned), throwaway sandboxes and
MLflow's UI. Its paths and profile are ``lehr.paths``."""
