"""benchmarks/adaptive_budget.py on a tiny teacher and the LookWhere built from it, on a few photos: the plumbing (cost
matching on the calibration photos, paired intervals, the centre and where it came from, the plot), not the numbers."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from transformers import Dinov2Config, Dinov2Model

from benchmarks import adaptive_budget as ab
from corevision_hf import lookwhere_from_teacher, lookwhere_flops


ROOT = ab.ROOT


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adaptive")
    torch.manual_seed(0)
    teacher = Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                       intermediate_size=64, patch_size=14, image_size=56)).eval()
    teacher.save_pretrained(root / "teacher")
    student = lookwhere_from_teacher(teacher, selector_image_size=28, selector_depth=1)
    with torch.no_grad():  # a peaked map, so that counts differ over photos
        student.selector.map_head[-1].weight.mul_(30)
    student.save_pretrained(root / "model")
    photos = sorted((ROOT / "assets" / "photos").glob("*.jpg"))
    for name, chosen in (("heldout", photos[:4]), ("calibration", photos[4:7])):
        (root / name).mkdir()
        for photo in chosen:  # stand-ins: the test only checks the plumbing
            shutil.copy(photo, root / name)
    return {name: root / name for name in ("teacher", "model", "heldout", "calibration")}


def run(folders, tmp_path, *extra: str) -> dict:
    out, plot = tmp_path / "adaptive.json", tmp_path / "adaptive.png"
    report = ab.benchmark(["--model", str(folders["model"]), "--teacher", str(folders["teacher"]), "--resolution", "56",
                           "--k-ratios", "0.25", "0.5", "--heldout-photos", str(folders["heldout"]),
                           "--calibration-photos", str(folders["calibration"]),
                           "--centre-photos", str(folders["calibration"]), "--out", str(out), "--plot", str(plot),
                           *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report)) and plot.stat().st_size > 10_000
    return report


def test_each_cost_point_matches_the_fixed_cost_on_the_calibration_photos_and_compares_pairs(folders, tmp_path):
    report = run(folders, tmp_path)
    assert report["patches"] == 16 and len(report["heldout_photos"]) == 4
    assert report["centre"].startswith("no teacher_mean.safetensors in the model folder: the teacher's mean tokens "
                                       "over the 3 training photos")
    for point, ratio in zip(report["points"], (0.25, 0.5)):
        assert point["k_fixed"] == 16 * ratio
        assert point["gflops_fixed"] == lookwhere_flops(ab.LookWhereModel.config_class.from_pretrained(
            folders["model"]), 56, 56, k_ratio=ratio) / 1e9
        assert point["gflops_adaptive_calibration"]["mean"] <= point["gflops_fixed"]
        assert 0 < point["k_mass"] <= 1 and len(point["k_adaptive_heldout"]) == 4
        for name, measure in point["measures"].items():
            difference = measure["adaptive_minus_fixed"]
            per_photo = measure["per_photo"]
            assert difference["mean"] == pytest.approx(
                sum(per_photo["adaptive"]) / 4 - sum(per_photo["fixed"]) / 4, abs=1e-12)
            assert difference["df"] == 3 and measure["verdict"] in ("wins", "ties", "loses")
            assert measure["verdict"] == ("wins" if difference["low"] > 0 else "loses" if difference["high"] < 0
                                          else "ties")


def test_the_centre_comes_from_the_model_folder_when_it_holds_the_teachers_mean(folders, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(folders["model"], model)
    save_file({"cls": torch.zeros(32), "patch": torch.zeros(32)}, str(model / "teacher_mean.safetensors"))
    report = run({**folders, "model": model}, tmp_path)
    assert report["centre"].startswith("teacher_mean.safetensors in the model folder")
    for point in report["points"]:  # a centre at 0 makes the centred cosines the raw ones
        for kind in ("cls", "patch"):
            for way in ("fixed", "adaptive"):
                assert point["measures"][f"{kind}_centred_cosine"]["per_photo"][way] == pytest.approx(
                    point["measures"][f"{kind}_cosine"]["per_photo"][way], abs=1e-6)


def test_calibrating_on_the_held_out_photos_is_refused(folders, tmp_path):
    with pytest.raises(ValueError, match="--calibration-photos share photos with --heldout-photos"):
        run({**folders, "calibration": folders["heldout"]}, tmp_path)


def test_the_table_of_the_docs_page_has_one_row_per_cost_point(folders, tmp_path):
    report = run(folders, tmp_path)
    header, rule, *rows = ab.table(report).splitlines()
    assert header.count("|") == rule.count("|") == 10 and len(rows) == 2
    first = report["points"][0]
    assert rows[0].startswith(f"| 0.25 (4) | {first['gflops_fixed']:.3g} | {first['k_mass']:.3g} | ")
    assert rows[0].endswith(f" {first['measures']['patch_r2']['verdict']} |")


def test_a_missing_model_is_one_line_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        ab.main(["--model", str(tmp_path / "nowhere"), "--teacher", str(tmp_path / "no-teacher")])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("no saved model there (no config.json); `make quality` writes the default one, or give a "
                          "LookWhere save_pretrained folder.")
