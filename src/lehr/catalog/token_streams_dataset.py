from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr.dataprep.token_index import TokenStoreError
from lehr.dataprep.token_reader import TokenStreams, load
from lehr.dataprep.token_writer import save_index, writer_lock
from lehr.files import locks


class TokenStreamsDataset(AbstractDataset[dict, TokenStreams]):
    """The tokenize stage's token folder (see ``lehr.dataprep.token_index``).

    The encode node writes the token parts itself as it goes (the ``token_parts`` entry); saving
    here writes the index over them, last, so the folder never claims parts that are not complete.
    Loading merges the index (or the N slice indexes) into streams read a chunk at a time.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> TokenStreams:
        try:
            return load(self._path)
        except TokenStoreError as e:
            raise DatasetError(str(e)) from None

    def save(self, data: dict) -> None:
        with locks.hold(writer_lock(self._path, data["slice"]), "writing token streams"):
            save_index(self._path, data)

    def _exists(self) -> bool:
        return (self._path / "streams.json").is_file()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
