"""The project around the pipeline: its paths and profile as conf/ describes them, which
parameters DVC tracks, compared experiments, throwaway sandboxes and MLflow's UI."""
