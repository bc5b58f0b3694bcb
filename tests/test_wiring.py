"""dvc.yaml and the Kedro catalog/params agree: every stage's outs and deps are catalog paths,
every params key a stage lists exists, and each smoke override names real keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from kedro.config import OmegaConfigLoader
from kedro.framework.startup import bootstrap_project

from lehr.engine.artifacts.code_identity import imported
from lehr.paths import catalog_paths
from tests import ROOT

GLOBALS = yaml.safe_load((ROOT / "conf/base/globals.yml").read_text())
# dvc.yaml and the catalog both take the corpus path from conf/base/globals.yml.
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text().replace("${corpus}", GLOBALS["corpus"]))
CATALOG = OmegaConfigLoader(conf_source=str(ROOT / "conf"), base_env="base", default_run_env="local")[
    "catalog"
]
PATHS = {name: path.relative_to(ROOT).as_posix() for name, path in catalog_paths(ROOT, "local").items()}
KEDRO_STAGES = {k: v for k, v in DVC["stages"].items() if k != "corpus"}  # corpus: `lehr corpus`
# The branches' second home (docs/tracking.md): the folder of those made by hand, no stage's output.
BY_HAND = {
    name: spec["by_hand"] for name, spec in CATALOG.items() if isinstance(spec, dict) and "by_hand" in spec
}


def _entries(items):
    for item in items or []:
        yield (next(iter(item)), item[next(iter(item))]) if isinstance(item, dict) else (item, {})


@pytest.fixture(scope="module")
def pipelines():
    bootstrap_project(ROOT)
    from lehr.pipeline_registry import register_pipelines

    return register_pipelines()


def test_every_stage_runs_its_kedro_pipeline(pipelines):
    corpus = DVC["stages"]["corpus"]
    assert corpus["cmd"] == f"PYTHONPATH=src lehr corpus --out {corpus['outs'][0]}"
    assert GLOBALS["corpus"] in DVC["stages"]["tokenize"]["deps"] and GLOBALS["corpus"] == PATHS["corpus"]
    for stage, spec in KEDRO_STAGES.items():
        assert spec["cmd"].startswith(f"kedro run --pipelines {stage} ")  # one spelling: stage = pipeline
        assert stage in pipelines


def test_outs_and_data_deps_are_catalog_paths():
    catalog_paths = set(PATHS.values()) | set(BY_HAND.values())
    for stage, spec in KEDRO_STAGES.items():
        for key in ("outs", "metrics", "plots"):
            for path, _ in _entries(spec.get(key)):
                assert path in catalog_paths, f"{stage}: {key} {path} is not a catalog path"
        for dep in spec.get("deps", []):
            if dep.startswith("data/"):
                assert dep in catalog_paths, f"{stage}: dep {dep} is not a catalog path"


# What the clock said of the training stages (data/08_reporting/timing/): versioned by nothing, so
# that a fresh run reproduces every versioned file (MLflow keeps them).
CLOCK_READINGS = {"stable_timing", "anneal_timing"}


def test_every_catalog_output_is_a_dvc_out(pipelines):
    declared = {
        p
        for spec in DVC["stages"].values()
        for key in ("outs", "metrics", "plots")
        for p, _ in _entries(spec.get(key))
    }
    for stage in KEDRO_STAGES:
        for output in pipelines[stage].outputs():
            if output in PATHS and output not in CLOCK_READINGS:
                assert PATHS[output] in declared, f"{output} ({PATHS[output]}) is written but not a DVC out"


def test_stage_inputs_are_its_deps(pipelines):
    for stage, spec in KEDRO_STAGES.items():
        deps = set(spec.get("deps", []))
        outs = {path for path, _ in _entries(spec.get("outs"))}
        for name in pipelines[stage].inputs():
            if name not in PATHS or CATALOG[name]["type"].endswith("RunDirDataset"):
                continue
            if PATHS[name] in outs:
                # The anneal stage reads its own branches only to refuse, by hand, a name DVC's
                # branch holds: under DVC that check does nothing, and an output cannot be a dep.
                continue
            assert PATHS[name] in deps, f"{stage} reads {name} ({PATHS[name]}) but does not depend on it"
            if name in BY_HAND:
                assert BY_HAND[name] in deps, f"{stage} reads {BY_HAND[name]} but does not depend on it"


def test_params_listed_by_stages_exist_and_smoke_overrides_are_real_keys():
    def keys(d, prefix=""):
        for k, v in d.items():
            yield prefix + k
            if isinstance(v, dict) and k not in ("stable_mix", "overrides"):
                yield from keys(v, prefix + k + ".")

    for stage, spec in DVC["stages"].items():
        for path, names in _entries(spec.get("params")):
            for profile in ("smoke", "gpu", "local"):
                where = path.replace("${profile}", profile)
                values = yaml.safe_load((ROOT / where).read_text())
                for name in names:
                    assert name in values, f"{stage}: {where} has no key {name}"
    for profile in ("smoke", "gpu"):
        for override in (ROOT / "conf" / profile).glob("parameters_*.yml"):
            base = yaml.safe_load((ROOT / "conf/base" / override.name).read_text())
            assert set(keys(yaml.safe_load(override.read_text()))) <= set(keys(base)), override
            for stage, spec in DVC["stages"].items():  # every stage that reads base's file tracks this one
                listed = [p for p, _ in _entries(spec.get("params"))]
                if f"conf/base/{override.name}" in listed:
                    assert f"conf/${{profile}}/{override.name}" in listed, (stage, override)


# Imported by the stages but unable to change what they write: tracking forwards metrics to MLflow,
# locks only refuse a second writer, errors (and the `kedro run` that prints them) only word what
# went wrong, hooks/stage_lines.py only logs, and the package's __init__ holds only its version.
NO_EFFECT_ON_OUTPUTS = {
    "src/lehr/tracking/step_forwarder.py",
    "src/lehr/tracking/mlflow_store.py",
    "src/lehr/hooks/__init__.py",
    "src/lehr/hooks/mlflow_tracking.py",
    "src/lehr/hooks/stage_lines.py",
    "src/lehr/cli.py",
    "src/lehr/files/locks.py",
    "src/lehr/errors/__init__.py",
    "src/lehr/errors/kedro_logs.py",
    "src/lehr/errors/messages.py",
    "src/lehr/params/key_lines.py",  # where a parameter is set, for the line an error prints
    "src/lehr/fixes.py",  # the commands that error messages suggest
    "src/lehr/__init__.py",
}


def _module_file(module: str) -> str | None:
    base = ROOT / "src" / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return str(path.relative_to(ROOT))
    return None


def _lehr_imports(path) -> set[str]:
    """Files of the ``lehr`` modules one file imports: the code identity's rule (relative imports too)."""
    module = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts).removesuffix(".__init__")
    return {f for f in map(_module_file, imported(path, module)) if f}


