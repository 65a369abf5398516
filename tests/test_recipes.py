"""The authors' recipes: presets and their overrides, the optimiser split and arithmetic, schedules, the VECA
multi-resolution stage and validation, and one training step of each method against its authors' own (their
fixtures: VECA's PyTorch step, LookWhere's JAX step)."""

import json
import math

import pytest
import torch
from conftest import (
    ROOT, TINY_VECA, lookwhere_args, nothing_written, read_metrics, tiny_lookwhere_config, tiny_veca_config, veca_args,
)
from safetensors.torch import load_file
from transformers import AutoModel

from benchmarks import recipe_parity
from corevision_hf import LookWhereModel, VecaModel, lookwhere_from_teacher
from corevision_hf.convert.veca import convert_reference_state_dict, load_reference_checkpoint
from training import distill_lookwhere, distill_veca, optim
from training.optim import DistillOptimizer, build_optimizer
from training.arguments import parse_config_overrides
from training.recipes import load_recipe
from training.schedule import draw, draw_int, warmup_cosine
from training.teacher import copy_patch_embedding, teacher_targets_and_map

FIXTURE = ROOT / "tests" / "fixtures" / "parity" / "training" / "veca" / "tiny_a"
CASE = json.loads((FIXTURE / "case.json").read_text())
LOOKWHERE_FIXTURE = ROOT / "tests" / "fixtures" / "parity" / "training" / "lookwhere" / "case_a"
# Made here with the authors' JAX code: other sizes, register counts, k and schedule phases (their README).
LOOKWHERE_GENERATED = ROOT / "tests" / "fixtures" / "parity" / "training" / "lookwhere_generated"


def fixture_student() -> VecaModel:
    state_dict, reference_config = load_reference_checkpoint(str(FIXTURE / "reference_checkpoint.pt"))
    config, weights = convert_reference_state_dict(state_dict, reference_config=reference_config)
    model = VecaModel(config)
    model.load_state_dict(weights)
    return model


# ------------------------------------------------------------------------ one step against the authors' code


def test_a_training_step_equals_the_authors_on_their_fixture(capsys):
    report = recipe_parity.check_case(FIXTURE)
    assert report.print(), capsys.readouterr().out
    kinds = {row[0].split(" ", 1)[0] for row in report.rows}
    assert {"loss", "output", "gradient", "weights-after-step-1", "weights-after-step-2",
            "orthogonalisation-input"} <= kinds
    assert len([row for row in report.rows if row[0].startswith("weights-after-step-2")]) == len(
        CASE["model"]["parameter_names"])


def _no_nested_rows(groups):
    return [{**group, "nested_rows": False} if "nested_rows" in group else group for group in groups]


@pytest.mark.parametrize("mutation", ["adamw betas (0.9, 0.95)", "no cautious decay", "bank rows decayed as one"])
def test_the_step_comparison_fails_on_a_wrong_recipe(monkeypatch, mutation):
    """The fixture README's catches: each of these departures from the authors is above the tolerances."""
    if mutation == "adamw betas (0.9, 0.95)":
        monkeypatch.setattr(optim, "ADAMW_DEFAULTS", dict(betas=(0.9, 0.95), eps=1e-8))
    elif mutation == "no cautious decay":
        monkeypatch.setattr(optim, "NORMUON_DEFAULTS", {**optim.NORMUON_DEFAULTS, "cautious_weight_decay": False})
    else:
        veca_groups = optim.veca_groups
        monkeypatch.setattr(optim, "veca_groups", lambda *args: _no_nested_rows(veca_groups(*args)))
    assert not recipe_parity.check_case(FIXTURE).print()


def test_the_benchmark_command_exits_0_on_the_fixtures(capsys):
    assert recipe_parity.main(["veca", str(FIXTURE)]) == 0
    assert "worst of all" in capsys.readouterr().out.splitlines()[-1]


def lookwhere_recipe_with(**numerics) -> dict:
    """The lookwhere-dinov2 recipe with some of its student numerics changed."""
    recipe = load_recipe("lookwhere-dinov2")
    return {**recipe, "config_overrides": json.dumps({**parse_config_overrides(recipe["config_overrides"]), **numerics})}


@pytest.mark.parametrize("folder", [LOOKWHERE_FIXTURE, LOOKWHERE_GENERATED / "case_b", LOOKWHERE_GENERATED / "case_c"],
                         ids=["case_a", "case_b", "case_c"])
