"""Training at scale, as far as a CPU shows it: precision (the accelerate config's, float32 targets, a bf16 teacher),
gradient checkpointing, and launches that accelerate cannot honour here refused in one line."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, kill_processes_naming, lookwhere_args, read_metrics, veca_args
from safetensors.torch import load_file
from transformers import AutoModel

from training import distill_lookwhere, distill_veca
from training import teacher as teacher_module
from training.teacher import run_teacher, teacher_targets_and_map


def test_a_bf16_lookwhere_run_keeps_its_map_target_in_float32(teacher_dir, image_dir, tmp_path):
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "3",
                                          "--mixed-precision", "bf16"))
    assert all(m["map_kl"] >= 0 for m in read_metrics(tmp_path))  # a KL between two distributions
    assert json.loads((tmp_path / "final" / "training_recipe.json").read_text())["mixed_precision"] == "bf16"
    teacher = AutoModel.from_pretrained(teacher_dir).eval()
    images = torch.randn(3, 3, 32, 32)
    plain = teacher_targets_and_map(teacher, images, (4, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the loop runs the loss
        under_autocast = run_teacher(lambda chunk: teacher_targets_and_map(teacher, chunk, (4, 4)), images, 2)
    for ours, reference in zip(under_autocast, plain):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize("flag, expected", [([], "bf16"), (["--mixed-precision", "no"], "no")])
def test_mixed_precision_is_the_accelerate_configs_unless_a_flag_says_otherwise(teacher_dir, image_dir, tmp_path,
                                                                                monkeypatch, flag, expected):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` sets from a config's value
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "1", *flag))
    recipe = json.loads((tmp_path / "final" / "training_recipe.json").read_text())
    assert recipe["mixed_precision"] == expected


def test_a_bf16_teacher_holds_bf16_weights_and_gives_float32_targets(teacher_dir, image_dir, tmp_path, monkeypatch):
    loaded = []
    load = teacher_module.load_teacher

    def recorded(name, dtype=torch.float32):
        loaded.append(load(name, dtype))
        return loaded[-1]

    monkeypatch.setattr(teacher_module, "load_teacher", recorded)
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path, "--max-steps", "2", "--teacher-dtype", "bf16"))
    assert {p.dtype for p in loaded[0].parameters()} == {torch.bfloat16}
    metrics = read_metrics(tmp_path)
    assert len(metrics) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)


@pytest.mark.parametrize("method", ["veca", "lookwhere"])
def test_gradient_checkpointing_trains_to_the_same_weights(teacher_dir, image_dir, tmp_path, method):
    script, make_args = {"veca": (distill_veca, veca_args), "lookwhere": (distill_lookwhere, lookwhere_args)}[method]
    for name, extra in [("plain", []), ("checkpointed", ["--gradient-checkpointing"])]:
        script.main(make_args(teacher_dir, image_dir, tmp_path / name, "--max-steps", "2", *extra))
    plain = load_file(tmp_path / "plain" / "final" / "model.safetensors")
    checkpointed = load_file(tmp_path / "checkpointed" / "final" / "model.safetensors")
    for name, tensor in plain.items():
        torch.testing.assert_close(checkpointed[name], tensor, atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("cpu", [True, False])
def test_an_fsdp_config_on_cpu_processes_is_refused(teacher_dir, image_dir, tmp_path, cpu):
    """accelerate runs an FSDP config on CPU processes as plain DDP (ACCELERATE_USE_CPU=1), or as one process per
    launched process (without it): either way one line, and nothing written."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "training/configs/fsdp.yaml",
               "--num_processes", "2", "-m", "training.distill_veca",
               *veca_args(teacher_dir, image_dir, tmp_path / "run", "--max-steps", "1")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"ACCELERATE_USE_CPU": "1"} if cpu else {})}
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        kill_processes_naming(tmp_path)
    assert result.returncode != 0
    assert "error: The accelerate config asks for FSDP, which accelerate does not do on cpu processes" in result.stderr
    assert not (tmp_path / "run").exists()
