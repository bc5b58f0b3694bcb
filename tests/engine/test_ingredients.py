"""The recipe's ingredients (issue 34; docs/recipe.md): off, each leaves the plain model, its math
hash and its run names as they were (the golden losses of test_golden.py pin the training); on,
each changes what it should, trains the same on one process, under DDP and under FSDP, resumes
exactly (one process and FSDP), and is refused, naming the key and the fix, where it cannot apply."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_model

from lehr.__main__ import main
from lehr.config_parts import ConfigError
from lehr.engine.artifacts.checkpoint import CheckpointError, load_weights
from lehr.engine.artifacts.export import ExportError, export_hf, export_plain, load_export
from lehr.engine.batches import DataError, Documents, ShardSet, Source, TrainStream
from lehr.engine.config import DataConfig, TrainConfig
from lehr.engine.hardware import resolve
from lehr.engine.memory import Setup, estimate, parameter_count
from lehr.engine.model import INGREDIENTS, Transformer, preset
from lehr.engine.optim import muon_adamw, newton_schulz
from lehr.engine.processes.launch import Launch
from lehr.engine.run import update
from lehr.engine.run.loop import train
from tests.engine import compare_runs
from tests.engine.forked import run

MODEL_ON = dict(mlp="relu2", logit_softcap=15.0, layer_scalars=True, value_embeds=True)
MUON_ON = dict(
    muon_orthogonaliser="polar_express",
    muon_cautious_decay=True,
    muon_weight_decay=0.1,
    muon_normuon_beta2=0.95,
)
MUON_FIELDS = {"muon_orthogonaliser", "muon_cautious_decay", "muon_normuon_beta2"}
# The batch-size warmup draws 2, 4 and 6 of the 8 sequences before step 8: a resume at step 6 is
# inside it, and under DDP a process's 3 of 6 are micro-batches of 2 and 1.
DATA_ON = dict(packing="bos_best_fit", batch_warmup_steps=8, batch_warmup_start=2)
STEPS = dict(planned_steps=12, micro_batch=2, eval_every=6, ckpt_every=4)


def all_on(tiny_config, **overrides) -> TrainConfig:
    return tiny_config(model=preset("tiny", 512, **MODEL_ON), **MUON_ON, **DATA_ON, **STEPS, **overrides)


def test_off_is_the_plain_model_and_its_math_hash(tiny_config):
    """Off, no ingredient enters the model's record or the math hash: runs and checkpoints made
    before they existed resume, and keep their names."""
    plain = tiny_config()
    assert plain.model.ingredients == [] and not set(INGREDIENTS) & set(plain.model.math_dict())
    assert not (MUON_FIELDS | set(DATA_ON)) & set(plain.math_fields())
    assert set(all_on(tiny_config).math_fields()) >= MUON_FIELDS | set(DATA_ON)


@pytest.mark.parametrize("field", ["layer_scalars", "value_embeds"])
def test_an_added_ingredient_leaves_the_plain_parameters_draws_alone(field):
    """Its parameters are drawn last: the rest start where the plain model's do, so an ablation
    compares like with like. Layer scalars start neutral: the same logits as without them."""
    plain = preset("tiny", 512)
    torch.manual_seed(0)
    a = Transformer(plain)
    torch.manual_seed(0)
    b = Transformer(dataclasses.replace(plain, **{field: MODEL_ON[field]}))
    ours = dict(b.named_parameters())
    for name, p in a.named_parameters():
        assert torch.equal(p, ours[name]), name
    assert len(ours) > len(dict(a.named_parameters()))
    idx = torch.randint(0, 512, (2, 16))
    if field == "layer_scalars":  # neutral at the start
        assert torch.equal(a(idx)[0], b(idx)[0])
    else:  # the gated value embedding reaches the attention's values
        assert not torch.allclose(a(idx)[0], b(idx)[0])


def test_each_ingredient_is_counted_and_bounded():
    setup = Setup(4, 2, "fsdp", "bf16", "blocks", "muon")
    for field, value in MODEL_ON.items():
        cfg = preset("tiny", 512, **{field: value})
        model = Transformer(cfg)
        assert parameter_count(cfg) == sum(p.numel() for p in model.parameters()), field
        assert cfg.ingredients == [f"{field}={value}"]
        if field != "mlp":  # what each keeps for the backward, or gathers, enters the estimate
            assert estimate(cfg, setup).total > estimate(preset("tiny", 512), setup).total, field
    everything = preset("tiny", 512, **MODEL_ON)
    model = Transformer(everything)
    assert parameter_count(everything) == sum(p.numel() for p in model.parameters())
    # The value embeddings are looked up, not multiplied: not in the FLOPs a token costs.
    assert model.num_parameters(non_embedding=True) == model.num_parameters() - 512 * 64 - 512 * 64
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)  # logits far past the cap
        logits, _ = model(torch.randint(0, 512, (2, 16)))
    assert logits.abs().max() <= 15.0  # tanh saturates to 1 in fp32
    plain = preset("tiny", 512, logit_softcap=15)
    assert plain.logit_softcap == 15.0 and isinstance(plain.logit_softcap, float)  # one setting, one hash
    capped, raw = Transformer(plain), Transformer(preset("tiny", 512))
    raw.load_state_dict(capped.state_dict())
    idx = torch.randint(0, 512, (2, 16))
    torch.testing.assert_close(capped(idx)[0], 15 * torch.tanh(raw(idx)[0] / 15))


def test_polar_express_orthogonalises_closer_than_newton_schulz():
    """Five iterations of each from the same bf16 start: Newton-Schulz leaves singular values down
    to ~0.6 (its quintic trades accuracy for speed); Polar Express's fitted steps bring every one
    into ~[0.85, 1.15]."""
    torch.manual_seed(0)
    matrices = [torch.randn(64, 176), torch.randn(176, 64), torch.randn(64, 64)]
    polar = newton_schulz.orthogonalise(matrices, newton_schulz.ORTHOGONALISERS["polar_express"])
    keller = newton_schulz.orthogonalise(matrices)
    for m, y, k in zip(matrices, polar, keller, strict=True):
        s, sk = torch.linalg.svdvals(y.float()), torch.linalg.svdvals(k.float())
        assert y.shape == m.shape and s.min() > 0.8 and s.max() < 1.2, s
        assert sk.min() < s.min()


def test_cautious_decay_decays_only_where_the_update_agrees_and_never_on_a_skipped_step():
    weight = torch.nn.Parameter(torch.tensor([[1.0, -1.0], [1.0, -1.0]]))
    group = {"params": [weight], "algorithm": "muon", "lr": 0.1, "weight_decay": 0.5, "lr_scale": 1.0}

    def step(cautious: bool, found_inf: float | None):
        w = torch.nn.Parameter(weight.detach().clone())
        opt = muon_adamw.MuonAdamW(
            [{**group, "params": [w]}], lr=0.1, betas=(0.9, 0.95), momentum=0.0, cautious_decay=cautious
        )
        w.grad = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])  # the update's sign, once orthogonalised
        if found_inf is not None:
            opt.found_inf = torch.tensor(found_inf)
        opt.step()
        return w.detach()

    update = step(False, None) - weight.detach() * (1 - 0.1 * 0.5)  # the update alone
    cautious = step(True, None)
    agree = (update * weight.detach()) < 0  # the step moves the weight toward zero here
    expected = weight.detach() - torch.where(agree, 0.1 * 0.5 * weight.detach(), 0.0) + update
    torch.testing.assert_close(cautious, expected)
    assert agree.any() and not agree.all()
    assert torch.equal(step(True, 1.0), weight.detach())  # a skipped step changes nothing
    assert torch.equal(step(True, 0.0), cautious)  # a taken step under the guard: the same step


def test_normuon_evens_out_the_neurons_steps_and_keeps_the_updates_norm():
    """Two steps by hand (NorMuon's formula: a running mean of each row's mean square, the rows
    divided by its root, the whole scaled back to the orthogonalised update's norm); a skipped step
    leaves the weight and the running mean alone."""
    torch.manual_seed(0)
    start = torch.randn(6, 10) * 0.1
    grads = [torch.randn(6, 10) * torch.arange(1, 7).unsqueeze(1) for _ in range(2)]
    group = {"algorithm": "muon", "lr": 0.1, "weight_decay": 0.0, "lr_scale": 1.0}

    def steps(beta2: float, found_inf: list[float | None]):
        w = torch.nn.Parameter(start.clone())
        opt = muon_adamw.MuonAdamW(
            [{**group, "params": [w]}], lr=0.1, betas=(0.9, 0.95), momentum=0.0, normuon_beta2=beta2
        )
        for g, skip in zip(grads, found_inf, strict=False):  # fewer found_inf: fewer steps (`once`)
            w.grad = g.clone()
            if skip is not None:
                opt.found_inf = torch.tensor(skip)
            opt.step()
        return w.detach(), opt.state[w].get("neuron_second_moment")

    moment, expected = torch.zeros(6, 1), start.clone()
    for g in grads:
        update = newton_schulz.orthogonalise([g])[0].float()
        moment = 0.95 * moment + 0.05 * update.square().mean(dim=1, keepdim=True)
        evened = update / (moment.sqrt() + 1e-10)
        expected -= 0.1 * evened * update.norm() / evened.norm()  # a wide matrix: Keller's factor is 1
    got, got_moment = steps(0.95, [None, None])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_moment, moment)
    plain, _ = steps(0.0, [None, None])
    assert not torch.allclose(got, plain, atol=1e-4)
    # The rows' steps are evened out: their sizes spread less than plain Muon's.
    spread = [((w - start).norm(dim=1).std() / (w - start).norm(dim=1).mean()).item() for w in (got, plain)]
    assert spread[0] < spread[1]
    skipped, skipped_moment = steps(0.95, [0.0, 1.0])
    once, once_moment = steps(0.95, [None])
    assert torch.equal(skipped, once) and torch.equal(skipped_moment, once_moment)


def documents(*docs: list[int], eot: int = 0) -> tuple[Documents, list[np.ndarray]]:
    """A tier of one shard holding ``docs``, each led by the end-of-text of the one before."""
    shard = np.array([t for doc in docs for t in (eot, *doc)], dtype=np.uint16)
    return Documents.index(Source("train/t", [shard], len(shard), len(shard)), eot, row_len=6), [shard]


def test_packing_fills_a_row_with_the_largest_documents_that_fit_then_crops_the_shortest():
    """nanochat's best fit: a 4-token document, then the 2-token one that fills the row (not the
    3-token one a first fit might take); when nothing fits, the shortest, cropped."""
    docs, shards = documents([1, 1, 1], [2], [3, 3])
    assert docs.length.tolist() == [4, 2, 3]
    assert docs.pack(shards, 1, np.random.default_rng(0))[0].tolist() == [0, 1, 1, 1, 0, 2]
    cropped, shards = documents([1, 1, 1, 1], [2, 2, 2])
    # 5 fits, then nothing fits the one token left: the shortest (4), cropped to its first token.
    assert cropped.pack(shards, 1, np.random.default_rng(0))[0].tolist() == [0, 1, 1, 1, 1, 0]


def test_a_document_longer_than_a_row_is_cut_into_rows_of_its_own():
    """Where nanochat crops it (and never trains on the rest), every token stays reachable."""
    docs, shards = documents([5] * 9, [6] * 7)
    pieces = zip(docs.start.tolist(), docs.length.tolist(), strict=True)
    assert list(pieces) == [(0, 6), (6, 4), (10, 6), (16, 2)]
    row = docs.pack(shards, 1, np.random.default_rng(0))[0].tolist()
    assert row in ([0, 5, 5, 5, 5, 5], [0, 6, 6, 6, 6, 6])  # a first piece: a whole row


def test_packed_rows_hold_whole_documents_and_a_steps_rows_are_drawn_again_alike(smoke_shards):
    """On real shards: every row is whole documents (or pieces) but the last, which is the start of
    one, and a step's rows are the same when drawn again (resume)."""
    shards = ShardSet(smoke_shards, 512, 64)
    stream = TrainStream(shards, 64, data_seed=1, packing="bos_best_fit")
    mix = {"gold": 1.0, "silver": 1.0}
    batch = stream.global_batch(3, 16, mix)
    pieces: dict[int, set] = {}
    for tier in ("gold", "silver"):
        d = stream.documents(tier)
        for i, s, n in zip(d.shard, d.start, d.length, strict=True):
            pieces.setdefault(int(n), set()).add(tuple(shards.sources[f"train/{tier}"].shards[i][s : s + n]))

    def packed(row: tuple, at: int = 0) -> bool:
        rest = row[at:]
        if any(p[: len(rest)] == rest for ps in pieces.values() for p in ps):
            return True  # the last: a piece, whole or cropped
        return any(row[at : at + n] in ps and packed(row, at + n) for n, ps in pieces.items())

    assert all(packed(tuple(row)) for row in batch)
    assert np.array_equal(stream.global_batch(3, 16, mix), batch)
    # Every token is reachable: the pieces of documents that go on across shards too.
    for tier in ("gold", "silver"):
        assert stream.documents(tier).length.sum() == shards.sources[f"train/{tier}"].n_tokens