def test_a_lookwhere_step_equals_the_authors_jax_step_on_their_fixture(capsys, folder):
    report = recipe_parity.check_lookwhere_case(folder)
    assert report.print(), capsys.readouterr().out
    kinds = {row[0].split(" ", 1)[0] for row in report.rows}
    assert {"flax-names-read", "teacher-target", "learning-rate", "loss", "selector-map", "selected-patches", "output",
            "gradient", "weights-after-step-1", "weights-after-step-2", "weights-within-2e-7-after-step-2"} <= kinds
    model = json.loads((folder / "case.json").read_text())["model"]
    config = tiny_lookwhere_config(num_hidden_layers=model["extractor_layers"], selector_depth=model["selector_layers"])
    parameters = len(list(LookWhereModel(config).parameters()))  # as many tensors as the case's model
    assert len([row for row in report.rows if row[0].startswith("weights-after-step-2")]) == parameters
    assert len([row for row in report.rows if row[0].startswith("teacher-target")]) == 2 * 4


@pytest.mark.parametrize("difference", [
    "LayerNorm epsilon 1e-6", "exact GELU in the MLPs", "exact GELU in the map head", "map resize without antialiasing",
    "k = M + 1 runs M + 1 patches", "weight decay on every parameter", "teacher with LayerNorm epsilon 1e-6",
])
def test_the_lookwhere_step_comparison_fails_on_each_difference_put_back(monkeypatch, difference):
    """The four places where our step differed from the authors' (issue #36), and two more: each is caught."""
    recipe = {
        "LayerNorm epsilon 1e-6": lookwhere_recipe_with(layer_norm_eps=1e-6),
        "exact GELU in the MLPs": lookwhere_recipe_with(hidden_act="gelu"),
        "exact GELU in the map head": lookwhere_recipe_with(map_head_act="gelu"),
        "map resize without antialiasing": lookwhere_recipe_with(selector_map_antialias=False),
    }.get(difference)
    if difference == "k = M + 1 runs M + 1 patches":
        monkeypatch.setattr(recipe_parity, "patches_kept", lambda k, slots: k)
    elif difference == "weight decay on every parameter":
        monkeypatch.setattr(optim, "lookwhere_groups", lambda model, decay: [optim.group(
            list(model.named_parameters()), "adamw", decay, **optim.ADAMW_DEFAULTS, nested_rows=False)])
    elif difference == "teacher with LayerNorm epsilon 1e-6":
        build = recipe_parity.dinov2_from_flax
        monkeypatch.setattr(recipe_parity, "dinov2_from_flax", lambda weights, heads, eps, act: build(
            weights, heads, 1e-6, act))
    assert not recipe_parity.check_lookwhere_case(LOOKWHERE_FIXTURE, recipe).print()


def test_the_authors_map_queries_are_positions_not_patches():
    """case_b's teacher has 2 registers: the authors' map target averages the queries at positions 5.. (their
    `attn_map[:, 5:1374]`), which leaves out its first two patches; every patch query is another target."""
    recipe = {**load_recipe("lookwhere-dinov2"), "map_queries": "patches"}
    report = recipe_parity.check_lookwhere_case(LOOKWHERE_GENERATED / "case_b", recipe)
    assert not report.print()
    assert {row[0] for row in report.rows if row[2] > 1} == {f"teacher-target step {s} map" for s in (1, 2)}


def test_the_lookwhere_benchmark_command_exits_0_on_the_fixtures(capsys):
    cases = sorted(str(path) for path in LOOKWHERE_GENERATED.iterdir() if path.is_dir())
    assert recipe_parity.main(["lookwhere", str(LOOKWHERE_FIXTURE), *cases]) == 0
    assert "worst of all" in capsys.readouterr().out.splitlines()[-1]


def test_a_converted_release_keeps_the_release_numerics():
    """The release's inference code: exact GELU, epsilon 1e-6, no antialiasing; the recipe's student differs."""
    from corevision_hf.convert.lookwhere import convert_reference_state_dict, load_lookwhere_checkpoint

    checkpoint = load_lookwhere_checkpoint(str(LOOKWHERE_FIXTURE / "reference_checkpoint.pt"))
    config, _ = convert_reference_state_dict(checkpoint, 3)
    release = dict(hidden_act="gelu", map_head_act="gelu", layer_norm_eps=1e-6, selector_antialias=False,
                   selector_map_antialias=False)
    assert {name: getattr(config, name) for name in release} == release
    training = parse_config_overrides(load_recipe("lookwhere-dinov2")["config_overrides"])
    assert training == dict(hidden_act="gelu_pytorch_tanh", map_head_act="gelu_pytorch_tanh", layer_norm_eps=1e-5,
                            selector_antialias=True, selector_map_antialias=True)


