"""soup: average anneal branches into one more branch (optional; not a DVC stage)."""

from lehr.pipelines.soup.pipeline import create_pipeline

__all__ = ["create_pipeline"]