def test_packing_a_tier_without_documents_is_refused_naming_the_fix():
    shard = np.arange(1, 40, dtype=np.uint16)  # no end-of-text (0) anywhere
    with pytest.raises(DataError, match="train/t holds no end-of-text token.*set pretrain.packing: windows"):
        Documents.index(Source("train/t", [shard], 39, 39), 0, row_len=6)


def test_every_ingredient_on_trains_alike_under_ddp_and_fsdp_and_resumes_exactly(
    tiny_config, trained, tmp_path
):
    one = trained(all_on(tiny_config), Launch(nproc_per_node=1))
    ddp = trained(all_on(tiny_config), Launch(nproc_per_node=2))
    fsdp = trained(all_on(tiny_config, parallel="fsdp"), Launch(nproc_per_node=2))
    # Two processes sum gradients in another order, which Muon's bf16 orthogonalisation can round
    # otherwise: test_muon_fsdp.py's tolerances; a few entries of the 512-token value-embedding
    # tables (AdamW's steps on a rarely seen token are large) move by up to 0.025, and the losses by
    # up to 0.0013 of 5.3 at step 12 (NorMuon alone: losses within 1e-5 under FSDP and on one process).
    reference = compare_runs.weights(one)
    for other in (ddp, fsdp):
        theirs = compare_runs.weights(other)
        assert theirs.keys() == reference.keys()
        for name, w in reference.items():
            atol = 5e-2 if name.startswith("value_embeds.") else 2e-2
            torch.testing.assert_close(theirs[name], w, rtol=0, atol=atol, msg=name)
        compare_runs.assert_same(one, other, exact=False, atol=5e-2, loss_atol=2e-3)
    # Every ingredient's parameters trained, on each layout.
    fresh = Transformer(preset("tiny", 512, **MODEL_ON)).state_dict()
    for run_dir in (one, ddp, fsdp):
        w = compare_runs.weights(run_dir)
        assert w["x0_scales"].abs().min() > 0 and not torch.equal(w["resid_scales"], fresh["resid_scales"])
        for name in ("blocks.1.attn.ve_gate.weight", "value_embeds.1.weight"):
            assert (w[name] - fresh[name]).abs().max() > 1e-3, (run_dir.name, name)
    losses = compare_runs.losses(one)
    assert losses[max(losses)] < losses[min(losses)] - 0.2  # it learns
    for launch, layout in ((Launch(nproc_per_node=1), {}), (Launch(nproc_per_node=2), {"parallel": "fsdp"})):
        stopped = tmp_path / f"stopped-{launch.nproc_per_node}"
        run(all_on(tiny_config, out_dir=str(stopped), end_step=6, **layout), launch)
        summary = run(all_on(tiny_config, out_dir=str(stopped), **layout), launch)
        assert summary["mode"] == "resume"
        compare_runs.assert_same(one if not layout else fsdp, stopped, exact=True)
    state = json.loads((one / "final" / "state.json").read_text())
    assert {k: state["config"]["model"][k] for k in MODEL_ON} == MODEL_ON


