"""The labelled probe set ships whole and licensed; benchmarks/linear_probe.py probes raw pixels, the teacher, a dense
student and every budget of a student beside its untrained architecture (tiny random models here, on a few of the
shipped images)."""

import importlib.util
import json
import math
import shutil
from pathlib import Path

import torch
from conftest import tiny_veca_config
from transformers import Dinov2Config, Dinov2Model

from corevision_hf import VecaModel

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "assets" / "probe" / "fashion_mnist"


def test_the_probe_set_is_balanced_and_licensed():
    classes = sorted(p.name for p in (PROBE / "train").iterdir())
    assert len(classes) == 10 and classes == sorted(p.name for p in (PROBE / "val").iterdir())
    for name in classes:
        assert len(list((PROBE / "train" / name).glob("*.png"))) == 30
        assert len(list((PROBE / "val" / name).glob("*.png"))) == 20
    train = {p.name for p in (PROBE / "train").rglob("*.png")}
    assert not train & {p.name for p in (PROBE / "val").rglob("*.png")}  # no image in both splits
    assert "MIT" in (PROBE / "LICENSE.md").read_text()


def test_the_probe_reports_teacher_dense_and_every_budget(tmp_path):
    data = tmp_path / "data"
    for split, count in (("train", 4), ("val", 3)):
        for name in ("bag", "trouser"):
            (data / split / name).mkdir(parents=True)
            for path in sorted((PROBE / split / name).glob("*.png"))[:count]:
                shutil.copy(path, data / split / name)
    torch.manual_seed(0)
    dense = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=8,
                         image_size=32)
    Dinov2Model(dense).save_pretrained(tmp_path / "teacher")
    Dinov2Model(dense).save_pretrained(tmp_path / "dense")
    VecaModel(tiny_veca_config(training_budgets=[2, 8], training_budget_weights=[1, 1])).save_pretrained(tmp_path / "veca")

    spec = importlib.util.spec_from_file_location("linear_probe", ROOT / "benchmarks" / "linear_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(["--model", str(tmp_path / "veca"), "--dense", str(tmp_path / "dense"), "--teacher",
                          str(tmp_path / "teacher"), "--data", str(data), "--resolution", "32", "--output",
                          str(tmp_path / "probe.json")])

    assert json.loads((tmp_path / "probe.json").read_text()) == report
    assert [row["name"] for row in report["rows"]] == [
        "raw pixels", f"teacher ({tmp_path / 'teacher'})", "dense student", "veca, num_cores=2",
        "veca untrained, num_cores=2", "veca, num_cores=8", "veca untrained, num_cores=8"]
    for row in report["rows"]:
        p = row["accuracy"]
        assert row["val_images"] == 6 and p in {i / 6 for i in range(7)}
        assert math.isclose(row["standard_error"], math.sqrt(p * (1 - p) / 6))