KEDRO_RUNS = (
    "src/lehr/catalog/__init__.py",
    "src/lehr/settings.py",
    "src/lehr/pipeline_registry.py",
    "src/lehr/cli.py",
)
# The ladder's stages (ladder/dvc.yaml), each as its DVC spec: a rung's is its `foreach` template.
LADDER = {
    name: spec.get("do", spec)
    for name, spec in yaml.safe_load((ROOT / "ladder/dvc.yaml").read_text())["stages"].items()
}


def test_every_module_a_stage_runs_is_one_of_its_deps():
    """A change to any code a stage runs must re-run it: the import closure of the stage's pipeline
    package and of the datasets it reads and writes lies inside its `dvc.yaml` deps (the ladder's
    in ladder/dvc.yaml)."""
    for stage, spec in {**DVC["stages"], **LADDER}.items():
        package = ROOT / "src/lehr/pipelines" / stage
        # What Kedro runs around every pipeline: the settings (hooks), the registry, lehr's `kedro run`.
        todo = {str(p.relative_to(ROOT)) for p in package.glob("*.py")} | set(KEDRO_RUNS)
        if stage == "corpus":
            todo = {"src/lehr/dataprep/bundled_corpus.py"}
        seen: set[str] = set()
        while todo:
            current = todo.pop()
            seen.add(current)
            todo |= _lehr_imports(ROOT / current) - seen
        deps = [d for d in spec["deps"] if d.startswith("src/")]
        missing = sorted(
            f
            for f in seen - NO_EFFECT_ON_OUTPUTS
            if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)
        )
        assert not missing, f"stage {stage} runs {missing} but does not list them as deps in dvc.yaml"


def test_every_catalog_type_resolves_to_its_class():
    """lehr.catalog imports a dataset when the catalog first names it: each name the catalog uses
    is one the package lists, and each it lists resolves to the class of that name."""
    import lehr.catalog

    types = {spec.get("type", "") for spec in CATALOG.values() if isinstance(spec, dict)}
    named = {t.removeprefix("lehr.catalog.") for t in types if t.startswith("lehr.catalog.")}
    assert named and named <= set(lehr.catalog.__all__), named - set(lehr.catalog.__all__)
    for name in lehr.catalog.__all__:
        cls = getattr(lehr.catalog, name)
        assert isinstance(cls, type) and cls.__name__ == name


def test_the_committed_dvc_lock_is_of_the_committed_code_and_params(tmp_path):
    """A fresh clone's `make run` leaves `git status` clean only if `dvc.lock` records the commands,
    code, params and committed files of its own commit: a commit that changes any of them brings the
    lock of a real run with it (docs/default_run.md). Checked on a clone of the commit, not the
    workspace, so that an edit in progress is no failure here. The ladder's lock (ladder/dvc.lock) is
    its own run's."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # DVC keeps a state database per repository in its site cache: this throwaway clone's goes with it.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_"))}
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json", "dvc.yaml"],
        cwd=clone,
        env={**inherited, "DVC_SITE_CACHE_DIR": str(tmp_path / "dvc-site"), "DVC_NO_ANALYTICS": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    built = {
        entry["path"]
        for stage in yaml.safe_load((clone / "dvc.lock").read_text())["stages"].values()
        for entry in stage.get("outs", [])
    }
    stale = set()
    for stage, entries in json.loads(out.stdout or "{}").items():
        for entry in entries:
            if isinstance(entry, str):  # "changed command", ...
                stale |= {f"{stage}: {entry}"} - {f"{stage}: always changed"}
                continue
            # What a fresh clone has yet to build is absent; anything else that differs is stale.
            stale |= {f"{stage}: {dep}" for dep in entry.get("changed deps", {}) if dep not in built}
            stale |= {
                f"{stage}: {out} {state}"
                for out, state in entry.get("changed outs", {}).items()
                if state not in ("deleted", "not in cache")
            }
    assert not stale, (
        f"dvc.lock is not of this commit ({', '.join(sorted(stale))}): run `make run` and commit its "
        "dvc.lock (a stage whose run finished under the same code re-runs in seconds)"
    )
