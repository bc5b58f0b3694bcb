"""`python -m lehr check`: every section of the project's parameters validated as its stage
would, before DVC runs one. Apart from ``lehr.stages.params`` so that the stages, which import that,
do not depend on the ladder's params."""

from __future__ import annotations

from lehr.config_parts import from_mapping
from lehr.stages.ladder_params import LadderParams
from lehr.stages.params import SECTIONS

# Read by `make ladder` alone, so a project without the ladder's params still checks clean.
OPTIONAL_SECTIONS = {"ladder": LadderParams}


def check_all(parameters: dict) -> list[str]:
    """Every section of a resolved parameters mapping, validated; returns the problems found."""
    problems = []
    sections = {**SECTIONS, **{k: v for k, v in OPTIONAL_SECTIONS.items() if k in parameters}}
    for section, cls in sections.items():
        if section not in parameters:
            problems.append(f"parameter section {section} is missing")
            continue
        try:
            from_mapping(cls, parameters[section], section)
        except (TypeError, ValueError) as e:
            problems.append(str(e))
    return problems
