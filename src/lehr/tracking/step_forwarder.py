"""MLflow glue: forwards the engine's per-step records into the stage's MLflow run.

The engine calls ``mlflow_forwarder()`` by name (``lehr.tracking.step_forwarder:mlflow_forwarder``) in the
process that is rank 0, in-process or under torchrun, so it never imports MLflow itself. MLflow
is imported only when a run is active (the hook started one) or a run id was handed down.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import threading
import time

RUN_ID_ENV = "MLFLOW_RUN_ID"
CALLBACK = "lehr.tracking.step_forwarder:mlflow_forwarder"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
MAX_PENDING = 200_000  # metrics held for a tracking store that is down; older ones are dropped past this
CLOSE_WAIT_S = 30  # at the end of a run, how long the last metrics may take to reach the store
MAX_ATTEMPTS_TAGGED = 100  # run ids in lehr.earlier_attempts, the newest (within MLflow's tag length)
log = logging.getLogger(__name__)


def quiet_store_errors() -> None:
    """MLflow's sqlite store logs every database error with its whole traceback (~40 lines for a
    full disk) before raising it; lehr catches each such error and says it in one line."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def why(error: BaseException) -> str:
    """A tracking failure in a few words: the database's own message (SQLAlchemy's first line is
    often its advice on autoflush), or a full disk or file-size limit named as such."""
    import errno

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EFBIG):
            where = seen.filename or "the store"
            return f"{os.strerror(seen.errno)}: {where}: free space there, or track elsewhere"
        orig = getattr(seen, "orig", None)  # the database driver's error, under SQLAlchemy's
        if orig is not None:
            said = str(orig).splitlines()[0][:200]
            if "disk is full" in said or "disk I/O error" in said:
                said += " (the disk that holds the store is full, or a file-size limit was reached)"
            return said
        seen = seen.__cause__ or seen.__context__
    return str(error).splitlines()[0][:200]


def quick_failures() -> None:
    """MLflow's HTTP client retries for minutes by default (a stage waited 251 s on a server that did
    not answer); lehr's tracking must fail in seconds. A user's own settings win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")


def _active_run_id() -> str | None:
    if "mlflow" not in sys.modules:  # tracking is off in this process: nothing started a run
        return os.environ.get(RUN_ID_ENV)
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run else os.environ.get(RUN_ID_ENV)


def current_run_env() -> dict[str, str]:
    """What launched workers need to log into this process's active run."""
    run_id = _active_run_id()
    if not run_id:
        return {}
    import mlflow

    return {RUN_ID_ENV: run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}


def mark_attempt(run_dir: str, share: dict[str, str] | None = None) -> None:
    """Tag the stage's MLflow run with its rolling folder, the host and the share of the machine it
    holds, and close earlier attempts on that folder that a kill left RUNNING. A folder is known by
    host and real path (two clones or queued copies share a relative path, not a folder), and an
    attempt is earlier only if it did not finish and its process is gone. The engine replays the
    kept history into this run, which alone then holds the whole curve."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    try:
        _mark(mlflow, run, run_dir, share or {})
    except Exception as e:  # tracking never costs a run
        log.warning("MLflow: could not tag this attempt (%s); training goes on", why(e))


def tag_share(share: dict[str, str]) -> None:
    """Tag the stage's MLflow run with the host and the share of the machine it holds."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    try:
        if mlflow.active_run() is not None:
            mlflow.set_tags({f"lehr.{k}": v for k, v in share.items()})
    except Exception as e:  # tracking never costs a run
        log.warning("MLflow: could not tag the share (%s)", why(e))


def folder_identity(run_dir: str) -> str:
    """The run folder as one machine's real folder (a digest of host and real path: a search key
    with no quote in it); two copies of a project share a relative path, not a folder."""
    import hashlib

    return hashlib.sha256(f"{socket.gethostname()}:{os.path.realpath(run_dir)}".encode()).hexdigest()[:16]


def process_identity(pid: int | None = None) -> str:
    """``<pid>-<start time>``: a pid alone is reused by the kernel."""
    import psutil

    proc = psutil.Process(pid)
    return f"{proc.pid}-{proc.create_time():.2f}"


