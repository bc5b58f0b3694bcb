from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr import fixes
from lehr.dataprep.sharding import ShardSpec
from lehr.files import locks
from lehr.files.atomic import recover


class ShardsDataset(AbstractDataset[ShardSpec, dict]):
    """A self-describing shard set: shard files, ``tokenizer.json`` and ``manifest.json``.

    Saves a ``ShardSpec`` with ``lehr.dataprep.sharding.write_shard_set`` (built beside the folder and
    swapped in whole); loads the manifest. Keeping the tokenizer beside the shards lets the training
    engine read one folder and nothing else. The loaded manifest gains ``root``, the folder its
    shard paths are relative to.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    @property
    def manifest_path(self) -> Path:
        return self._path / "manifest.json"

    def load(self) -> dict:
        # What a killed shard write left beside the shards (DVC may have restored them from its
        # cache since, so no shard run would come to clear it): a dead writer's, never a live one's.
        recover(self._path.parent, self._path.name)
        if not self.manifest_path.is_file():
            raise DatasetError(
                f"{self.manifest_path} is missing: run the shard stage first (`{fixes.rebuild('shard')}`)"
            )
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(
                f"{self.manifest_path} is corrupt ({e}); rebuild it with `{fixes.force_rebuild('shard')}`"
            ) from None
        manifest["root"] = str(self._path)
        return manifest

    def save(self, data: ShardSpec) -> None:
        with locks.hold(self._path, "writing shards"):
            data.write(self._path)

    def _exists(self) -> bool:
        return self.manifest_path.is_file()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
