"""Training jobs: a stage's params made the engine's config, the folders it trains into, the run
itself, and its share on the other machines of a run across several (``join``); the ladder's rungs."""
