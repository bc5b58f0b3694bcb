from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from kedro.io import AbstractDataset, DatasetError

from lehr.atomic import write_bytes_atomic, write_text_atomic

Streams = dict[str, np.ndarray]


class TokenStreamsDataset(AbstractDataset[tuple[Streams, dict], tuple[Streams, dict]]):
    """Token arrays per stream (``train/gold``, ``heldout/sotu``...) plus their byte/token stats.

    On disk: ``<path>/<stream>.bin`` and ``<path>/streams.json``, the index written last.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> tuple[Streams, dict]:
        index_path = self._path / "streams.json"
        if not index_path.is_file():
            raise DatasetError(f"{index_path} is missing: run the tokenize stage first (`dvc repro tokenize`)")
        index = json.loads(index_path.read_text())
        dtype = np.dtype(index["dtype"])
        streams = {name: np.fromfile(self._path / f"{name}.bin", dtype=dtype) for name in index["streams"]}
        return streams, index["streams"]

    def save(self, data: tuple[Streams, dict]) -> None:
        streams, stats = data
        index_path = self._path / "streams.json"
        index_path.unlink(missing_ok=True)  # no index until every array is in place
        for old in self._path.glob("**/*.bin"):
            os.remove(old)
        for name, tokens in streams.items():
            write_bytes_atomic(self._path / f"{name}.bin", tokens.tobytes())
        dtype = str(next(iter(streams.values())).dtype)
        write_text_atomic(index_path, json.dumps({"dtype": dtype, "streams": stats}, indent=2))

    def _exists(self) -> bool:
        return (self._path / "streams.json").is_file()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}


