"""evaluation.evaluate_budgets on tiny random models and tiny synthetic datasets (CPU, no network)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, make_offline_hub_cache, save_tiny_checkpoints, tiny_lookwhere_config
from PIL import Image
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereModel
from evaluation import evaluate_budgets
from training.teacher_mean import TeacherMean

pytestmark = pytest.mark.usefixtures("offline_evaluate")



def save_image(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A tiny teacher (width 32, patch 8) and VECA / LookWhere checkpoints, plus agreement, probe and
    segmentation folders of small random images."""
    root = tmp_path_factory.mktemp("evaluation")
    torch.manual_seed(0)
    teacher = Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                                        patch_size=8, image_size=32, num_register_tokens=4)
    Dinov2WithRegistersModel(teacher).save_pretrained(root / "teacher")
    save_tiny_checkpoints(root)
    rng = np.random.default_rng(0)
    for i in range(3):
        save_image(root / "photos" / f"{i}.jpg", rng.integers(0, 255, (30 + 4 * i, 40, 3), dtype=np.uint8))
    for split, count in (("train", 3), ("val", 2)):
        for label, channel in (("cat", 0), ("dog", 2)):  # a red class and a blue class
            for i in range(count):
                pixels = rng.integers(0, 60, (36, 36, 3), dtype=np.uint8)
                pixels[..., channel] = 220
                save_image(root / "pets" / split / label / f"{i}.png", pixels)
        for i in range(2):
            save_image(root / "scenes" / split / "images" / f"{i}.jpg", rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
            mask = np.zeros((40, 48), dtype=np.uint8)
            mask[:, 24:] = 2  # classes 0 and 2; class 1 is absent everywhere
            mask[:4] = 255
            save_image(root / "scenes" / split / "masks" / f"{i}.png", mask)
    return {name: str(root / name) for name in ("teacher", "veca", "lookwhere", "photos", "pets", "scenes")}


def run(folders: dict, out: Path, checkpoint: str, *extra: str) -> dict:
    evaluate_budgets.main([folders[checkpoint], "--output-dir", str(out), "--latency-runs", "1", *extra])
    return json.loads((out / "evaluation.json").read_text())


def test_veca_over_three_budgets_with_every_quality_metric(folders, tmp_path):
    report = run(
        folders, tmp_path, "veca", "--budgets", "8", "2", "4", "--resolutions", "32", "48",
        "--teacher", folders["teacher"], "--agreement-data", folders["photos"], "--probe-data", folders["pets"],
        "--segmentation-data", folders["scenes"],
    )
    assert (tmp_path / "evaluation.png").stat().st_size > 0
    assert report["format"] == "corevision-evaluation/1" and report["model_type"] == "veca"
    assert report["budget_name"] == "num_cores" and report["budgets"] == [2, 4, 8]
    assert [entry["trained"] for entry in report["results"]] == [True, True, True]  # a bank of 8: budgets 1..8
    assert report["datasets"] == {"agreement": "photos", "probe": "pets", "segmentation": "scenes"}
    for resolution in ("32", "48"):
        flops = [entry["cost"][resolution]["gflops"] for entry in report["results"]]
        assert flops == sorted(flops) and len(set(flops)) == 3  # fewer cores, fewer FLOPs
        assert report["teacher_cost"][resolution]["gflops"] > 0
    # Hand count, 2 cores at 32 px: N = 16 patches, L = 18 tokens, d = 32, SwiGLU hidden h = 48, 2 layers.
    # per layer: projections 8 L d^2 = 147456, attention 4 d (C^2 + 2 N C) = 8704, MLP 6 L d h = 165888;
    # + coordinate heads (layers - 1) * 2 C d * 2 = 256 + patch embedding 2 N d (3 * 8 * 8) = 196608.
    assert report["results"][0]["cost"]["32"]["gflops"] * 1e9 == pytest.approx(2 * (147456 + 8704 + 165888) + 256 + 196608)
    for entry in report["results"]:
        cost = entry["cost"]["32"]
        assert cost["latency_ms"] > 0 and cost["throughput_images_per_s"] == pytest.approx(1e3 / cost["latency_ms"])
        quality = entry["quality"]
        assert -1 <= quality["cls_cosine"] <= 1 and -1 <= quality["patch_cosine"] <= 1
        assert 0 <= quality["probe_accuracy"] <= 1 and 0 <= quality["segmentation_miou"] <= 1


def test_lookwhere_budgets_as_k_ratio_and_as_k(folders, tmp_path):
    report = run(folders, tmp_path / "ratio", "lookwhere", "--budgets", "0.5", "0.25", "1.0", "--resolutions", "32",
                 "--teacher", folders["teacher"], "--agreement-data", folders["photos"],
                 "--segmentation-data", folders["scenes"])
    assert report["budget_name"] == "k_ratio" and report["budgets"] == [0.25, 0.5, 1.0]
    assert report["pictures"] == {"features": "features.png", "where": "where.png"}  # kept patches, for LookWhere
    assert all((tmp_path / "ratio" / name).stat().st_size > 10_000 for name in report["pictures"].values())
    flops = [entry["cost"]["32"]["gflops"] for entry in report["results"]]
    assert flops == sorted(flops) and len(set(flops)) == 3
    assert all(entry["quality"]["cls_cosine"] is not None for entry in report["results"])
    assert all(0 <= entry["quality"]["segmentation_miou"] <= 1 for entry in report["results"])  # on the filled grid
    report = run(folders, tmp_path / "k", "lookwhere", "--budgets", "4", "16", "--resolutions", "32")
    assert report["budget_name"] == "k" and report["teacher"] is None and report["teacher_cost"] is None


def test_lookwhere_k_mass_costs_over_the_images_in_the_json_and_the_card(folders, tmp_path):
    from corevision_hf import LookWhereModel, gflops_spread, mass_gflops, selector_maps

    report = run(folders, tmp_path, "lookwhere", "--budgets", "0.5", "--resolutions", "32", "--teacher",
                 folders["teacher"], "--agreement-data", folders["photos"], "--k-mass", "0.3", "1.0", "--card")
    model = LookWhereModel.from_pretrained(folders["lookwhere"]).eval()
    maps = selector_maps(model, [evaluate_budgets.load_image(f, 32)
                                 for f in evaluate_budgets.image_files(folders["photos"])])
    low, full = report["k_mass_costs"]
    assert (low["k_mass"], full["k_mass"], low["images"], low["resolution"]) == (0.3, 1.0, 3, 32)
    assert {k: low[k] for k in ("mean", "std", "min", "max")} == {
        k: v for k, v in gflops_spread(mass_gflops(model.config, maps, 0.3)).items() if k != "images"}
    grid = (32 // model.config.patch_size) ** 2
    assert full["num_kept_mean"] == grid and full["std"] == 0 and low["num_kept_mean"] < grid
    text = (tmp_path / "README.md").read_text()
    assert f"k_mass 0.3 at 32 px, {low['mean']:.3g} GFLOPs ({low['std']:.2g}; " in text
    with pytest.raises(ValueError, match="--k-mass costs vary over images: give the images"):
        run(folders, tmp_path / "no-images", "lookwhere", "--budgets", "0.5", "--k-mass", "0.3")


@pytest.mark.slow
def test_a_hub_id_is_evaluated_from_the_hub_cache(folders, tmp_path):
    env = {**os.environ, **make_offline_hub_cache(tmp_path, folders["veca"], "org/veca-tiny")}
    subprocess.run(
        [sys.executable, "-m", "evaluation.evaluate_budgets", "org/veca-tiny", "--budgets", "2", "8",
         "--resolutions", "32", "--latency-runs", "1", "--output-dir", str(tmp_path / "out")],
        check=True, env=env, cwd=ROOT, capture_output=True,
    )
    report = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert report["checkpoint"] == "org/veca-tiny" and report["budgets"] == [2, 8]


@pytest.mark.parametrize(
    "budgets, message",
    [(["9"], "Unknown budget"), (["0"], "Unknown budget"), (["2.5"], "Unknown budget"), (["two"], "must be numbers")],
)
def test_unknown_budget_fails_before_any_work(folders, tmp_path, monkeypatch, budgets, message):
    monkeypatch.setattr(evaluate_budgets.AutoModel, "from_pretrained", pytest.fail)  # no model is loaded
    with pytest.raises(ValueError, match=message):
        run(folders, tmp_path, "veca", "--budgets", *budgets)
    assert not tmp_path.joinpath("evaluation.json").exists()


def test_lookwhere_k_larger_than_the_grid_is_refused(folders, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate_budgets.AutoModel, "from_pretrained", pytest.fail)
    with pytest.raises(ValueError, match=r"Unknown budget.*\[17\].*1 to 16"):
        run(folders, tmp_path, "lookwhere", "--budgets", "17", "--resolutions", "32")


def test_checkpoint_folder_without_weights(folders, tmp_path):
    folder = tmp_path / "no_weights"
    folder.mkdir()
    (folder / "config.json").write_text(Path(folders["veca"], "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        evaluate_budgets.main([str(folder), "--budgets", "4", "--output-dir", str(tmp_path / "out")])


def test_probe_folder_without_labels(folders, tmp_path, monkeypatch):
    unlabelled = tmp_path / "unlabelled"
    for split in ("train", "val"):
        save_image(unlabelled / split / "0.png", np.zeros((16, 16, 3), dtype=np.uint8))
    monkeypatch.setattr(evaluate_budgets.AutoModel, "from_pretrained", pytest.fail)
    with pytest.raises(ValueError, match="has no labels"):
        run(folders, tmp_path, "veca", "--budgets", "4", "--probe-data", str(unlabelled))


def test_other_bad_inputs_fail_before_any_work(folders, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate_budgets.AutoModel, "from_pretrained", pytest.fail)
    with pytest.raises(ValueError, match="--resolutions 30: not a positive multiple of the patch size 8; use e.g. 32"):
        run(folders, tmp_path, "veca", "--budgets", "4", "--resolutions", "30")
    with pytest.raises(ValueError, match="needs --teacher"):
        run(folders, tmp_path, "veca", "--budgets", "4", "--agreement-data", folders["photos"])
    with pytest.raises(ValueError, match="masks"):
        run(folders, tmp_path, "veca", "--budgets", "4", "--segmentation-data", folders["pets"])
    (tmp_path / "evaluation.json").write_text("{}")
    with pytest.raises(FileExistsError, match="--force"):
        run(folders, tmp_path, "veca", "--budgets", "4")


def test_progress_and_the_spread_over_images(folders, tmp_path, capsys):
    report = run(folders, tmp_path / "three", "veca", "--budgets", "2", "8", "--resolutions", "32",
                 "--teacher", folders["teacher"], "--agreement-data", folders["photos"])
    printed = capsys.readouterr().out
    for line in ("loading the teacher", "cost: 3 forwards (budgets, sizes and the teacher) timed in turn",
                 "quality num_cores=8: cls_cosine", "wrote"):
        assert line in printed
    for entry in [*report["results"], report["teacher_cost"]]:  # every latency with its spread over the runs
        cost = entry.get("cost", entry)["32"]
        assert cost["latency_runs"] == 1 and cost["latency_iqr_ms"] == 0
    assert report["pictures"] == {"features": "features.png", "where": "where.png"}
    assert report["agreement_images"] == 3
    assert report["agreement_centre"] == "evaluation images"  # the checkpoint holds no teacher_mean.safetensors
    assert "holds no teacher_mean.safetensors" in printed
    for entry in report["results"]:  # three photos: a spread and the standard error of the mean; one photo: none
        quality = entry["quality"]
        assert quality["cls_cosine_std"] > 0 and quality["patch_cosine_std"] > 0
        assert quality["cls_cosine_se"] == pytest.approx(quality["cls_cosine_std"] / 3**0.5)
        assert quality["patch_cosine_se"] == pytest.approx(quality["patch_cosine_std"] / 3**0.5)
        assert -1 <= quality["patch_centred_cosine"] <= 1 and quality["cls_r2"] <= 1 and quality["patch_r2"] <= 1
    single = tmp_path / "one_photo"
    single.mkdir()
    (single / "0.jpg").write_bytes(Path(folders["photos"], "0.jpg").read_bytes())
    report = run(folders, tmp_path / "one", "veca", "--budgets", "2", "--resolutions", "32",
                 "--teacher", folders["teacher"], "--agreement-data", str(single))
    assert report["results"][0]["quality"]["cls_cosine_std"] is None
    assert report["results"][0]["quality"]["cls_cosine_se"] is None


def test_lookwhere_budget_is_trained_when_its_k_lies_in_the_recipes_range():
    model = LookWhereModel(tiny_lookwhere_config(patch_size=8, selector_image_size=16))  # 16 patches at 32 px, 64 at 64
    recipe = {"args": {"k_min": 4, "k_max": 8}}
    assert evaluate_budgets.trained(model, "k", 4, recipe, 32) is True
    assert evaluate_budgets.trained(model, "k", 9, recipe, 32) is False
    # k_ratio counts as the model does, max(1, int(k_ratio * patches)): 0.55 * 16 = 8.8 keeps 8 (rounding would say 9)
    assert evaluate_budgets.trained(model, "k_ratio", 0.55, recipe, 32) is True
    assert evaluate_budgets.trained(model, "k_ratio", 0.2, recipe, 32) is False  # 3 patches
    assert evaluate_budgets.trained(model, "k_ratio", 0.1, recipe, 64) is True  # 6 of 64 patches at 64 px
    assert evaluate_budgets.trained(model, "k_ratio", 0.1, recipe, 32) is False  # 1 of 16 at 32 px
    for unknown in (None, {"args": {"lr": 0.001}}):  # no recipe, or one without a k range
        assert evaluate_budgets.trained(model, "k", 4, unknown, 32) is None
    # a model not distilled (benchmarks.sparse_recognition's teacher copy) drew no k, whatever its arguments say
    assert evaluate_budgets.trained(model, "k", 4, {**recipe, "steps": 0}, 32) is None
    assert evaluate_budgets.trained(model, "k", 4, {**recipe, "steps": 5}, 32) is True


@pytest.mark.parametrize("extra, message", [
    (["--budgets", "9"], "Unknown budget(s) [9]"),
    (["--budgets", "4", "--resolutions", "30"],
     "--resolutions 30: not a positive multiple of the patch size 8; use e.g. 32."),
    (["--budgets", "4", "--agreement-data", "/nonexistent"], "Image folder /nonexistent does not exist"),
    (["--budgets", "4", "--optimize-for-cpu", "--dtype", "bfloat16"],
     "--optimize-for-cpu speeds up float32 on the CPU only, not --device cpu --dtype bfloat16"),
])
def test_the_command_line_ends_bad_input_in_one_line(folders, tmp_path, capsys, extra, message):
    assert evaluate_budgets.cli([folders["veca"], "--output-dir", str(tmp_path / "out"), *extra]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and message in error


@pytest.mark.slow
def test_mixed_budgets_and_an_existing_output_from_a_shell(folders, tmp_path):
    script = [sys.executable, "-m", "evaluation.evaluate_budgets"]
    mixed = subprocess.run([*script, folders["lookwhere"], "--budgets", "4", "0.5", "--output-dir", str(tmp_path)],
                           capture_output=True, text=True, cwd=ROOT)
    assert mixed.returncode == 2 and mixed.stderr.strip().splitlines() == [
        "error: Mixed budgets ['4', '0.5']: give all k as integers or all k_ratio as decimals."]
    (tmp_path / "evaluation.json").write_text("{}")
    existing = subprocess.run([*script, folders["veca"], "--budgets", "4", "--output-dir", str(tmp_path)],
                              capture_output=True, text=True, cwd=ROOT)
    assert existing.returncode == 2 and "--force" in existing.stderr and "Traceback" not in existing.stderr
    assert (tmp_path / "evaluation.json").read_text() == "{}"


def card_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows of a card's budget table, as lists of cells."""
    section = text.split("## Cost and quality per budget", 1)[1].split("\n## ", 1)[0]
    lines = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in section.splitlines() if line.startswith("|")]
    return lines[0], lines[2:]


def test_card_renders_the_budget_table_of_this_evaluation(folders, tmp_path):
    checkpoint = tmp_path / "lookwhere"
    shutil.copytree(folders["lookwhere"], checkpoint)
    teacher_mean = TeacherMean()  # as training exports it: the teacher's mean over its training crops
    teacher_mean.update(torch.full((1, 32), 0.5), torch.full((1, 4, 32), -0.25))
    teacher_mean.save(checkpoint)
    (checkpoint / "training_recipe.json").write_text(json.dumps({
        "script": "training.distill_lookwhere", "teacher": folders["teacher"], "data": str(tmp_path / "images"),
        "command": "python -m training.distill_lookwhere --k-min 2 --k-max 5", "args": {"k_min": 2, "k_max": 5},
    }))
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "users-file.txt").write_text("the user's")
    (out / ".tmp-README.md").symlink_to(tmp_path / "users-file.txt")  # the old temporary name: not followed
    report = run({"lookwhere": str(checkpoint)}, out, "lookwhere", "--budgets", "0.25", "0.5", "--resolutions", "32",
                 "48", "--teacher", folders["teacher"], "--agreement-data", folders["photos"], "--card",
                 "--repo-id", "org/lw-tiny")
    assert [entry["trained"] for entry in report["results"]] == [True, False]  # k = 4 and 8 of 16 at 32 px, in [2, 5]

    text = (out / "README.md").read_text()
    assert (tmp_path / "users-file.txt").read_text() == "the user's"
    assert sorted(p.name for p in out.glob(".*")) == [".corevision_hf.json", ".tmp-README.md"]  # no temporary left
    assert 'AutoModel.from_pretrained("org/lw-tiny", trust_remote_code=True)' in text
    header, rows = card_table(text)
    # no probe, segmentation data or memory on this CPU: those columns are left out
    assert header[:5] == ["k_ratio", "GFLOPs @ 32 px", "GFLOPs @ 48 px", "ms @ 32 px", "ms @ 48 px"]
    assert header[-6:] == ["CLS cosine", "patch cosine", "CLS centred cos.", "patch centred cos.", "CLS R²",
                           "patch R²"]
    assert "mIoU (%)" not in header
    assert report["agreement_centre"] == "training crops" and "mean token over its training crops" in text
    for row, entry, trained in zip(rows, report["results"], ["trained", "not trained"]):
        cost, quality = entry["cost"], entry["quality"]
        assert row[0] == f"{entry['budget']} ({trained})"
        assert row[3:5] == [f"{cost[size]['latency_ms']:.1f} ({cost[size]['latency_iqr_ms']:.1f})"  # median (IQR)
                            for size in ("32", "48")]
        assert row[-6:] == [*(f"{quality[name]:.3f} ± {quality[name + '_se']:.3f}" for name in (
            "cls_cosine", "patch_cosine", "cls_centred_cosine", "patch_centred_cosine")), f"{quality['cls_r2']:.3f}",
            f"{quality['patch_r2']:.3f} ± {quality['patch_r2_se']:.3f}"]
    teacher = report["teacher_cost"]
    for size in ("32", "48"):
        assert f"{teacher[size]['latency_ms']:.1f} ({teacher[size]['latency_iqr_ms']:.1f}) ms at {size} px" in text
    assert "](features.png)" in text and "](where.png)" in text and "](evaluation.png)" in text


def test_the_cpu_opt_in_times_both_models_with_packed_weights_and_keeps_quality(folders, tmp_path, monkeypatch):
    timed = []  # the linear layers' classes of each model timed: the checkpoint's and the teacher's

    def recording(forwards, device, runs):
        for forward in forwards.values():
            timed.append({type(m).__name__ for m in forward.func.modules() if isinstance(m, torch.nn.Linear)})
        return alternated_latency(forwards, device, runs)

    alternated_latency = evaluate_budgets.alternated_latency
    monkeypatch.setattr(evaluate_budgets, "alternated_latency", recording)
    common = ["--budgets", "2", "8", "--resolutions", "32", "--teacher", folders["teacher"],
              "--agreement-data", folders["photos"], "--card"]
    default = run(folders, tmp_path / "default", "veca", *common)
    assert timed == [{"Linear"}] * 3 and default["environment"]["optimize_for_cpu"] is False
    timed.clear()
    opt_in = run(folders, tmp_path / "opt-in", "veca", *common, "--optimize-for-cpu")
    assert timed == [{"PrepackedLinear"}] * 3 and opt_in["environment"]["optimize_for_cpu"] is True
    for plain, packed in zip(default["results"], opt_in["results"]):
        for metric in ("cls_cosine", "patch_cosine"):
            assert packed["quality"][metric] == pytest.approx(plain["quality"][metric], abs=1e-5)
    assert "optimize_for_cpu" in (tmp_path / "opt-in" / "README.md").read_text()
    assert "optimize_for_cpu" not in (tmp_path / "default" / "README.md").read_text()


def test_card_does_not_overwrite_a_readme_without_force(folders, tmp_path, capsys, monkeypatch):
    (tmp_path / "README.md").write_bytes(b"# my own card\n")
    monkeypatch.setattr(evaluate_budgets.AutoModel, "from_pretrained", pytest.fail)  # refused before any work
    assert evaluate_budgets.cli([folders["veca"], "--budgets", "2", "--resolutions", "32", "--card",
                                 "--output-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "README.md exists; pass --force" in error
    assert (tmp_path / "README.md").read_bytes() == b"# my own card\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["README.md"]
    with pytest.raises(ValueError, match="add --card"):
        run(folders, tmp_path / "other", "veca", "--budgets", "2", "--repo-id", "org/veca")
