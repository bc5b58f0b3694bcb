"""MLflow tracking as one small Kedro hook: one run per stage run, tagged with where it came from.

Why not kedro-mlflow: lehr's params are frozen dataclasses, which it logs as opaque strings; the
runs must carry provenance tags and a group tag for the `dvc repro` / `dvc exp run` that caused
them; and torchrun workers log into the run by id. This hook does exactly that, and imports
MLflow only when a pipeline starts, so other `kedro` commands stay fast.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kedro.config import MissingConfigException
from kedro.framework.hooks import hook_impl

from lehr.engine.run.metrics import flatten
from lehr.params.mix_checks import section
from lehr.paths import dataset_path, profile_in_force
from lehr.tracking import step_forwarder
from lehr.tracking.mlflow_store import first_use, project_store, unreachable, use_experiment

if TYPE_CHECKING:  # MLflow is imported when a pipeline starts, not with the hook
    from mlflow import ActiveRun

log = logging.getLogger(__name__)


def flat_params(params: dict) -> dict[str, str]:
    """``{"pretrain": PretrainParams(model=...)}`` -> ``{"pretrain.model.preset": "tiny", ...}``, as
    MLflow params (strings, within its length limit)."""
    plain = {k: section(params, k) for k in params}  # typed params as plain mappings
    return {k: str(v)[:6000] for k, v in flatten(plain).items()}


def invocation() -> str:
    """``dvc-<pid>-<start>`` of the dvc process this stage runs under, else ``kedro-<pid>-<start>``."""
    import psutil

    proc = psutil.Process()
    for parent in proc.parents():
        try:
            if any(part.endswith("dvc") for part in parent.cmdline()[:2]):
                return f"dvc-{parent.pid}-{int(parent.create_time())}"
        except psutil.Error:
            continue
    return f"kedro-{proc.pid}-{int(proc.create_time())}"


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


class MlflowTracking:
    def __init__(self) -> None:
        self._run: ActiveRun | None = None
        self._settings: dict = {}
        self._params: dict = {}
        self._env = "local"

    @hook_impl
    def after_context_created(self, context) -> None:
        # Kedro's config loader is a UserDict that loads a key's files on lookup: `in` sees only keys
        # set on it, so asking `"mlflow" in loader` would never read conf/*/mlflow.yml.
        try:
            self._settings = context.config_loader["mlflow"]
        except MissingConfigException:  # a project without an mlflow.yml: the defaults below
            self._settings = {}
        self._params = context.params
        self._env = context.env or profile_in_force(Path(context.project_path))  # None without --env

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if not self._settings.get("enabled", True) or os.environ.get("LEHR_MLFLOW", "1") == "0":
            return
        uri = project_store(
            os.environ.get("MLFLOW_TRACKING_URI", self._settings.get("tracking_uri", "sqlite:///mlflow.db"))
        )
        try:
            reason = unreachable(uri)
            if reason is None:
                self._start(uri, run_params, catalog)
                return
        except Exception as e:
            reason = step_forwarder.why(e)
        # Tracking never costs a run: the stage goes on, and says how to fix or silence this.
        log.warning(
            "MLflow tracking at %s is not available (%s): this run goes on without MLflow (its metrics "
            "are in the run folders and data/08_reporting). Start the server, point "
            "MLFLOW_TRACKING_URI elsewhere, or turn tracking off with LEHR_MLFLOW=0 or "
            "`enabled: false` in conf/base/mlflow.yml.",
            uri,
            reason,
        )
        self._end_quietly("FAILED")

    def _start(self, uri: str, run_params: dict, catalog) -> None:
        step_forwarder.quick_failures()
        step_forwarder.quiet_store_errors()
        import mlflow
        from mlflow.entities import SourceType
        from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

        from lehr.tracking import provenance

        mlflow.set_tracking_uri(uri)
        with first_use(uri):  # two experiments of `dvc queue start -j 2` may open a new store at once
            experiment_id = use_experiment(uri, self._settings.get("experiment", "lehr"))
        names = run_params.get("pipeline_names") or [run_params.get("pipeline_name") or "__default__"]
        stage = ",".join(names)
        # One dvc repro / dvc exp run spawns one process per stage; the experiment name (DVC sets it
        # for `dvc exp run -n`) or the DVC process that launched them groups the stage runs.
        exp_name = os.environ.get("DVC_EXP_NAME", "")
        git = provenance.git_info()
        group = exp_name or invocation()
        # The run is made here, with the tags MLflow's UI shows, and then started by its id: a new
        # run from mlflow.start_run asks MLflow's context providers, which probe for a notebook, a
        # Databricks job and git by importing IPython, GitPython and more (~0.3 s a stage); lehr's
        # own tags below say where a run came from.
        made = mlflow.MlflowClient().create_run(
            experiment_id,
            run_name=f"{stage} ({group})",
            tags={
                MLFLOW_USER: _user(),
                MLFLOW_SOURCE_NAME: Path(sys.argv[0]).name,
                MLFLOW_SOURCE_TYPE: SourceType.to_string(SourceType.LOCAL),
            },
        )
        self._run = mlflow.start_run(run_id=made.info.run_id)
        shards, tokenizer = dataset_path(catalog, "shards"), dataset_path(catalog, "tokenizer")
        tags = {
            "lehr.stage": stage,
            "lehr.group": group,
            "lehr.kedro_env": self._env,
            "lehr.host": socket.gethostname(),  # tells two machines' runs apart on a team's server
            "dvc.exp_name": exp_name,
            "dvc.baseline_rev": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            **{k: str(v) for k, v in git.items()},
            "data.manifest_sha256": _file_sha256(shards / "manifest.json") if shards else "",
            "data.tokenizer_sha256": _file_sha256(tokenizer) if tokenizer else "",
        }
        from lehr import versions

        tags.update({f"version.{name}": v for name, v in versions.deciding().items()})
        # The machine's accelerator matters to a stage that runs torch, and such a stage's pipeline
        # has imported it by now. The data stages never do: torch's import would double their start.
        torch = sys.modules.get("torch")
        if torch is not None:
            tags["cuda"] = str(torch.version.cuda)
            tags["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        mlflow.set_tags(tags)
        wanted = {
            k: v for k, v in self._params.items() if k in _PARAM_SECTIONS.get(stage, _PARAM_SECTIONS["all"])
        }
        mlflow.log_params(flat_params(wanted))

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        if self._run is None:
            return
        try:
            self._finish(pipeline, catalog)
        except Exception as e:  # the stage's outputs are written: a tracking failure must not fail it
            log.warning("MLflow: could not record the end of this run (%s)", step_forwarder.why(e))
            self._end_quietly("FINISHED")

    def _finish(self, pipeline, catalog) -> None:
        import mlflow

        for dataset in pipeline.all_outputs():
            path = dataset_path(catalog, dataset)
            if path is None:
                continue
            if (
                path.is_file()
                and path.suffix in (".json", ".png", ".txt", ".csv")
                and path.stat().st_size < 20 << 20
            ):
                mlflow.log_artifact(str(path), artifact_path="reports")
            elif path.is_dir():  # checkpoints and shards live in DVC: MLflow gets their path and hash
                weights = next(path.rglob("model.safetensors"), None) or path / "manifest.json"
                mlflow.set_tag(f"artifact.{dataset}", f"{path} sha256:{_file_sha256(weights)[:16]}")
        mlflow.end_run("FINISHED")
        self._run = None

    @hook_impl
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        if self._run is None:
            return
        import mlflow

        try:
            mlflow.set_tag("lehr.error", str(error)[:5000])
        except Exception as e:
            log.warning("MLflow: could not record the error (%s)", step_forwarder.why(e))
        self._end_quietly("FAILED")

    def _end_quietly(self, status: str) -> None:
        if "mlflow" in sys.modules:
            import mlflow

            try:
                if mlflow.active_run():
                    mlflow.end_run(status)
            except Exception:
                pass
        self._run = None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return "unknown"


_PARAM_SECTIONS = {
    "tokenize": {"tokenize"},
    "shard": {"shard"},
    "pretrain_stable": {"pretrain"},
    "anneal": {"pretrain", "anneal"},
    "evaluate": {"pretrain", "anneal", "evaluate"},
    "ladder_rung": {"pretrain", "anneal", "ladder"},
    "ladder_fit": {"ladder"},
    "all": {"tokenize", "shard", "pretrain", "anneal", "evaluate"},
}
