"""Provenance records the hashes of the inputs a stage read, computed from the files themselves."""

from __future__ import annotations

import hashlib
import json

from lehr.tracking import provenance


def test_inputs_are_hashed_from_the_files_read(tmp_path, smoke_shards):
    manifest = {**json.loads((smoke_shards / "manifest.json").read_text()), "root": str(smoke_shards)}
    ckpt = tmp_path / "pre_anneal"
    ckpt.mkdir()
    (ckpt / "state.json").write_text('{"progress": {"step": 3}}')
    prov = provenance.collect("anneal", manifest, {"pre_anneal": ckpt})
    want = hashlib.sha256((smoke_shards / "manifest.json").read_bytes()).hexdigest()
    assert prov["manifest_sha256"] == want == prov["inputs"][str(smoke_shards / "manifest.json")]
    assert (
        prov["inputs"][str(ckpt / "state.json")] == hashlib.sha256(b'{"progress": {"step": 3}}').hexdigest()
    )
    assert "dvc_lock" not in prov  # a lock entry can describe another profile's run
    assert "git_commit" not in prov  # a checkpoint is the same bytes at any commit of the same code
