from __future__ import annotations

from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr.dataprep.corpus import Corpus


class CorpusDataset(AbstractDataset[None, Corpus]):
    """A read-only folder of tier folders (see ``lehr.dataprep.corpus``); loads a lazy ``Corpus``."""

    def __init__(self, path: str):
        self._path = path

    def load(self) -> Corpus:
        return Corpus(self._path)

    def save(self, data: None) -> None:
        raise DatasetError("the raw corpus is an input; lehr never writes it")

    def _describe(self) -> dict[str, Any]:
        return {"path": self._path}
