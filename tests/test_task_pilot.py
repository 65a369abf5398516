"""benchmarks.task_pilot: its smoke run, one setting's validation accuracy recomputed from a plain teacher forward,
and the choice by its rule."""

import json
import types

import pytest
import torch
from conftest import save_extra_photos, save_task_teacher
from transformers import Dinov2Model

from benchmarks import task_pilot
from evaluation.canvases import task_splits
from evaluation.probes import fit_linear_classifier


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pilot")
    save_task_teacher(folder / "teacher")
    task_pilot.main(["--smoke", "--teacher", str(folder / "teacher"), "--out-dir", str(folder / "out"),
                     "--cache-dir", str(folder / "cache"), "--threads", "1"])
    return folder, json.loads((folder / "out" / "task_pilot.json").read_text())


def test_every_setting_is_a_row_with_both_readers_of_both_teacher_lines(smoke):
    _, report = smoke
    assert [(r["strokes"], r["digit_size"]) for r in report["rows"]] == task_pilot.SMOKE["settings"]
    for row in report["rows"]:
        for line in ("dense", "equal_flops"):
            assert set(row[line]["val_accuracy"]) == {"linear", "attentive"}
            assert row[line]["best"] == max(max(s.values()) for s in row[line]["val_accuracy"].values())
        assert row["gap"] == pytest.approx(row["dense"]["best"] - row["equal_flops"]["best"])
    assert report["equal_flops_size"] < task_pilot.SMOKE["canvas_size"]
    assert report["choice"] == task_pilot.choose(report["rows"], 0.5, 0.15)


def test_the_dense_linear_row_is_the_probe_of_a_plain_teacher_forward(smoke):
    folder, report = smoke
    teacher = Dinov2Model.from_pretrained(str(folder / "teacher")).eval()
    strokes, size = task_pilot.SMOKE["settings"][0]
    canvases = types.SimpleNamespace(canvas_size=task_pilot.SMOKE["canvas_size"], seed=1, background="black",
                                     digit_size=size, strokes=strokes, train=task_pilot.SMOKE["train"], test=1)
    split = task_splits(canvases, "single")["train"]
    with torch.inference_mode():
        hidden = teacher(split.pixels(slice(None))).last_hidden_state
    features = torch.cat([hidden[:, 0], hidden[:, 1:].half().float().mean(1)], dim=-1)
    val = task_pilot.SMOKE["val"]
    scores = report["rows"][0]["dense"]["val_accuracy"]["linear"]
    for decay, score in scores.items():
        head = fit_linear_classifier(features[:-val], split.labels[:-val], 10, weight_decay=float(decay),
                                     per_feature=False)
        by_hand = float((head(features[-val:]).argmax(-1) == split.labels[-val:]).float().mean())
        assert score == pytest.approx(by_hand, abs=1e-6)


def test_the_choice_is_the_largest_gap_among_the_settings_that_qualify():
    def row(strokes, dense, equal):
        return {"strokes": strokes, "digit_size": 28, "dense": {"best": dense}, "equal_flops": {"best": equal},
                "gap": dense - equal}

    rows = [row(0, 0.9, 0.8), row(10, 0.6, 0.3), row(20, 0.45, 0.0), row(30, 0.7, 0.4)]
    assert task_pilot.choose(rows, 0.5, 0.15)["chosen"] == {"strokes": 10, "digit_size": 28}  # ties: the first
    assert task_pilot.choose(rows, 0.95, 0.15)["chosen"] is None


def test_half_a_grid_or_a_bad_setting_is_one_line(capsys):
    for bad in (["--strokes", "0"], ["--strokes", "-1", "--digit-sizes", "28"], ["--strokes", "0", "--digit-sizes",
                                                                                  "0"]):
        with pytest.raises(SystemExit) as done:
            task_pilot.parse_args(bad)
        assert done.value.code == 2 and capsys.readouterr().err.count("error:") == 1


def test_the_photo_pilot_reads_training_photos_alone_and_serves_photo_canvases_alone(tmp_path, capsys):
    """--background photo: its own file, the background and the training pool it drew from recorded (no test photo),
    and a benchmark of other canvases refuses it."""
    from benchmarks import sparse_recognition

    save_task_teacher(tmp_path / "teacher")
    save_extra_photos(tmp_path / "extra")
    report = task_pilot.main(["--smoke", "--background", "photo", "--extra-photos", str(tmp_path / "extra"),
                              "--teacher", str(tmp_path / "teacher"), "--out-dir", str(tmp_path / "out"),
                              "--cache-dir", str(tmp_path / "cache"), "--threads", "1"])
    assert json.loads((tmp_path / "out" / "task_pilot_photos.json").read_text())["rows"] == report["rows"]
    assert report["background"] == "photo" and set(report["photos"]) == {"train"}
    assert {"extra-0.jpg", "extra-2.jpg"} <= set(report["photos"]["train"]["names"])
    pilot = tmp_path / "out" / "task_pilot_photos.json"
    report["choice"]["chosen"] = {"digit_size": 14, "strokes": 0}
    pilot.write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        sparse_recognition.parse_args(["--smoke", "--pilot", str(pilot)])
    assert "calibrated canvases on photo, not --background black" in capsys.readouterr().err
    args = sparse_recognition.parse_args(["--smoke", "--pilot", str(pilot), "--background", "photo",
                                          "--extra-photos", str(tmp_path / "extra")])
    assert args.pilot_record["background"] == "photo"