def test_a_lookwhere_run_keeps_its_numerics_and_runs_at_most_k_slots(teacher_dir, image_dir, tmp_path):
    numerics = dict(hidden_act="gelu_pytorch_tanh", map_head_act="gelu_pytorch_tanh", layer_norm_eps=1e-5,
                    selector_map_antialias=True)
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3", "--k-slots", "5",
                                          "--config-overrides", json.dumps(numerics)))
    assert [m["k"] for m in read_metrics(tmp_path)] == [min(draw_int(2, 8, 3, step), 5) for step in range(3)]
    config = AutoModel.from_pretrained(tmp_path / "final").config
    assert {name: getattr(config, name) for name in numerics} == numerics


# ------------------------------------------------------------------------ who gets which optimiser


def test_the_veca_split_is_the_authors():
    """NorMuon and AdamW sets equal the authors' (veca/optim.py) for the fixture model, q / k / v counted apart."""
    optimizer = build_optimizer(fixture_student(), "normuon", 4e-4, 0.015)
    chunk = CASE["model"]["nested_chunk_size"]
    names = {"normuon": set(), "adamw": set()}
    for group in optimizer.param_groups:
        tensors = {name: torch.zeros(param.shape) for name, param in zip(group["names"], group["params"])}
        names[group["algorithm"]] |= set(recipe_parity.reference_names(tensors, chunk))
        assert group["weight_decay"] == 0.015  # the authors decay every parameter
    # biases go to AdamW, as the authors' do
    assert names["normuon"] == set(CASE["optimizer"]["normuon_names"])
    assert names["adamw"] == set(CASE["optimizer"]["adamw_names"])
    assert not any(g.get("split_sizes") for g in optimizer.param_groups)  # q / k / v are matrices of their own


