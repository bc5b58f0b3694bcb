"""The Kedro stages, one package each (``nodes.py``, ``pipeline.py``), thin: they hand the catalog's
datasets and the params to the rooms that do the work. ``evaluate/scoring.py`` is the exception
that sits beside its stage: which models evaluate scores and how, in plain Python."""