def _alive(identity: str) -> bool:
    import psutil

    pid = identity.split("-", 1)[0]
    try:
        return pid.isdigit() and process_identity(int(pid)) == identity
    except psutil.Error:
        return False


def _mark(mlflow, run, run_dir: str, share: dict[str, str]) -> None:
    client = mlflow.MlflowClient()
    folder = folder_identity(run_dir)
    same_folder = sorted(
        (
            r
            for r in client.search_runs([run.info.experiment_id], f"tags.`lehr.run_folder` = '{folder}'")
            if r.info.run_id != run.info.run_id
        ),
        key=lambda r: r.info.start_time,
    )
    earlier: list = []  # the attempts since the folder's run last finished: this run goes on from them
    for r in same_folder:
        if r.info.status == "FINISHED":
            earlier = []
        elif r.info.status == "RUNNING" and _alive(r.data.tags.get("lehr.process", "")):
            continue  # the run that just let the folder go, ending its stage
        else:
            if r.info.status == "RUNNING":
                client.set_terminated(r.info.run_id, "KILLED")
            earlier.append(r.info.run_id)
    mlflow.set_tags(
        {
            "lehr.run_dir": run_dir,
            "lehr.run_folder": folder,
            "lehr.process": process_identity(),
            "lehr.earlier_attempts": ",".join(earlier[-MAX_ATTEMPTS_TAGGED:]),
            **{f"lehr.{k}": v for k, v in share.items()},
        }
    )


class Forwarder:
    """Sends the engine's records to MLflow from a thread of its own, so a slow, locked or dead
    tracking store never stalls or stops training: metrics wait in order (up to MAX_PENDING) and
    go when the store answers again; what cannot go is dropped with a warning, never an error."""

    def __init__(self, client, run_id: str):
        quiet_store_errors()
        self.client, self.run_id = client, run_id
        self.inbox: queue.Queue = queue.Queue()
        self.pending: list = []
        self.failures = self.dropped = 0
        self.thread = threading.Thread(target=self._loop, name="lehr-mlflow", daemon=True)
        self.thread.start()

    def __call__(self, records: list[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.inbox.put(
            [
                Metric(f"{rec['kind']}.{k}", float(v), now, rec["step"])
                for rec in records
                for k, v in rec.items()
                if k not in ("step", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
        )

    def _loop(self) -> None:
        while True:
            try:
                item = self.inbox.get(timeout=2.0 if self.pending else None)
            except queue.Empty:
                item = []  # retry what is pending
            if item is None:
                return
            self.pending.extend(item)
            if len(self.pending) > MAX_PENDING:
                self.dropped += len(self.pending) - MAX_PENDING
                del self.pending[: len(self.pending) - MAX_PENDING]
            self._send()

    def _send(self) -> bool:
        while self.pending:
            batch = self.pending[:MAX_METRICS_PER_BATCH]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as e:
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning(
                        "MLflow: could not log metrics (%s); %d held, training goes on",
                        why(e),
                        len(self.pending),
                    )
                return False
            del self.pending[: len(batch)]
            self.failures = 0
        return True

    def close(self) -> None:
        """Wait (at most CLOSE_WAIT_S) for what is queued to reach MLflow; warn about what did not."""
        self.inbox.put(None)
        self.thread.join(CLOSE_WAIT_S)
        deadline = time.time() + CLOSE_WAIT_S
        while not self.thread.is_alive() and self.pending and not self._send() and time.time() < deadline:
            time.sleep(1.0)
        lost = self.dropped + len(self.pending) + sum(len(m) for m in list(self.inbox.queue) if m)
        if lost:
            log.warning(
                "MLflow: %d metric value(s) could not be logged and were dropped; metrics.jsonl in "
                "the run folder holds them all",
                lost,
            )


def mlflow_forwarder():
    run_id = _active_run_id()
    if not run_id:
        return lambda records: None
    quick_failures()
    import mlflow

    return Forwarder(mlflow.MlflowClient(), run_id)
