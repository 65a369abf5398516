"""`python -m corevision_hf.compare MODEL TEACHER --data FOLDER`: every budget against the dense teacher, values
checked against direct calls and hand counts."""

import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import save_tiny_checkpoints
from PIL import Image
from transformers import Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereModel, VecaModel, dense_vit_flops, veca_flops
from corevision_hf.compare import cli, main
from corevision_hf.images import to_pixel_values


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("compare")
    save_tiny_checkpoints(root)  # veca and lookwhere, 32 wide with patch 8 as the teachers below
    # patch 16: the teacher sees the image at twice the size, so that its grid is the model's
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=16,
                             image_size=64)).save_pretrained(root / "dinov2")
    Dinov2WithRegistersModel(Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                       mlp_ratio=2, patch_size=8, image_size=32)
                             ).save_pretrained(root / "dinov2-registers")
    Dinov2Model(Dinov2Config(hidden_size=48, num_hidden_layers=1, num_attention_heads=2, patch_size=8,
                             image_size=32)).save_pretrained(root / "too-wide")
    photos = root / "photos"
    photos.mkdir()
    for index, size in enumerate([(40, 30), (30, 40), (32, 32)]):
        Image.effect_noise(size, 60 + 20 * index).convert("RGB").save(photos / f"{index}.png")
    names = ("veca", "dinov2", "lookwhere", "dinov2-registers", "too-wide", "photos")
    return {name: str(root / name) for name in names}


def test_veca_every_trained_budget_against_direct_calls(folders, tmp_path, capsys):
    report = main([folders["veca"], folders["dinov2"], "--data", folders["photos"], "--runs", "1",
                   "--output", str(tmp_path / "compare.png")])
    model = VecaModel.from_pretrained(folders["veca"]).eval()
    teacher = Dinov2Model.from_pretrained(folders["dinov2"]).eval()
    assert report["budgets"] == sorted(model.config.training_budgets, reverse=True) == [8, 7, 6, 5, 4, 3, 2, 1]
    images = torch.stack([to_pixel_values(Image.open(f"{folders['photos']}/{i}.png"), 32) for i in range(3)])
    with torch.inference_mode():
        target = teacher(F.interpolate(images, size=(64, 64), mode="bicubic", antialias=True)).last_hidden_state
        for entry in report["results"]:
            out = model(images, num_cores=entry["budget"])
            cls = F.cosine_similarity(out.pooler_output, target[:, 0], dim=-1)
            patches = F.cosine_similarity(out.last_hidden_state[:, -16:], target[:, -16:], dim=-1).mean(-1)
            assert entry["quality"]["cls_cosine"] == pytest.approx(cls.mean().item(), abs=1e-5)
            assert entry["quality"]["patch_cosine"] == pytest.approx(patches.mean().item(), abs=1e-5)
            assert entry["quality"]["cls_cosine_std"] == pytest.approx(cls.std().item(), abs=1e-5)
            centre = target[:, -16:].mean((0, 1))  # the images' own mean patch token
            centred = F.cosine_similarity(out.last_hidden_state[:, -16:] - centre, target[:, -16:] - centre, dim=-1)
            assert entry["quality"]["patch_centred_cosine"] == pytest.approx(centred.mean().item(), abs=1e-5)
            assert entry["cost"]["32"]["gflops"] == veca_flops(model.config, 32, num_cores=entry["budget"]) / 1e9
    # the teacher: a dense ViT over 4 x 4 patches of 16 px and CLS, MLP 64 wide
    expected = dense_vit_flops(64, 64, hidden_size=32, num_hidden_layers=2, intermediate_size=64, patch_size=16,
                               num_prefix_tokens=1, gated_mlp=False)
    assert report["teacher_cost"]["32"]["gflops"] == expected / 1e9
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| num_cores | GFLOPs | ms, median (IQR) | CLS cosine | patch cosine | CLS centred | "
                        "patch centred | CLS R² | patch R² |")
    assert report["agreement_centre"] == "evaluation images" and "compare has no training crops" in lines[2 + 8 + 2]
    assert lines[2 + 8].startswith("| teacher |") and lines[-1].startswith("wrote")
    # a tiny model's sub-millisecond latencies are noise: any warning names what, and says not to trust them
    assert all("not to be trusted" in line for line in lines[2 + 8 + 3 : -1] if line)  # after the centred note
    assert len(report["latency_warnings"]) == sum("latency warning" in line for line in lines)
    assert Image.open(tmp_path / "compare.png").format == "PNG"


def test_lookwhere_default_k_ratios(folders, tmp_path):
    report = main([folders["lookwhere"], folders["dinov2-registers"], "--data", folders["photos"], "--runs", "1",
                   "--budgets", "0.25", "1", "--output", str(tmp_path / "compare.png")])
    assert report["budget_name"] == "k_ratio" and report["budgets"] == [1.0, 0.25]
    model = LookWhereModel.from_pretrained(folders["lookwhere"]).eval()
    teacher = Dinov2WithRegistersModel.from_pretrained(folders["dinov2-registers"]).eval()
    images = torch.stack([to_pixel_values(Image.open(f"{folders['photos']}/{i}.png"), 32) for i in range(3)])
    with torch.inference_mode():
        cls = F.cosine_similarity(model(images, k_ratio=0.25).pooler_output, teacher(images).last_hidden_state[:, 0])
    assert report["results"][1]["quality"]["cls_cosine"] == pytest.approx(cls.mean().item(), abs=1e-5)


@pytest.mark.parametrize("model, teacher, extra, message", [
    ("veca", "too-wide", [], "is not a ViT of the model's width 32"),
    ("veca", "dinov2", ["--budgets", "9"], r"--budgets \[9.0\]: VECA budgets are whole numbers of cores, 1..8"),
    ("lookwhere", "dinov2-registers", ["--budgets", "1.5"], r"LookWhere budgets are k_ratio fractions in \(0, 1\]"),
    ("veca", "dinov2", ["--resolution", "30"], "not a positive multiple of the patch size 8"),
    ("veca", "dinov2", ["--data", "{tmp}/none"], "no such folder"),
    ("veca", "dinov2", ["--output", "{tmp}/plot.txt"], r"give a \.png, \.pdf or \.svg"),
])
def test_bad_input_is_one_line_and_leaves_no_plot(folders, tmp_path, capsys, model, teacher, extra, message):
    extra = [a.format(tmp=tmp_path) for a in extra]
    data = [] if "--data" in extra else ["--data", folders["photos"]]
    output = [] if "--output" in extra else ["--output", str(tmp_path / "compare.png")]
    assert cli([folders[model], folders[teacher], *data, *output, "--runs", "1", *extra]) == 2
    error = capsys.readouterr().err
    assert re.search(message, error), error
    assert error.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_without_matplotlib_one_line(folders, tmp_path):
    script = ("import runpy, sys\nsys.modules['matplotlib'] = None\nsys.argv = ['compare', 'm', 't', '--data', '.', "
              "'--output', 'out.png']\nrunpy.run_module('corevision_hf.compare', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "pip install matplotlib" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
