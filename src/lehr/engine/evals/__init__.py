"""How a model is scored: held-out loss and bits per byte, samples, and task accuracy."""
