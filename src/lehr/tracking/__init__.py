"""What each run came from and what it measured: provenance, and MLflow runs through a Kedro hook."""
