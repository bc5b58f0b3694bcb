"""More than one process: starting them, their process groups, and how the model is spread."""