def test_the_veca_split_follows_the_modules_under_a_wrapper():
    """The groups come from the modules that hold each parameter, so a wrapper's prefix (PEFT's `base_model.model.`)
    changes nothing: the same weights land in the same groups (the bank, both of PEFT's copies, in the nested one; the
    coordinate heads and the last MLP output out of NorMuon's), and LoRA's matrices join NorMuon's."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config())
    plain = [set(group["names"]) for group in optim.veca_groups(model, "normuon", 0.05)]
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["core_bank"]))
    wrapped.requires_grad_(True)  # every tensor trains, as in a full fine-tune beside the adapters
    groups = [set(group["names"]) for group in optim.veca_groups(wrapped, "normuon", 0.05)]

    def ours(name: str) -> str:
        return name.removeprefix("base_model.model.").replace(".base_layer", "").replace(".original_module", "")

    assert {ours(name) for name in groups[0] if ".lora_" not in name} == plain[0]
    assert any(".lora_A." in name for name in groups[0])
    assert {ours(name) for name in groups[1]} == plain[1]
    assert {ours(name).replace(".modules_to_save.default", "") for name in groups[2]} == plain[2] == {
        "embeddings.core_bank.cores", "embeddings.core_bank.coordinates"}
    assert len(groups[2]) == 4


def test_lookwhere_decays_kernels_only():
    """optax.adamw's mask in the authors' pretraining: Dense and Conv kernels decay; nothing else does."""
    model = LookWhereModel(tiny_lookwhere_config())
    decayed, kept = (set(g["names"]) for g in build_optimizer(model, "adamw", 1e-4, 0.05).param_groups)
    kernels = {f"{part}.embeddings.patch_embeddings.projection.weight" for part in ("selector", "extractor")}
    kernels |= {"selector.map_head.0.weight", "selector.map_head.2.weight"}
    for part, depth in [("selector", 1), ("extractor", 3)]:
        for layer in range(depth):
            kernels |= {f"{part}.layers.{layer}.{name}.weight"
                        for name in ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
                                     "mlp.fc1", "mlp.fc2")}
    assert decayed == kernels
    assert {"selector.embeddings.cls_token", "selector.embeddings.register_tokens",
            "selector.embeddings.position_embeddings", "extractor.embeddings.position_embeddings", "selector.norm.weight",
            "extractor.layers.0.layer_scale1.lambda1", "extractor.layers.2.mlp.fc2.bias"} <= kept
    assert decayed | kept == {name for name, _ in model.named_parameters()}
    groups = build_optimizer(model, "adamw", 1e-4, 0.05).param_groups
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]


def test_normuon_is_refused_for_lookwhere(teacher_dir, image_dir, tmp_path):
    with pytest.raises(ValueError, match="NorMuon split .* VECA authors'"):
        distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "1",
                                              "--optimizer", "normuon"))
    assert nothing_written(tmp_path / "run")


def test_plain_groups_step_as_torch_adamw():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(5, 3))
    theirs.data.copy_(ours.data)
    ours_optimizer = DistillOptimizer([optim.group([("w", ours)], "adamw", 0.1, **optim.ADAMW_DEFAULTS,
                                                   nested_rows=False)], lr=1e-2)
    torch_optimizer = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(5, 3)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        ours_optimizer.step()
        torch_optimizer.step()
    assert torch.equal(ours, theirs)


def test_bank_rows_outside_the_budget_keep_weights_moments_and_step_count():
    """Nested dropout: cores beyond a step's budget get no update at all, and their first update later is a first
    AdamW step (bias correction of step 1), as the authors' separately stored chunks get."""
    torch.manual_seed(0)
    bank = torch.nn.Parameter(torch.randn(1, 4, 3))
    start = bank.detach().clone()
    optimizer = DistillOptimizer([optim.group([("embeddings.core_bank.cores", bank)], "adamw", 0.1, **optim.ADAMW_DEFAULTS,
                                              nested_rows=True)], lr=1e-2)
    first, second = torch.randn(1, 4, 3), torch.randn(1, 4, 3)
    first[:, 2:] = 0  # budget 2 of 4 at step 1
    bank.grad = first.clone()
    optimizer.step()
    assert torch.equal(bank[:, 2:], start[:, 2:])
    assert torch.equal(optimizer.state[bank]["exp_avg"][:, 2:], torch.zeros(1, 2, 3))
    bank.grad = second.clone()
    optimizer.step()
    reference = {}
    for rows, grads in [(slice(0, 2), [first, second]), (slice(2, 4), [second])]:
        weights = torch.nn.Parameter(start[:, rows].clone())
        torch_optimizer = torch.optim.AdamW([weights], lr=1e-2, weight_decay=0.1)
        for grad in grads:
            weights.grad = grad[:, rows].clone()
            torch_optimizer.step()
        reference[rows.start] = weights.detach()
    assert torch.allclose(bank[:, :2], reference[0], atol=1e-6, rtol=0)  # float rounding of weights near 2
    assert torch.allclose(bank[:, 2:], reference[2], atol=1e-6, rtol=0)
    assert optimizer.state[bank]["step"].flatten().tolist() == [2, 2, 1, 1]


# ------------------------------------------------------------------------ schedules, k range, the map target


def test_the_veca_schedule_is_the_authors():
    recipe = load_recipe("veca-pretrain")
    schedule = CASE["schedule"]
    ratios = (recipe["min_lr"] / recipe["lr"], recipe["warmup_start_lr"] / recipe["lr"])
    assert (recipe["warmup_steps"], recipe["max_steps"]) == (schedule["warmup_steps"], schedule["total_steps"])
    for step in CASE["steps"]:  # LambdaLR's factor at the fixture's step indices, as the authors' code computed it
        index = step["scheduler_step_index"]
        assert warmup_cosine(index, recipe["warmup_steps"], recipe["max_steps"], *ratios) == pytest.approx(
            step["lr_lambda"], rel=1e-12)
        assert recipe["lr"] * step["lr_lambda"] == pytest.approx(step["lr"]["adamw"], rel=1e-12)
    # the warm-up starts at lr_min: step 0 runs at 5e-5, not at 0
    assert recipe["lr"] * warmup_cosine(0, recipe["warmup_steps"], recipe["max_steps"], *ratios) == pytest.approx(5e-5)


@pytest.mark.parametrize("step, lr", [(0, 1e-7), (25_000, 1e-7 + (1e-4 - 1e-7) / 2), (50_000, 1e-4),
                                      (275_000, 1e-6 + (1e-4 - 1e-6) / 2), (500_000, 1e-6)])
