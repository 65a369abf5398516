"""benchmarks.task_pilot: its smoke run, one setting's validation accuracy recomputed from a plain teacher forward."""

import json
import types

import pytest
import torch
from conftest import save_task_teacher
from transformers import Dinov2Model

from benchmarks import task_pilot
from benchmarks.sparse_recognition import task_splits
from evaluation.probes import fit_linear_classifier


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pilot")
    save_task_teacher(folder / "teacher", num_hidden_layers=2)
    task_pilot.main(["--smoke", "--teacher", str(folder / "teacher"), "--out-dir", str(folder / "out"),
                     "--threads", "1"])
    return folder, json.loads((folder / "out" / "task_pilot.json").read_text())


def test_every_setting_and_feature_is_a_row(smoke):
    _, report = smoke
    assert [(r["strokes"], r["digit_size"], r["features"]) for r in report["rows"]] == [
        (strokes, size, name) for strokes, size in task_pilot.SMOKE["settings"] for name in ("cls", "mean patch",
                                                                                              "both")]
    assert all(row["best"] == max(row["val_accuracy"].values()) for row in report["rows"])


def test_a_cls_row_is_the_probe_of_a_plain_teacher_forward(smoke):
    folder, report = smoke
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    strokes, size = task_pilot.SMOKE["settings"][0]
    canvases = types.SimpleNamespace(canvas_size=task_pilot.SMOKE["canvas_size"], seed=1, background="black",
                                     digit_size=size, strokes=strokes, train=task_pilot.SMOKE["train"], test=1)
    split = task_splits(canvases, "single")["train"]
    with torch.inference_mode():
        cls = teacher(split.pixels(slice(None))).last_hidden_state[:, 0].float()
    val = task_pilot.SMOKE["val"]
    row = next(r for r in report["rows"] if (r["strokes"], r["digit_size"], r["features"]) == (strokes, size, "cls"))
    for decay, score in row["val_accuracy"].items():
        head = fit_linear_classifier(cls[:-val], split.labels[:-val], 10, weight_decay=float(decay))
        by_hand = float((head(cls[-val:]).argmax(-1) == split.labels[-val:]).float().mean())
        assert score == pytest.approx(by_hand, abs=1e-6)


def test_half_a_grid_is_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        task_pilot.parse_args(["--strokes", "0"])
    assert done.value.code == 2 and "--digit-sizes" in capsys.readouterr().err
