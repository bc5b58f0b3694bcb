"""A killed tokenize continues from the files it finished and ends byte-identical to an
uninterrupted run: a real `kill -9` of the stage's process group (its encoding workers too)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e import dir_hash, env, make_repo, sh

pytestmark = pytest.mark.slow
CMD = [
    "kedro",
    "run",
    "--pipelines",
    "tokenize",
    "--env",
    "smoke",
    "--params",
    "tokenize.max_bytes_per_stream=0,tokenize.workers=2",
]


def test_kill_9_mid_tokenize_resumes_from_finished_files(tmp_path, corpus_dir):
    repo = make_repo(tmp_path / "repo", corpus_dir)
    tokens, tokenizer = repo / "data/03_primary/tokens", repo / "data/02_intermediate/tokenizer.json"
    sh(repo, *CMD)
    reference = dir_hash(tokens), tokenizer.read_bytes()
    n_parts = len(list((tokens / "parts").glob(".*.resume")))
    shutil.rmtree(tokens)
    tokenizer.unlink()

    proc = subprocess.Popen(
        CMD, cwd=repo, env=env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while (
        time.time() < deadline
        and proc.poll() is None
        and len(list((tokens / "parts").glob(".*.resume"))) < 20
    ):
        time.sleep(0.01)
    assert proc.poll() is None, "tokenize finished before the kill: give it more files"
    group = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    assert not [
        p for p in group if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    finished = len(list((tokens / "parts").glob(".*.resume")))
    assert 20 <= finished < n_parts and not (tokens / "streams.json").exists() and not tokenizer.exists()

    out = sh(repo, *CMD)
    reused = re.search(r"(\d+) of (\d+) task\(s\) reused", out.stdout + out.stderr)
    assert reused and int(reused[1]) >= finished - 2 and int(reused[2]) == n_parts, (out.stdout + out.stderr)[
        -2000:
    ]
    assert (dir_hash(tokens), tokenizer.read_bytes()) == reference
    assert not list(tokens.rglob(".tmp-*"))
