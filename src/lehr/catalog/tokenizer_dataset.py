from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError
from tokenizers import Tokenizer

from lehr import fixes
from lehr.files.atomic import write_text_atomic


class TokenizerDataset(AbstractDataset[Tokenizer, Tokenizer]):
    """An HF ``tokenizers`` ``tokenizer.json``."""

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> Tokenizer:
        if not self._path.is_file():
            raise DatasetError(
                f"tokenizer {self._path} is missing: run the tokenize stage first "
                f"(`{fixes.rebuild('tokenize')}`)"
            )
        return Tokenizer.from_file(str(self._path))

    def save(self, data: Tokenizer) -> None:
        write_text_atomic(self._path, data.to_str())

    def _exists(self) -> bool:
        return self._path.is_file()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
