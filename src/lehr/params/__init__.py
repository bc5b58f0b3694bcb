"""The stages' parameters: their typed classes, every check on them, and where each is set."""