@pytest.mark.parametrize(
    "overrides, said",
    [
        (dict(optimizer="adamw", muon_cautious_decay=True), "muon_cautious_decay = True is Muon's"),
        (dict(optimizer="adamw", muon_orthogonaliser="polar_express"), "is Muon's: set optimizer: muon"),
        (dict(muon_cautious_decay=True), "decays nothing while muon_weight_decay is 0"),
        (dict(muon_orthogonaliser="polar"), "muon_orthogonaliser = 'polar' must be one of"),
        (dict(muon_normuon_beta2=1.0), r"muon_normuon_beta2 = 1.0 must lie in \[0, 1\)"),
        (dict(optimizer="adamw", muon_normuon_beta2=0.95), "muon_normuon_beta2 = 0.95 is Muon's"),
        (dict(packing="bos"), "packing = 'bos' must be one of"),
    ],
)
def test_a_muon_ingredient_where_it_cannot_apply_is_refused_by_name(tiny_config, overrides, said):
    with pytest.raises(ConfigError, match=said):
        tiny_config(**overrides)


@pytest.mark.parametrize(
    "overrides, said",
    [
        (dict(mlp="gelu"), "model.mlp = 'gelu' must be one of swiglu, relu2"),
        (dict(logit_softcap=-1), "model.logit_softcap = -1 must be a positive number"),
        (dict(logit_softcap="15"), "model.logit_softcap = '15' must be a positive number"),
        (dict(layer_scalars="yes"), "model.layer_scalars = 'yes' must be true or false"),
        (dict(value_embeds=True, d_model=8, n_head=2, d_ff=16), "needs model.d_model >= 12.*widen"),
        (dict(value_embed=True), r"unknown model field\(s\) value_embed \(did you mean value_embeds\?\)"),
    ],
)
def test_a_model_ingredient_out_of_range_is_refused_by_name(overrides, said):
    with pytest.raises(ValueError, match=said):
        preset("tiny", 512, **overrides)