def test_the_lookwhere_schedule_is_optax_warmup_cosine_decay(step, lr):
    """optax.warmup_cosine_decay_schedule(init 1e-7, peak 1e-4, warm-up 50k, decay_steps 500k, end 1e-6), by hand."""
    recipe = load_recipe("lookwhere-dinov2")
    ratios = (recipe["min_lr"] / recipe["lr"], recipe["warmup_start_lr"] / recipe["lr"])
    assert recipe["lr"] * warmup_cosine(step, recipe["warmup_steps"], recipe["max_steps"], *ratios) == pytest.approx(
        lr, rel=1e-9)


def test_the_lookwhere_k_range_is_the_authors_randint():
    """random.randint(16, 128 + 1) in the authors' main.py draws 16..129, both ends included; they select M = 128
    patches, so k = 129 runs 128."""
    recipe = load_recipe("lookwhere-dinov2")
    drawn = [draw_int(recipe["k_min"], recipe["k_max"], 0, step) for step in range(3000)]
    assert set(drawn) == set(range(16, 130))
    assert {distill_lookwhere.patches_kept(k, recipe["k_slots"]) for k in drawn} == set(range(16, 129))


def test_the_map_target_is_float32_under_bf16_autocast(teacher_dir):
    """The KL target is a softmax of the teacher's attention logits: they are computed in float32 from the last
    attention's input even under mixed precision (bf16 linear layers would be off by about 1e-2)."""
    teacher = AutoModel.from_pretrained(teacher_dir).eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    attention = teacher.encoder.layer[-1].attention
    captured = []
    handle = attention.register_forward_pre_hook(lambda module, args, kwargs: captured.append(
        (args[0] if args else kwargs["hidden_states"]).detach()), with_kwargs=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, teacher_map = teacher_targets_and_map(teacher, pixel_values, (4, 4))
    handle.remove()
    normed = captured[0].double()[:, -16:]
    heads, width = teacher.config.num_attention_heads, teacher.config.hidden_size
    query = torch.nn.functional.linear(normed.mean(1, keepdim=True), attention.q_proj.weight.double(),
                                       attention.q_proj.bias.double()).view(2, 1, heads, -1).transpose(1, 2)
    key = torch.nn.functional.linear(normed, attention.k_proj.weight.double(),
                                     attention.k_proj.bias.double()).view(2, 16, heads, -1).transpose(1, 2)
    expected = (query @ key.transpose(-1, -2)).squeeze(2).mean(1) / math.sqrt(width // heads)
    assert teacher_map.dtype == torch.float32
    assert torch.allclose(teacher_map.double(), expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------ presets and their overrides


def test_a_recipe_sets_defaults_and_flags_override_them(teacher_dir, image_dir, tmp_path):
    args = veca_args(teacher_dir, image_dir, tmp_path, "--recipe", "veca-pretrain", "--max-steps", "2",
                     "--mixed-precision", "no", "--eval-every", "0", "--checkpoint-every", "2", "--image-size", "32")
    distill_veca.main(args)
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["recipe"] == "veca-pretrain"
    effective = recipe["args"]
    assert (effective["optimizer"], effective["max_grad_norm"], effective["warmup_start_lr"]) == ("normuon", 0, 5e-5)
    assert effective["augment"] == "veca" and effective["patch_embed_from_teacher"] is True
    assert set(recipe["recipe_overrides"]) == {"teacher", "config_overrides", "image_size", "batch_size", "max_steps",
                                               "mixed_precision", "eval_every", "checkpoint_every"}
    assert recipe["recipe_overrides"]["max_steps"] == {"recipe": 1_350_000, "used": 2}
    import shlex

    assert vars(distill_veca.parse_args(shlex.split(recipe["command"])[3:])) == {**vars(distill_veca.parse_args(args))}
    assert [m["lr"] for m in read_metrics(tmp_path)] == pytest.approx([4e-4 * warmup_cosine(
        s, 250_000, 2, 5e-5 / 4e-4, 5e-5 / 4e-4) for s in range(2)])


@pytest.mark.parametrize("script, extra, message", [
    ("veca", ["--recipe", "veca-fast"], "not a recipe; choose one of finetune-final, finetune-guarded, lookwhere-dinov2, veca-multires, "
                                        "veca-pretrain"),
    ("veca", ["--recipe", "lookwhere-dinov2"], "recipe of training.distill_lookwhere, not of training.distill_veca"),
    ("veca", ["--recipe", "veca-multires"], "needs --init-from"),
    ("veca", ["--teacher-microbatch", "3"], "larger than the batch"),
    ("veca", ["--resolutions", "32:1;0=16:1"], "increasing steps"),
    ("lookwhere", ["--config-overrides", '{"hidden_size": 64}'], "sets hidden_size, which the teacher fixes"),
    ("lookwhere", ["--config-overrides", '{"layer_norm_epsilon": 1e-5}'],
     "sets layer_norm_epsilon, which LookWhereConfig does not"),
    ("lookwhere", ["--config-overrides", '{"hidden_act": "gelu_tanh"}'], "hidden_act='gelu_tanh' is not an activation"),
    ("lookwhere", ["--config-overrides", "[1]"], "must be a JSON object"),
    ("lookwhere", ["--k-slots", "1"], "--k-slots 1 is below --k-min 2"),
])
def test_bad_distillation_arguments_are_one_clear_error(teacher_dir, image_dir, tmp_path, script, extra, message):
    scripts = {"veca": (distill_veca.main, veca_args), "lookwhere": (distill_lookwhere.main, lookwhere_args)}
    main, arguments = scripts[script]
    with pytest.raises(ValueError, match=message):
        main(arguments(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "1", *extra))
    assert nothing_written(tmp_path / "run")


# ------------------------------------------------------------------------ the multi-resolution stage


@pytest.fixture(scope="module")
def stage1(teacher_dir, image_dir, tmp_path_factory):
    """A 2-step stage-1 run with validation every step: OUT/best and OUT/final."""
    out = tmp_path_factory.mktemp("stage1")
    distill_veca.main(veca_args(teacher_dir, image_dir, out, "--max-steps", "2", "--eval-every", "1",
                                "--eval-data", image_dir, "--eval-budgets", "2,8", "--eval-images", "3"))
    return out


def test_validation_keeps_the_best_checkpoint(stage1):
    lines = [json.loads(line) for line in (stage1 / "validation.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert [(row["resolution"], row["num_cores"], row["images"]) for row in lines[0]["grid"]] == [(32, 2, 3), (32, 8, 3)]
    best = json.loads((stage1 / "best" / "validation.json").read_text())
    assert best == max(lines, key=lambda line: line["score"])
    assert best["score_measure"] == "centred cosine"  # about the training crops' mean, which best/ holds
    assert best["score"] == pytest.approx(
        sum((r["cls_centred_cosine"] + r["patch_centred_cosine"]) / 2 for r in best["grid"]) / 2)
    assert (stage1 / "best" / "teacher_mean.safetensors").is_file()
    assert isinstance(AutoModel.from_pretrained(stage1 / "best", trust_remote_code=True), torch.nn.Module)


def test_stage_two_starts_from_stage_one_with_phases_batches_and_microbatches(teacher_dir, image_dir, stage1,
                                                                                   tmp_path, monkeypatch):
    from training import teacher as teacher_module

    calls = []
    load = teacher_module.load_teacher

    def counted(name, dtype=torch.float32):
        model = load(name, dtype)
        model.register_forward_hook(lambda module, args, output: calls.append(len(args[0]) if args else 0))
        return model

    monkeypatch.setattr(teacher_module, "load_teacher", counted)
    init = VecaModel.from_pretrained(stage1 / "final")
    distill_veca.main([
        "--teacher", teacher_dir, "--data", image_dir, "--output-dir", str(tmp_path), "--init-from",
        str(stage1 / "final"), "--max-steps", "4", "--lr", "1e-30", "--min-lr", "0", "--log-with", "none",
        "--resolutions", "16:1,32:1;2=32:1,48:1", "--batch-sizes", "16:4,32:2,48:2", "--teacher-microbatch", "16:2",
    ])
    metrics = read_metrics(tmp_path)
    phases = [draw([16, 32], [1.0, 1.0], 1, 0), draw([16, 32], [1.0, 1.0], 1, 1),
              draw([32, 48], [1.0, 1.0], 1, 2), draw([32, 48], [1.0, 1.0], 1, 3)]
    assert [m["resolution"] for m in metrics] == phases
    assert [round(m["images_per_s"] * m["step_time_s"]) for m in metrics] == [{16: 4, 32: 2, 48: 2}[r] for r in phases]
    assert calls == [n for r in phases for n in ([2, 2] if r == 16 else [2])]  # 16 px: 4 images in two forwards
    final = VecaModel.from_pretrained(tmp_path / "final")
    for (name, ours), theirs in zip(final.state_dict().items(), init.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6), name  # lr 1e-30: the stage-1 weights, not a fresh init


def test_init_from_refuses_another_model_or_teacher(teacher_dir, image_dir, stage1, tmp_path):
    lookwhere = tmp_path / "lookwhere"
    lookwhere_from_teacher(AutoModel.from_pretrained(teacher_dir), selector_depth=1,
                           selector_image_size=16).save_pretrained(lookwhere)
    other_teacher = tmp_path / "teacher64"
    config = AutoModel.from_pretrained(teacher_dir).config
    config.hidden_size = 64
    type(AutoModel.from_pretrained(teacher_dir))(config).save_pretrained(other_teacher)
    for init, teacher, extra, message in [
        (lookwhere, teacher_dir, [], "holds a lookwhere model, not veca"),
        (stage1 / "final", str(other_teacher), [], "outputs 32 features and the teacher 64"),
        (stage1 / "final", teacher_dir, ["--config-overrides", '{"num_hidden_layers": 3}'], "num_hidden_layers 2 vs 3"),
    ]:
        args = ["--teacher", teacher, "--data", image_dir, "--output-dir", str(tmp_path / "run"), "--init-from",
                str(init), "--max-steps", "1", "--log-with", "none", *extra]
        with pytest.raises(ValueError, match=message):
            distill_veca.main(args)
        assert nothing_written(tmp_path / "run")


# ------------------------------------------------------------------------ clipping and the teacher's patch embedding


def test_max_grad_norm_0_does_not_clip(teacher_dir, image_dir, tmp_path):
    weights = {}
    for bound in ["0", "1e9", "1e-6"]:
        out = tmp_path / bound
        distill_veca.main(veca_args(teacher_dir, image_dir, out, "--max-steps", "1", "--max-grad-norm", bound,
                                    "--optimizer", "normuon"))
        weights[bound] = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(weights["0"][name], weights["1e9"][name]) for name in weights["0"])
    assert not all(torch.equal(weights["0"][name], weights["1e-6"][name]) for name in weights["0"])


def test_the_patch_embedding_starts_from_the_teachers_when_shapes_match(teacher_dir):
    teacher = AutoModel.from_pretrained(teacher_dir)
    student = VecaModel(tiny_veca_config(hidden_size=32, num_attention_heads=2))
    line = copy_patch_embedding(teacher, student.embeddings.patch_embeddings.projection)
    assert "copied" in line and "not" not in line
    source = teacher.embeddings.patch_embeddings.projection
    assert torch.equal(student.embeddings.patch_embeddings.projection.weight, source.weight)
    assert torch.equal(student.embeddings.patch_embeddings.projection.bias, source.bias)
    other = VecaModel(tiny_veca_config())  # width 64: another shape
    before = other.embeddings.patch_embeddings.projection.weight.detach().clone()
    assert "not copied" in copy_patch_embedding(teacher, other.embeddings.patch_embeddings.projection)
    assert torch.equal(other.embeddings.patch_embeddings.projection.weight, before)


def test_every_recipe_parses_with_its_script():
    for name, script in [("veca-pretrain", distill_veca), ("veca-multires", distill_veca),
                         ("lookwhere-dinov2", distill_lookwhere)]:
        extra = ["--init-from", "stage1"] if name == "veca-multires" else []
        args = script.parse_args(["--recipe", name, "--data", "d", "--output-dir", "o", *extra])
        recipe = load_recipe(name)
        assert all(getattr(args, key) == value for key, value in recipe.items() if key != "script" and value is not None)
    assert TINY_VECA  # (the tiny config the command-line tests use)


def test_our_own_orthogonalisation_moves_each_normuon_matrix_as_far_as_theirs():
    """Without replaying their bfloat16 results: the fixture README's looser check (Frobenius norm of each NorMuon
    matrix's change within 2.5%; step-2 loss and outputs within 2e-5 and 1e-3)."""
    report = recipe_parity.check_case(FIXTURE, replay_orthogonalization=False)
    assert report.print()
    assert len([row for row in report.rows if row[0].startswith("step-norm")]) == len(CASE["optimizer"]["normuon_names"])


def test_recipe_parity_refuses_a_folder_without_case_json_in_one_line(tmp_path, capsys):
    (tmp_path / "README.md").write_text("not a fixture")
    with pytest.raises(SystemExit) as done:
        recipe_parity.main(["lookwhere", str(tmp_path / "README.md")])
    assert done.value.code == 2
    assert "README.md is no fixture folder (it holds no case.json)" in capsys.readouterr().err


# ------------------------------------------------------------------------ a recipe file's values, checked as flags


FINETUNE = ["checkpoint", "--data", "d", "--output-dir", "o"]


@pytest.fixture
def recipe_folder(tmp_path, monkeypatch):
    """training/recipes moved to an empty folder of the test's: write(name, text) puts a recipe there."""
    from training import recipes

    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    return lambda name, text: (tmp_path / f"{name}.yaml").write_text(text)


@pytest.mark.parametrize("line, message", [
    ("epochs: -3", "sets epochs to -3: must be a whole number, 0 or more, got '-3' (--epochs's check)"),
    ("lr: .nan", "sets lr to nan: must be a finite number above 0"),
    ("batch_size: 1.5", "sets batch_size to 1.5: must be a whole number, 1 or more"),
    ("batch_size: true", "sets batch_size to True: give one value, as --batch-size VALUE takes"),
    ("evaluate: middle", "sets evaluate to 'middle': --evaluate takes one of best, final"),
    ("hflip: 'no'", "sets hflip to 'no': --hflip is a switch, give true or false"),
    ("seed: 99999999999999999999", "sets seed to 99999999999999999999: must be a whole number from 0 to 4294967295"),
    ("k_ratio: [0.1, 0.5]", "sets k_ratio to [0.1, 0.5]: give one value"),
])
def test_a_recipe_value_goes_through_the_checks_of_its_flag(recipe_folder, line, message):
    """argparse checks a default only when it is a string: a recipe's number or switch is checked here as its flag
    would be, so that a run never starts (and cards "epoch -3") on a value the command line refuses."""
    from training import finetune

    recipe_folder("mine", f"script: training.finetune\n{line}\n")
    with pytest.raises(ValueError) as error:
        finetune.parse_args([*FINETUNE, "--recipe", "mine"])
    assert str(error.value).startswith(f"training/recipes/mine.yaml {message}") and "\n" not in str(error.value)
    recipe_folder("fine", "script: training.finetune\nepochs: 3\nlr: 1.0e-5\nhflip: false\nk_ratio: 0.25\n")
    args = finetune.parse_args([*FINETUNE, "--recipe", "fine"])
    assert (args.epochs, args.lr, args.hflip, args.k_ratio) == (3, 1e-5, False, "0.25")  # as the flags give them


@pytest.mark.parametrize("text, found", [
    ("- epochs: 3\n", "it holds a list"), ("", "it holds nothing"), ("epochs: 3\n", "it holds no script"),
    ("script: [training.finetune]\n", "it holds no script"), ("3: 4\nscript: training.finetune\n", "3 is no argument"),
    ("script: !!python/object/apply:os.getcwd []\n", "not plain YAML"), ("script: [unclosed\n", "not plain YAML"),
])
def test_a_recipe_file_that_is_no_recipe_is_one_line(recipe_folder, text, found, capsys):
    from corevision_hf.cli import run
    from training import distill_veca, finetune

    recipe_folder("mine", text)
    for main, argv in ((finetune.main, FINETUNE), (distill_veca.main, ["--teacher", "t", "--data", "d", "--output-dir",
                                                                        "o", "--max-steps", "1"])):
        assert run(main, [*argv, "--recipe", "mine"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "is not a recipe" in err and found in err, err


def test_every_shipped_recipe_gives_the_values_its_flags_would():
    """The reviewed recipes pass their flags' checks and keep their values (a whole number given to a float flag,
    max_grad_norm 0, is 0.0 as --max-grad-norm 0 gives it)."""
    for name in ("finetune-final", "finetune-guarded", "veca-pretrain", "lookwhere-dinov2"):
        raw = load_recipe(name)
        script = {"training.finetune": None, "training.distill_veca": distill_veca,
                  "training.distill_lookwhere": distill_lookwhere}[raw["script"]]
        needed = (["checkpoint", "--data", "d", "--output-dir", "o", "--eval-data", "e"] if script is None else
                  ["--data", "d", "--output-dir", "o"])
        if script is None:
            from training import finetune

            args = finetune.parse_args([*needed, "--recipe", name])
        else:
            args = script.parse_args([*needed, "--recipe", name])
        assert {key: getattr(args, key) for key in raw if key != "script" and raw[key] is not None} == {
            key: value for key, value in raw.items() if key != "script" and value is not None}
