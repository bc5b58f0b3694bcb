"""What the stages do between Kedro and the engine: their params and the checks on them, the
engine config and the folders a training stage trains into, the training job, the ladder's rungs,
the evaluate stage's scoring and each stage's first and last line."""
