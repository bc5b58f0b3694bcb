"""The Kedro hooks ``settings.py`` installs: the config in force (``config_in_force``), MLflow
tracking (``mlflow_tracking``) and each stage's first and last line (``stage_lines``)."""
