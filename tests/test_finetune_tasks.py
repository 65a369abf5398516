"""benchmarks/finetune_tasks.py: the photo split, the three tasks' labels, the rule's verdict, and a smoke run whose every
difference can be paired again from the JSON. Generated photos named as examples/gcompris_photos.py names them."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_model_folders
from PIL import Image

from benchmarks import finetune_tasks as ft
from training.compare_finetuned import paired_difference

ROOT = Path(__file__).resolve().parents[1]
COUNTS = {"erase": 2, "explore_farm_animals": 1, "explore_monuments": 3, "explore_world_music": 3, "clickgame": 3}


def write_photos(folder: Path, counts: dict = COUNTS) -> Path:
    """Photos named {activity}-{name}.png, each a shade of its activity with a bright top (a way up)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for shade, (activity, count) in enumerate(counts.items()):
        for index in range(count):
            pixels = rng.integers(0, 60, size=(48, 64, 3)) + 40 * shade
            pixels[:12] = 255
            Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{activity}-photo{index}.png")
    (folder / "SOURCES.md").write_text("not a photo")
    return folder


def test_the_split_keeps_each_photo_on_one_side_by_category(tmp_path):
    photos = write_photos(tmp_path / "photos", {**COUNTS, "explore_monuments": 10})
    split = ft.photo_split(str(photos), seed=0)
    names = {side: [path.name for path, _ in members] for side, members in split.items()}
    assert sum(map(len, names.values())) == 19 and len({name for side in names.values() for name in side}) == 19
    monuments = {side: [name for name in members if name.startswith("explore_monuments")]
                 for side, members in names.items()}
    assert [len(monuments[side]) for side in ("heldout", "val", "train")] == [3, 2, 5]  # 30 %, 20 %, the rest
    assert {category for _, category in split["train"]} == set(ft.CATEGORIES)
    assert ft.photo_split(str(photos), seed=0) == split and ft.photo_split(str(photos), seed=1) != split
    with pytest.raises(ValueError, match="run python examples/gcompris_photos.py first"):
        ft.photo_split(str(tmp_path / "none"), seed=0)


def test_each_task_labels_what_it_says(tmp_path):
    split = ft.photo_split(str(write_photos(tmp_path / "photos")), seed=0)
    for task in ft.TASKS:
        ft.write_task(task, split, tmp_path / task, smoke=True)
    heldout = tmp_path / "orientation" / "heldout"
    for path in (heldout / "upright").iterdir():
        upright = np.asarray(Image.open(path))
        assert np.array_equal(np.asarray(Image.open(heldout / "upside_down" / path.name)), upright[::-1, ::-1])
        assert upright[:20].mean() > upright[-20:].mean()  # the bright top of the photo is up
    colour = tmp_path / "colour" / "val"
    for path in (colour / "neutral").iterdir():
        neutral = np.asarray(Image.open(path)).astype(float)
        warm = np.asarray(Image.open(colour / "warm" / path.name)).astype(float)
        assert np.allclose(warm, np.clip(np.round(neutral * [1.15, 1.0, 0.85]), 0, 255), atol=1)
    semantic = tmp_path / "semantic" / "train"
    assert sorted(path.name for path in semantic.iterdir()) == sorted(ft.CATEGORIES)
    assert all(path.stem.rsplit("_", 1)[0].split("-")[0] in ft.CATEGORIES[folder.name]
               for folder in semantic.iterdir() for path in folder.iterdir())


def test_the_rule_is_met_by_every_mean_and_every_interval():
    def line(mean, low, high):
        return {"task": "t", "image_size": 1, "difference": {"mean": mean, "low": low, "high": high}}

    assert ft.verdict([line(0.0, 0.0, 0.0), line(0.05, 0.01, 0.1), line(-0.02, -0.1, 0.05)])["met"]
    assert ft.verdict([line(0.05, 0.01, 0.1)])["gains_kept"] == ["t 1"]
    assert not ft.verdict([line(-0.021, -0.1, 0.05)])["met"]  # a mean below -0.02
    assert ft.verdict([line(-0.01, -0.03, -0.001)])["failing"] == ["t 1"]  # an interval below 0


def test_results_go_under_outputs_unless_told(tmp_path):
    assert ft.parse_args([]).output == ROOT / "outputs" / "finetune_tasks" / "finetune_tasks.json"
    assert ft.parse_args(["--smoke"]).output == ROOT / "outputs" / "finetune_tasks_smoke" / "finetune_tasks.json"
    assert ft.parse_args(["--output", str(tmp_path / "x.json")]).output == tmp_path / "x.json"
    assert ft.parse_args([]).sizes == [112, 224] and ft.parse_args(["--smoke"]).sizes == [32, 48]


@pytest.mark.slow
def test_smoke_run_writes_every_line_and_its_outcomes(tmp_path, capsys):
    models = save_tiny_model_folders(tmp_path)
    argv = ["--smoke", "--photos", str(write_photos(tmp_path / "photos")), "--model", models["lookwhere"],
            "--work-dir", str(tmp_path / "work"), "--threads", "1"]
    result = ft.main(argv)
    written = json.loads((tmp_path / "work" / "finetune_tasks.json").read_text())
    assert [(line["task"], line["image_size"]) for line in written["entries"]] == [
        (task, size) for task in ft.TASKS for size in (32, 48)]
    assert written["setup"]["command"].startswith("python -m benchmarks.finetune_tasks --smoke")
    for line in written["entries"]:
        assert {"task", "image_size", "probe", "recipe", "difference"} <= set(line)
        assert set(line["difference"]) >= {"mean", "low", "high"}
        outcomes = line["outcomes"]
        assert len(outcomes["probe"]) == len(outcomes["recipe"]) == len(line["heldout_files"]) == len(line["photos"])
        assert line["recipe"] == outcomes["recipe"].count("1") / len(outcomes["recipe"])
        assert paired_difference(outcomes["recipe"], outcomes["probe"], line["photos"], 2000, 0) == line["difference"]
        assert paired_difference(outcomes["final"], outcomes["probe"], line["photos"], 2000, 0) == line[
            "final_minus_probe"]
        assert line["kept"] == line["choice"]["kept"] and "--recipe finetune-guarded" in line["commands"]["recipe"]
        assert "--epochs 0" in line["commands"]["probe"] and "--epochs 0" not in line["commands"]["recipe"]
    assert result["met"] == written["met"] and "rule" in written
    assert any(line["outcomes"]["final"] != line["outcomes"]["probe"] for line in written["entries"])  # it trained
    capsys.readouterr()
    ft.main(argv)  # again: every finished run is reused
    assert capsys.readouterr().out.count("reusing the finished run in") == 12
