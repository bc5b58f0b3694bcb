"""The training stages' and the ladder's parameters (the data stages' are ``lehr.dataprep.params``):
their typed classes, every check on them, the params DVC tracks, and where each key is set."""
