"""The MLflow store a stage logs to: its path made the project's, its experiment, the first
process to open a new SQLite store, and whether a tracking server answers."""

from __future__ import annotations

import contextlib
import fcntl
import logging
from pathlib import Path

from lehr.paths import project_root

log = logging.getLogger(__name__)


def project_store(uri: str) -> str:
    """A local store named relative to the project, made absolute. A queued `dvc exp run` runs in
    a temporary copy of the project that DVC deletes afterwards; DVC_ROOT names the project itself
    there, so the experiment's runs land in the project's store beside every other run."""
    root = project_root()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{(root / uri.removeprefix('sqlite:///')).resolve()}"
    if "://" not in uri and not uri.startswith("file:") and not Path(uri).is_absolute():
        return str((root / uri).resolve())
    return uri


def use_experiment(uri: str, name: str) -> str:
    """Make ``name`` MLflow's active experiment, creating it with its artifacts in the project's
    ``mlruns/<name>`` when the store is a database (a server keeps its own). MLflow's default,
    ``./mlruns`` of the process's working directory, is DVC's temporary copy of the project when a
    queued experiment is the store's first user: DVC deletes it after the run, and with it the
    artifacts of every later run of the experiment. A store made so is named, with the way out.
    Returns the experiment's id."""
    import mlflow

    existing = mlflow.get_experiment_by_name(name)
    if existing is None and "://" in uri and not uri.startswith(("http://", "https://", "file:")):
        mlflow.create_experiment(name, artifact_location=(project_root() / "mlruns" / name).as_uri())
    elif existing is not None and "/.dvc/tmp/" in existing.artifact_location:
        log.warning(
            "MLflow experiment %r keeps its artifacts in %s, inside a temporary copy of the project "
            "that DVC deletes (a queued experiment created it): its runs' reports are lost. Name a "
            "new experiment in conf/base/mlflow.yml (experiment: ...), which lehr creates with its "
            "artifacts in the project's mlruns/ (docs/tracking.md).",
            name,
            existing.artifact_location,
        )
    return mlflow.set_experiment(name).experiment_id


@contextlib.contextmanager
def first_use(uri: str):
    """Held while a process opens a SQLite store: the first to open a new one creates its tables,
    and a second one doing the same at that moment would fail."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def unreachable(uri: str, timeout: float = 5.0) -> str | None:
    """Why an HTTP tracking server cannot be used now (None: it answered, or the store is local)."""
    if not uri.startswith(("http://", "https://")):
        return None
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered (an older server without /health answers 404)
    except (OSError, ValueError) as e:
        return f"no answer within {timeout:.0f} s: {getattr(e, 'reason', e)}"
    return None
