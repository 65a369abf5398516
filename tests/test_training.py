"""The distillation scripts, end to end on a tiny random teacher and tiny images (CPU, no network)."""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModel, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

TRAINING = Path(__file__).resolve().parents[1] / "training"
sys.path.insert(0, str(TRAINING))

import distill_lookwhere  # noqa: E402
import distill_veca  # noqa: E402
from losses import lookwhere_loss, veca_loss  # noqa: E402
from teacher import teacher_attention_map, teacher_targets  # noqa: E402

from corevision_hf import LookWhereModel, VecaConfig, VecaModel  # noqa: E402


TINY_VECA = json.dumps(
    dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, patch_size=8, num_cores=8)
)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A tiny random DINOv2-with-registers teacher, patch 8, saved like a hub checkpoint."""
    torch.manual_seed(0)
    config = Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=8, image_size=32,
        num_register_tokens=4,
    )
    folder = tmp_path_factory.mktemp("teacher")
    Dinov2WithRegistersModel(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(8):
        (folder / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)).save(folder / f"class{i % 2}" / f"{i}.jpg")
    return str(folder)


def veca_args(teacher_dir, image_dir, output_dir, *extra) -> list[str]:
    return [
        "--teacher", teacher_dir, "--data", image_dir, "--output-dir", str(output_dir), "--config-overrides", TINY_VECA,
        "--image-size", "32", "--batch-size", "2", "--log-with", "none", "--seed", "3", *extra,
    ]


def read_metrics(output_dir) -> list[dict]:
    return [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]


def test_veca_script_runs_and_exports(teacher_dir, image_dir, tmp_path):
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3", "--checkpoint-every", "2"))
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["num_cores"] in range(1, 9) for m in metrics)
    model = AutoModel.from_pretrained(tmp_path / "final", trust_remote_code=True)
    assert model.config.output_projection_size is None and model.config.num_cores == 8
    assert (tmp_path / "final" / "modeling_veca.py").exists()
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["method"] == "veca" and recipe["steps"] == 3 and recipe["global_batch_size"] == 2
    assert recipe["command"].startswith("python training/distill_veca.py --teacher ") and "--max-steps 3" in recipe["command"]
    assert distill_veca.parse_args(shlex.split(recipe["command"])[2:]) == distill_veca.parse_args(
        veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3", "--checkpoint-every", "2"))


def test_lookwhere_script_runs_and_exports(teacher_dir, image_dir, tmp_path):
    distill_lookwhere.main([
        "--teacher", teacher_dir, "--data", image_dir, "--output-dir", str(tmp_path), "--image-size", "32",
        "--selector-depth", "1", "--selector-image-size", "16", "--k-min", "2", "--k-max", "8",
        "--batch-size", "2", "--max-steps", "2", "--log-with", "none",
    ])
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 2 and all(2 <= m["k"] <= 8 for m in metrics)
    assert {"cls_mse", "patch_mse", "map_kl"} <= set(metrics[0])
    assert isinstance(AutoModel.from_pretrained(tmp_path / "final"), LookWhereModel)


def test_losses_go_down_on_one_batch(teacher_dir):
    torch.manual_seed(0)
    teacher = AutoModel.from_pretrained(teacher_dir).eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    cls, patches = teacher_targets(teacher, pixel_values, (4, 4))
    teacher_map = teacher_attention_map(teacher, pixel_values, (4, 4))

    veca = VecaModel(VecaConfig(**json.loads(TINY_VECA)))
    lookwhere = LookWhereModel.from_teacher(teacher, selector_depth=1, selector_image_size=16)
    for model, loss_fn in [
        (veca, lambda out: veca_loss(out.pooler_output, out.last_hidden_state[:, 4:], cls, patches)[0]),
        (lookwhere, lambda out: lookwhere_loss(out.pooler_output, out.last_hidden_state[:, 5:], out.selector_map,
                                               cls, patches, teacher_map)[0]),
    ]:
        model.eval()  # no coordinate augmentation: the same batch gives the same loss landscape
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        kwargs = {"num_cores": 4} if model is veca else {"k": 6}
        losses = []
        for _ in range(30):
            loss = loss_fn(model(pixel_values, **kwargs))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert losses[-1] < 0.85 * losses[0], losses


def test_teacher_attention_map_matches_eager_attention(teacher_dir):
    teacher = AutoModel.from_pretrained(teacher_dir, attn_implementation="eager").eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    logits = {}
    attention = teacher.encoder.layer[-1].attention
    handle = attention.register_forward_hook(lambda m, a, out: logits.update(probs=out[1]))
    with torch.no_grad():
        teacher(pixel_values, output_attentions=True)
    handle.remove()
    # softmax over patch keys of the mean patch-query logits is not the mean of probabilities; compare logits
    # through log-probabilities instead: log p_ij - log p_ij' = l_ij - l_ij' within each query row.
    log_probs = logits["probs"].log()[:, :, 5:, 5:]  # patch queries, patch keys
    relative = (log_probs - log_probs[..., :1]).mean(dim=(1, 2))  # mean over heads and queries, relative to key 0
    ours = teacher_attention_map(teacher, pixel_values, (4, 4))
    torch.testing.assert_close(ours - ours[:, :1], relative, atol=1e-4, rtol=1e-4)


def test_teacher_cache_computes_each_crop_once(teacher_dir, image_dir, tmp_path, monkeypatch):
    calls = []
    original = distill_veca.teacher_targets

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(distill_veca, "teacher_targets", counting)
    # 8 images, batch 2: 4 steps an epoch; 16 steps = 4 epochs, crops repeat every 2
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "16", "--teacher-cache", "2",
                                "--checkpoint-every", "100"))
    assert len(calls) == 8
    assert len(list((tmp_path / "teacher_cache").glob("*.safetensors"))) == 16
    with pytest.raises(ValueError, match="other settings"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "1", "--teacher-cache", "3"))


def test_two_processes_agree_on_every_budget(teacher_dir, image_dir, tmp_path):
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(TRAINING / "configs" / "cpu_2proc.yaml"),
        str(TRAINING / "distill_veca.py"),
        *veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "4", "--checkpoint-every", "10"),
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env)
    try:
        assert process.wait(timeout=300) == 0
    finally:  # never leave a launcher or worker behind (torchrun starts workers in sessions of their own)
        for pid in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if pid.isdigit() and str(tmp_path).encode() in cmdline and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 4
    for m in metrics:
        assert m["budgets_all_processes"] == [m["num_cores"]] * 2
    assert len({m["num_cores"] for m in metrics}) > 1  # the budget does change from step to step


def test_resume_continues_to_the_same_weights(teacher_dir, image_dir, tmp_path):
    common = ["--max-steps", "6", "--checkpoint-every", "2"]
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--stop-at-step", "3"))
    assert not (tmp_path / "resumed" / "final").exists()
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "resumed", *common, "--resume"))
    assert [m["step"] for m in read_metrics(tmp_path / "resumed")] == [1, 2, 3, 3, 4, 5, 6]  # resumed at step 2
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=0, rtol=0, msg=name)


def test_nan_loss_stops_with_the_last_checkpoint_intact(teacher_dir, image_dir, tmp_path, monkeypatch):
    calls = []

    def loss_turning_nan(*args, **kwargs):
        calls.append(1)
        loss, terms = veca_loss(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 3 else loss), terms

    monkeypatch.setattr(distill_veca, "veca_loss", loss_turning_nan)
    with pytest.raises(FloatingPointError, match="last good checkpoint"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "5", "--checkpoint-every", "1"))
    last = max((tmp_path / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    assert json.loads((last / "step.json").read_text())["step"] == 2
    weights = load_file(last / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert len(read_metrics(tmp_path)) == 2


def test_bad_setup_fails_before_training(teacher_dir, image_dir, tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="missing"):
        distill_veca.main(veca_args(teacher_dir, str(tmp_path / "missing"), tmp_path / "out", "--max-steps", "1"))
    with pytest.raises(ValueError, match="multiple of the student's patch size"):
        distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "out2", "--max-steps", "1", "--image-size", "36"))
    with pytest.raises(ValueError, match="teacher"):
        distill_veca.main(veca_args(str(tmp_path / "no-teacher"), image_dir, tmp_path / "out3", "--max-steps", "1"))
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
