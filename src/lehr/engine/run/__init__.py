"""One training run from start to end: ``loop.train`` is its outline."""
