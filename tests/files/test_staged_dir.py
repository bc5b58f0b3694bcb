"""``staged_dir``, the one way lehr writes a folder whole: an error, and a real kill -9, both leave
the folder as it was; the next writer clears what the killed one left."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lehr.files.atomic import copy_tree, staged_dir
from tests.e2e import dir_hash

_KILLED_MID_BUILD = """
import sys, time
from pathlib import Path
from lehr.files.atomic import copy_tree, staged_dir
with staged_dir(Path(sys.argv[1])) as folder:
    (folder / "half.txt").write_text("half")
    print("writing", flush=True)
    time.sleep(60)
"""


def _old(target):
    with staged_dir(target) as folder:
        (folder / "a.txt").write_text("old\n")


def test_an_error_mid_build_leaves_the_folder_as_it_was(tmp_path):
    target = tmp_path / "out"
    _old(target)
    before = dir_hash(target)
    with pytest.raises(OSError), staged_dir(target) as folder:
        (folder / "b.txt").write_text("new")
        raise OSError(28, "No space left on device")
    assert dir_hash(target) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_kill_mid_build_leaves_the_folder_and_the_next_writer_clears_the_rest(tmp_path):
    target = tmp_path / "out"
    _old(target)
    before = dir_hash(target)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_BUILD, str(target)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"writing"
    proc.kill()
    proc.wait()
    assert dir_hash(target) == before
    left = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert left == [f".tmp-out-{proc.pid}"]  # the half build, named for its writer
    with staged_dir(target, keep_if_same=True) as folder:
        (folder / "a.txt").write_text("old\n")
    assert dir_hash(target) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_same_bytes_leave_the_folder_untouched_when_asked(tmp_path):
    target = tmp_path / "out"
    _old(target)
    mtime = (target / "a.txt").stat().st_mtime_ns
    time.sleep(0.01)
    with staged_dir(target, keep_if_same=True) as folder:
        (folder / "a.txt").write_text("old\n")
    assert (target / "a.txt").stat().st_mtime_ns == mtime
    with staged_dir(target, keep_if_same=True) as folder:
        (folder / "a.txt").write_text("new\n")
    assert (target / "a.txt").read_text() == "new\n"


_COPY_UNDER_LIMIT = """
import resource, sys
from pathlib import Path
from lehr.files.atomic import copy_tree
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    copy_tree(Path(sys.argv[1]), Path(sys.argv[2]), shown_as=Path("data/06_models/pre_anneal"))
except OSError as e:
    print(e.errno, e.filename)
"""


def test_copy_tree_copies_like_copytree_and_names_the_file_it_could_not_write(tmp_path):
    """shutil.copytree gathered a full disk into one shutil.Error of text tuples, with no errno."""
    import errno
    import shutil

    src = tmp_path / "src"
    (src / "empty").mkdir(parents=True)
    (src / "sub").mkdir()
    (src / "a.txt").write_text("a")
    (src / "sub" / "big.bin").write_bytes(b"x" * 5000)
    copy_tree(src, tmp_path / "mine")
    shutil.copytree(src, tmp_path / "theirs")
    assert dir_hash(tmp_path / "mine") == dir_hash(tmp_path / "theirs") and (tmp_path / "mine/empty").is_dir()
    out = subprocess.run(
        [sys.executable, "-c", _COPY_UNDER_LIMIT, str(src), str(tmp_path / "limited")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == [str(errno.EFBIG), "data/06_models/pre_anneal/sub/big.bin"]
