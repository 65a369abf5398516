"""`python -m corevision_hf.extract`: features of a collection as a `datasets` dataset, equal to direct model calls."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import kill_processes_naming, save_tiny_checkpoints
from PIL import Image

from corevision_hf import LookWhereModel, VecaModel, extract
from corevision_hf.images import to_pixel_values


ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "assets" / "photos"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    return save_tiny_checkpoints(tmp_path_factory.mktemp("models"))


@pytest.fixture
def photos(tmp_path) -> Path:
    """The shipped photos in a nested folder, plus one file that is not an image."""
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    for photo in sorted(PHOTOS.glob("*.jpg")):
        (folder / "nested" / photo.name).write_bytes(photo.read_bytes())
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    return folder


def direct(model_dir: str, images: list[Image.Image], resolution: int, **budget):
    """The reference: one model call per image, outside the extraction code."""
    model = VecaModel.from_pretrained(model_dir) if "veca" in model_dir else LookWhereModel.from_pretrained(model_dir)
    model.eval()
    pooled, grids = [], []
    with torch.inference_mode():
        for image in images:
            out = model(to_pixel_values(image, resolution)[None], **budget)
            side = resolution // 8
            grids.append(out.last_hidden_state[0, -side * side :].reshape(side, side, -1))
            pooled.append(out.pooler_output[0])
    return torch.stack(pooled), torch.stack(grids)


def test_folder_features_equal_a_direct_model_call(models, photos, tmp_path):
    out = tmp_path / "features"
    extract.main([models["veca"], "--data", str(photos), "--num-cores", "4", "--resolution", "64", "--dense-stride",
                  "2", "--batch-size", "3", "--shard-size", "4", "--square", "--output", str(out)])
    loaded = datasets.load_from_disk(str(out)).with_format("torch")[:]  # every column, as tensors
    names = sorted(p.name for p in PHOTOS.glob("*.jpg"))
    assert loaded["id"] == [f"nested/{name}" for name in names]  # the unreadable file is skipped, order kept
    info = json.loads((out / "extraction.json").read_text())
    assert info["num_skipped"] == 1 and info["skipped"] == ["broken.jpg"] and info["num_extracted"] == len(names)
    assert not out.with_name("features.partial").exists()

    pooled, grids = direct(models["veca"], [Image.open(PHOTOS / n) for n in names], 64, num_cores=4)
    torch.testing.assert_close(loaded["pooled"], pooled, atol=1e-5, rtol=0)
    # stride 2: each stored vector is the mean of a 2 x 2 block of patches, counted here by hand
    blocks = grids.reshape(len(names), 4, 2, 4, 2, 32).mean((2, 4))
    assert loaded["dense"].shape == (len(names), 4, 4, 32)
    torch.testing.assert_close(loaded["dense"], blocks, atol=1e-5, rtol=0)


def test_saved_dataset_with_a_corrupt_row_and_lookwhere_budget(models, tmp_path):
    photos = sorted(PHOTOS.glob("*.jpg"))[:3]
    rows = {"image_id": ["a", "b", "c", "d"],
            "image": [{"bytes": p.read_bytes(), "path": None} for p in photos] + [{"bytes": b"\x89PNG broken", "path": None}]}
    source = tmp_path / "saved"
    datasets.Dataset.from_dict(rows, features=datasets.Features(
        {"image_id": datasets.Value("string"), "image": datasets.Image()})).save_to_disk(str(source))
    out = tmp_path / "features"
    result = extract.main([models["lookwhere"], "--data", str(source), "--k-ratio", "0.25", "--resolution", "32",
                           "--square", "--output", str(out)])
    assert "dense" not in result.column_names
    result = result[:]
    assert result["id"] == ["a", "b", "c"]
    pooled, _ = direct(models["lookwhere"], [Image.open(io.BytesIO(p.read_bytes())) for p in photos], 32, k_ratio=0.25)
    torch.testing.assert_close(torch.tensor(result["pooled"]), pooled, atol=1e-5, rtol=0)
    assert json.loads((out / "extraction.json").read_text())["skipped"] == ["d"]


def test_a_rerun_skips_finished_shards(models, photos, tmp_path, monkeypatch):
    out = tmp_path / "features"
    arguments = [models["veca"], "--data", str(photos), "--resolution", "32", "--shard-size", "2", "--output", str(out)]
    calls = []
    original = extract.run_shard

    def crash_after_two(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the job were killed
        calls.append(args[2])
        original(*args, **kwargs)

    monkeypatch.setattr(extract, "run_shard", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        extract.main(arguments)
    assert not out.exists()
    assert sorted(p.name for p in out.with_name("features.partial").iterdir()) == [
        "settings.json", "shard-00000", "shard-00001"]
    monkeypatch.setattr(extract, "run_shard", original)
    resumed_calls = []
    monkeypatch.setattr(extract, "run_shard", lambda *a, **k: (resumed_calls.append(a[2]), original(*a, **k)))
    resumed = extract.main(arguments)[:]
    num_files = len(list(photos.rglob("*.jpg")))
    assert [r.start for r in resumed_calls] == list(range(4, num_files, 2))  # shards 0 and 1 were not redone
    monkeypatch.setattr(extract, "run_shard", original)
    fresh = extract.main([*arguments[:-1], str(tmp_path / "fresh")])[:]
    assert resumed["id"] == fresh["id"]
    np.testing.assert_allclose(np.array(resumed["pooled"]), np.array(fresh["pooled"]), atol=1e-6)


@pytest.mark.slow
def test_two_processes_write_disjoint_shards_and_one_merged_result(models, photos, tmp_path):
    out = tmp_path / "features"
    arguments = [models["veca"], "--data", str(photos), "--resolution", "32", "--num-cores", "2", "--shard-size", "2",
                 "--dense-stride", "1", "--square"]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "training" / "configs" / "cpu_2proc.yaml"), "-m", "corevision_hf.extract", *arguments,
               "--output", str(out)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log = process.communicate(timeout=240)[0].decode()
        assert process.returncode == 0, log
    finally:
        kill_processes_naming(tmp_path)
    assert "process 1/2" in log
    merged = datasets.load_from_disk(str(out))[:]
    single = extract.main([*arguments, "--output", str(tmp_path / "single")])[:]
    assert merged["id"] == single["id"] and len(set(merged["id"])) == len(merged["id"])  # each image once, in order
    np.testing.assert_allclose(np.array(merged["pooled"]), np.array(single["pooled"]), atol=1e-5)
    np.testing.assert_allclose(np.array(merged["dense"]), np.array(single["dense"]), atol=1e-5)


@pytest.mark.parametrize("extra, message", [
    (["--k-ratio", "0.1"], "--k-ratio is a LookWhere budget"),
    (["--num-cores", "9"], "outside 1..8"),
    (["--resolution", "30"], "not a positive multiple of the patch size 8"),
    (["--resolution", "32", "--dense-stride", "3"], "use one of [1, 2, 4]"),
    (["--data", "/nonexistent/photos"], "neither an image folder nor a dataset"),
])
def test_bad_input_is_one_line_and_exit_2(models, photos, tmp_path, extra, message, capsys):
    code = extract.cli([models["veca"], "--data", str(photos), "--output", str(tmp_path / "out"), *extra])
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("error: ") and error.strip().count("\n") == 0 and message in error
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_command_line_prints_no_traceback(models, photos, tmp_path):
    command = [sys.executable, "-m", "corevision_hf.extract", models["lookwhere"], "--data", str(photos),
               "--num-cores", "4", "--output", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: --num-cores is a VECA budget; {models['lookwhere']} is a 'lookwhere' model."]


def test_an_existing_output_is_not_overwritten(models, photos, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert extract.cli([models["veca"], "--data", str(photos), "--output", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and (out / "mine.txt").read_text() == "keep"