def test_a_model_with_ingredients_exports_plain_and_is_refused_as_a_transformers_class(
    tiny_config, trained, tmp_path
):
    run_dir = trained(all_on(tiny_config), Launch(nproc_per_node=1))
    with pytest.raises(ExportError, match="mlp=relu2, logit_softcap=15.0, .* export it without --hf"):
        export_hf(run_dir / "final", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    folder = export_plain(run_dir / "final", tmp_path / "plain")
    modes = {f.stat().st_mode & 0o777 for f in folder.iterdir()}
    assert len(modes) == 1, modes  # the weights as readable as the config and the tokenizer
    exported = load_export(folder, torch.device("cpu"))
    assert exported.cfg.ingredients == Transformer(preset("tiny", 512, **MODEL_ON)).cfg.ingredients


def test_a_branch_is_refused_another_model_and_told_of_another_optimizer(
    tiny_config, trained, tmp_path, caplog
):
    """A branch builds its model and optimizer from the pretrain params as they are now: a model
    other than its origin's is refused, naming each field and the fix (the weights would not load);
    an optimizer other than its origin's trains, and the log says what changed."""
    origin = trained(all_on(tiny_config), Launch(nproc_per_node=1)) / "final"
    longer = {**STEPS, "planned_steps": 16, "init_from": str(origin)}
    plain = tiny_config(out_dir=str(tmp_path / "plain"), **longer)
    with pytest.raises(CheckpointError) as refused:
        train(plain)
    said = str(refused.value)
    assert "model.layer_scalars (True there, off here)" in said
    assert "model.mlp (relu2 there, off here)" in said
    assert "give it the stable run's pretrain.model.overrides" in said
    other = tiny_config(model=preset("tiny", 512, **MODEL_ON), out_dir=str(tmp_path / "other"), **longer)
    with caplog.at_level("WARNING", logger="lehr.train"):
        assert train(other)["mode"] == "branch"
    told = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "muon_orthogonaliser off (origin: polar_express)" in told, told
    assert "muon_cautious_decay off (origin: True)" in told


def test_weights_of_another_shape_are_refused_naming_the_fix(tmp_path):
    save_model(Transformer(preset("tiny", 512, mlp="relu2")), str(tmp_path / "model.safetensors"))
    said = r"another model shape \(missing \['blocks.0.mlp.gate_proj.weight'.*trained with"
    with pytest.raises(CheckpointError, match=said):
        load_weights(tmp_path, Transformer(preset("tiny", 512)))


def test_lehr_info_names_the_ingredients_a_checkpoint_was_trained_with(tiny_config, trained, capsys):
    run_dir = trained(all_on(tiny_config), Launch(nproc_per_node=1))
    assert main(["info", str(run_dir / "final")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ingredients"))
    assert line.split(None, 1)[1].strip() == (
        "mlp=relu2, logit_softcap=15.0, layer_scalars=True, value_embeds=True, "
        "muon_orthogonaliser=polar_express, muon_cautious_decay=True, muon_normuon_beta2=0.95, "
        "packing=bos_best_fit, batch_warmup_steps=8"
    )


TAIL = dict(planned_steps=12, anneal_start=6, anneal_steps=6, micro_batch=2, eval_every=6, ckpt_every=1)


def test_tail_averaging_makes_the_final_model_the_mean_of_the_decays_last_steps(tiny_config, tmp_path):
    """The weights after each of the decay's last 3 steps (a run without averaging, checkpointed
    every step, gives them), averaged, are the final model; the training until then is the plain
    run's, bit for bit, and the last eval scores the average."""
    plain = tmp_path / "plain"
    run(tiny_config(out_dir=str(plain), keep_last=20, **TAIL), Launch(nproc_per_node=1))
    averaged = tmp_path / "averaged"
    summary = run(tiny_config(out_dir=str(averaged), tail_steps=3, **TAIL), Launch(nproc_per_node=1))
    steps = [load_file(plain / "checkpoints" / f"step_{s:08d}" / "model.safetensors") for s in (10, 11, 12)]
    final = compare_runs.weights(averaged)
    for name, w in final.items():
        torch.testing.assert_close(w, sum(s[name] for s in steps) / 3, rtol=0, atol=1e-7, msg=name)
    losses = compare_runs.losses(plain)
    assert compare_runs.losses(averaged) == {k: v for k, v in losses.items() if k <= 12}
    evals = [json.loads(line) for line in (averaged / "metrics.jsonl").read_text().splitlines()]
    last = [e for e in evals if e["kind"] == "eval"]
    # The decay's end is evaluated twice: its own weights (eval_every), then their tail's average.
    assert [e["step"] for e in last[-2:]] == [12, 12] and summary["heldout"]["step"] == 12
    assert summary["heldout"]["heldout"]["loss"] == last[-1]["heldout.loss"] != last[-2]["heldout.loss"]
    state = json.loads((averaged / "final" / "state.json").read_text())
    assert state["config"]["tail_steps"] == 3


@pytest.mark.parametrize("layout", [{}, {"parallel": "fsdp"}], ids=["one process", "fsdp"])
def test_tail_averaging_resumes_exactly_from_inside_the_tail(tiny_config, tmp_path, layout):
    """Stopped at step 11, inside the tail (its sums saved with the optimizer's state, sharded
    under FSDP), and resumed: the same final model as the run that never stopped."""
    launch = Launch(nproc_per_node=2 if layout else 1)
    cfg = dict(TAIL, tail_steps=3, ckpt_every=4, **layout)
    run(tiny_config(out_dir=str(tmp_path / "straight"), **cfg), launch)
    stopped = tmp_path / "stopped"
    run(tiny_config(out_dir=str(stopped), end_step=11, **cfg), launch)
    summary = run(tiny_config(out_dir=str(stopped), **cfg), launch)
    assert summary["mode"] == "resume" and summary["step"] == 12
    compare_runs.assert_same(tmp_path / "straight", stopped, exact=True)


@pytest.mark.parametrize(
    "overrides, said",
    [
        (dict(tail_steps=3), "tail_steps = 3 averages the decay's last steps: it needs an anneal_start"),
        (dict(tail_steps=9, anneal_start=6, anneal_steps=6), "at most anneal_steps \\(6\\)"),
    ],
)
def test_a_tail_outside_the_decay_is_refused(tiny_config, overrides, said):
    with pytest.raises(ConfigError, match=said):
        tiny_config(**overrides)


def test_a_branch_leaves_its_origins_tail_behind_and_an_fsdp_branch_may_turn_normuon_on(
    tiny_config, tmp_path
):
    """An origin saved inside its tail (stopped short of its decay's end) holds tail sums: a branch
    from it starts without them. Under FSDP a branch may turn NorMuon on from an origin trained
    without it: its per-neuron moments start from nothing, as on one process."""
    stopped = tmp_path / "stopped"
    run(
        tiny_config(out_dir=str(stopped), end_step=11, tail_steps=3, **{**TAIL, "ckpt_every": 4}),
        Launch(nproc_per_node=1),
    )
    origin = torch.load(stopped / "final" / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    assert any("tail_sum" in s for s in origin.values())
    branch = dict(
        init_from=str(stopped / "final"), planned_steps=13, anneal_start=11, anneal_steps=2, end_step=13
    )
    run(tiny_config(out_dir=str(tmp_path / "branch"), **branch), Launch(nproc_per_node=1))
    state = torch.load(tmp_path / "branch" / "final" / "optimizer.pt", weights_only=True)["optimizer"][
        "state"
    ]
    assert not any("tail_sum" in s for s in state.values())
    plain = tmp_path / "plain"
    run(tiny_config(out_dir=str(plain), parallel="fsdp", **STEPS), Launch(nproc_per_node=2))
    on = dict(init_from=str(plain / "final"), planned_steps=16, anneal_start=12, anneal_steps=4, end_step=16)
    on |= dict(micro_batch=2, eval_every=4, ckpt_every=4, muon_normuon_beta2=0.95)
    summary = run(
        tiny_config(out_dir=str(tmp_path / "fsdp"), parallel="fsdp", **on), Launch(nproc_per_node=2)
    )
    assert summary["mode"] == "branch" and summary["step"] == 16
    run(tiny_config(out_dir=str(tmp_path / "one"), **on), Launch(nproc_per_node=1))
    compare_runs.assert_same(tmp_path / "one", tmp_path / "fsdp", exact=False, atol=2e-2, loss_atol=1e-3)


WARMUP = dict(batch_warmup_steps=8, batch_warmup_start=2, planned_steps=12, eval_every=6, ckpt_every=4)


def test_a_batch_size_warmup_draws_its_stages_and_counts_their_tokens(tiny_config, tmp_path):
    cfg = tiny_config(**WARMUP, out_dir=str(tmp_path / "warm"))
    assert [cfg.batch_ramp.rows(s) for s in range(10)] == [2, 2, 2, 4, 4, 4, 6, 6, 8, 8]
    summary = run(cfg, Launch(nproc_per_node=1))
    rows = 3 * 2 + 3 * 4 + 2 * 6 + 4 * 8
    assert summary["tokens"] == rows * 64 == cfg.batch_ramp.rows_before(12) * 64
    assert sum(t["tokens"] for t in summary["tiers"].values()) == summary["tokens"]
    # Its first stage is a plain run of 2 sequences a step: the same windows, the same updates.
    plain = dict(WARMUP, batch_warmup_steps=0, batch_size=2, micro_batch=2, end_step=3)
    run(tiny_config(**plain, out_dir=str(tmp_path / "plain")), Launch(nproc_per_node=1))
    run(dataclasses.replace(cfg, end_step=3, out_dir=str(tmp_path / "first")), Launch(nproc_per_node=1))
    compare_runs.assert_same(tmp_path / "plain", tmp_path / "first", exact=True)


def test_micro_batches_of_unequal_rows_weigh_each_by_its_rows():
    """A warmup stage of 6 sequences in micro-batches of 4 and 2 accumulates the gradient of the
    6 together, to fp32's rounding (a plain count would weigh the 2 as much as the 4)."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", 512))
    rows = torch.randint(0, 512, (6, 65))
    pairs = [(rows[:4, :-1], rows[:4, 1:]), (rows[4:, :-1], rows[4:, 1:])]
    hw, scaler = resolve("cpu", "fp32", None), torch.amp.GradScaler("cpu", enabled=False)
    grads = []
    for batches in (pairs, [(rows[:, :-1], rows[:, 1:])]):
        model.zero_grad()
        loss = update.accumulate(model, model, batches, scaler, hw)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    (split, split_grads), (whole, whole_grads) = grads
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-6)
    for a, b in zip(split_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_batch_size_warmups_stages_and_tokens_invert_exactly():
    for steps, start, batch in ((8, 2, 8), (10, 4, 16), (105, 4, 16), (7, 1, 8), (3, 3, 12)):
        cfg = DataConfig(batch_size=batch, micro_batch=1, batch_warmup_steps=steps, batch_warmup_start=start)
        ramp = cfg.batch_ramp
        stages = [ramp.rows(s) for s in range(steps)]
        assert stages == sorted(stages) and set(stages) == set(range(start, batch, start)), stages
        assert [ramp.rows(s) for s in range(steps, steps + 3)] == [batch] * 3
        for s in range(steps + 5):
            assert ramp.rows_before(s + 1) - ramp.rows_before(s) == ramp.rows(s)
            assert ramp.steps_in(ramp.rows_before(s)) == s
    default_start = DataConfig(batch_warmup_steps=10).batch_ramp
    assert [default_start.rows(s) for s in range(11)] == [4] * 4 + [8] * 3 + [12] * 3 + [16]


@pytest.mark.parametrize(
    "overrides, said",
    [
        (
            dict(batch_warmup_start=3),
            r"batch_warmup_start = 3 must divide batch_size 8 .* below it \(e.g. 2\)",
        ),
        (dict(batch_warmup_start=8), "batch_warmup_start = 8 must divide batch_size 8 and be smaller"),
        (dict(batch_warmup_steps=-1), r"batch_warmup_steps = -1 must be >= 0 \(0 = off\)"),
        (
            dict(batch_warmup_steps=2, batch_warmup_start=1),
            "batch_warmup_steps = 2 is fewer than the warmup's 7",
        ),
        (dict(batch_size=1, micro_batch=1), "a batch_size of 1 has none: set batch_warmup_steps: 0"),
    ],
)
def test_a_batch_size_warmup_out_of_range_is_refused_by_name(tiny_config, overrides, said):
    with pytest.raises(ConfigError, match=said):
        tiny_config(**{**WARMUP, **overrides})


def test_a_batch_size_warmup_whose_stages_do_not_split_over_the_processes_is_refused(tiny_config):
    cfg = tiny_config(**WARMUP, micro_batch=1)
    cfg.check_split(2)
    with pytest.raises(ValueError, match="batch_warmup_start 2 does not split evenly over 4 processes"):
        cfg.check_split(4)
