"""requirements.lock: every dependency pyproject.toml names, pinned within its range, torch left
to TORCH_SPEC; and the environment the tests run in is the one it pins (make setup installs it)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import ROOT


def pins() -> dict[str, Version]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    found = (re.match(r"([A-Za-z0-9._-]+)==([^\s;]+)", line) for line in lines)
    return {canonicalize_name(m[1]): Version(m[2]) for m in found if m}


def test_the_lock_pins_every_dependency_within_its_range_and_leaves_torch_out():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["viz"]]
    locked = pins()
    for req in wanted:
        if req.marker is None or req.marker.evaluate():
            name = canonicalize_name(req.name)
            assert name in locked, f"{req} is not in requirements.lock: run make lock"
            assert req.specifier.contains(locked[name], prereleases=True), (
                f"requirements.lock pins {name}=={locked[name]} outside {req}: run make lock"
            )
    assert "torch" not in locked and not any(n.startswith("nvidia-") for n in locked)


def test_the_environment_is_the_one_the_lock_pins():
    differ = []
    for name, version in pins().items():
        try:
            have = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            differ.append(f"{name} {have or 'missing'} (lock: {version})")
    assert not differ, f"this environment is not requirements.lock's, run make setup: {', '.join(differ)}"
