"""What a checkpoint records of how it was made (code, data, versions, progress, plan changes,
ingredients, last eval), as the table ``lehr info`` prints."""

from __future__ import annotations

from lehr import versions


def last_eval(progress: dict) -> dict:
    """A checkpoint's last in-loop eval ({} before its first)."""
    evals = progress["evals"]
    return evals[-1] if evals else {}


def table(state: dict, checkpoint: str) -> str:
    """One line per fact of the verified ``state`` of ``checkpoint``, keys aligned."""
    lines = _made_of(state, checkpoint)
    other = versions.differing(state.get("versions"))
    if other:
        lines["versions here differ"] = ", ".join(other)
    lines.update(_history(state["progress"]))
    ev, prov = last_eval(state["progress"]), state.get("provenance", {})
    lines.update({f"held-out heldout.{k}": f"{v:.4f}" for k, v in ev.get("heldout", {}).items()})
    lines.update({f"input {path}": digest for path, digest in prov.get("inputs", {}).items()})
    width = max(map(len, lines))
    return "\n".join(f"{key:{width}s}  {value}" for key, value in lines.items())


def _made_of(state: dict, checkpoint: str) -> dict:
    prov, prog = state.get("provenance", {}), state["progress"]
    return {
        "checkpoint": checkpoint,
        "stage": prov.get("stage", "?"),
        "engine code sha256": state.get("code", {}).get("sha256", "not recorded"),
        # A checkpoint is the same bytes at any commit of its code, so DVC's lock holds at every one
        # (older checkpoints still name theirs).
        "git commit": f"{prov['git_commit']} (recorded before 2026-12-04)"
        if "git_commit" in prov
        else "not in a checkpoint: MLflow's run of the stage has it (tag git_commit)",
        "step": prog["step"],
        "tokens seen": f"{prog['tokens']:,}",
        "config hash": state["math_hash"],
        "data manifest sha256": state["manifest_sha256"],
        "tokenizer sha256": state["tokenizer_sha256"],
        "world size": state["world_size"],
        "device": state["device"],
        "cuda": state["cuda"],
        "made under": ", ".join(
            f"{k} {v}" for k, v in state.get("versions", {"torch": state["torch"]}).items()
        ),
        "anneal start": f"{prog.get('anneal_start')} ({prog.get('anneal_reason')})",
        "ingredients": ", ".join(_ingredients(state)) or "none (docs/recipe.md)",
    }


def _ingredients(state: dict) -> list[str]:
    """The recipe's ingredients a checkpoint was trained with (a record leaves out those off)."""
    # Imported here: they import torch, which `lehr branches` (``last_eval``) does without.
    from lehr.engine.config import RUN_INGREDIENTS
    from lehr.engine.model import ModelConfig

    math = state.get("config_math", {})
    model = ModelConfig(**state["config"]["model"]).ingredients
    return model + [f"{k}={math[k]}" for k in RUN_INGREDIENTS if k in math]


def _history(progress: dict) -> dict[str, str]:
    """Which code trained which steps (a resume under new code, a branch's origin), and where a
    resume changed the plan (``lehr.engine.run.plan``: budget, stop rule, early stop). The commit is
    in MLflow's tags, not here: a checkpoint is the same bytes at any commit of the same code."""
    lines, parts = {}, progress.get("trained_by", [])
    for i, part in enumerate(parts):
        until = parts[i + 1]["from_step"] if i + 1 < len(parts) else progress["step"]
        lines[f"trained steps {part['from_step']}-{until} by"] = f"code {part['code_sha256'][:16]}" + "".join(
            f", {k} {v}" for k, v in part.get("versions", {}).items() if k != "python"
        )
    for change in progress.get("plan_changes", []):
        lines[f"plan changed at step {change['step']}"] = ", ".join(
            f"{k} {old} → {new}" for k, (old, new) in change["changed"].items()
        )
    return lines
