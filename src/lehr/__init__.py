"""lehr: reproducible, resumable pretraining of small decoder-only language models."""

__version__ = "0.1.0"
