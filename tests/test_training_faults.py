"""Faults during distillation: kill -9 at random moments and inside a save, a flipped byte in a checkpoint, input
folders without a single readable image. Each resume must end in the weights of an uninterrupted run."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, lookwhere_args, read_metrics, veca_args
from safetensors.torch import load_file

from training import distill_lookwhere, distill_veca


def assert_same_weights(folder_a: Path, folder_b: Path) -> None:
    a, b = load_file(folder_a / "model.safetensors"), load_file(folder_b / "model.safetensors")
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, atol=0, rtol=0, msg=name)


def test_a_flipped_byte_is_detected_and_the_previous_checkpoint_serves(teacher_dir, image_dir, tmp_path, capsys):
    common = ["--max-steps", "4", "--checkpoint-every", "2"]
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "damaged", *common))
    weights = tmp_path / "damaged" / "checkpoints" / "checkpoint_4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-16] ^= 0xFF  # a byte inside the last tensor
    weights.write_bytes(bytes(data))
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "damaged", *common, "--resume"))
    assert "checkpoint_4: sha256 differs from the manifest for model.safetensors" in capsys.readouterr().out
    # resumed at step 2: the lines of steps 3 and 4 from before the resume are superseded
    assert [m["step"] for m in read_metrics(tmp_path / "damaged")] == [1, 2, 3, 4]
    assert_same_weights(tmp_path / "straight" / "final", tmp_path / "damaged" / "final")


@pytest.mark.slow
def test_kill_inside_a_save_keeps_the_previous_checkpoint(teacher_dir, image_dir, tmp_path):
    common = ["--max-steps", "6", "--checkpoint-every", "2", "--keep-checkpoints", "1"]
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    run = tmp_path / "killed"
    result = subprocess.run([sys.executable, "-m", "tests.distill_hooks", "die-inside-a-save",
                             *veca_args(teacher_dir, image_dir, run, *common)], cwd=ROOT)
    assert result.returncode == -signal.SIGKILL
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_4.partial"]
    distill_veca.main(veca_args(teacher_dir, image_dir, run, *common, "--resume"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint_6"]
    assert_same_weights(tmp_path / "straight" / "final", run / "final")


def logged_steps(run: Path) -> int:
    """Complete lines in metrics.jsonl (a kill may leave a partial last line; the resume drops it)."""
    return (run / "metrics.jsonl").read_bytes().count(b"\n") if (run / "metrics.jsonl").exists() else 0


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume(teacher_dir, image_dir, tmp_path):
    """Two runs killed at random moments (during a step, a save or a rotation), each resumed by the next."""
    common = ["--max-steps", "12", "--checkpoint-every", "1", "--keep-checkpoints", "2"]
    distill_veca.main(veca_args(teacher_dir, image_dir, tmp_path / "straight", *common))
    run, rng = tmp_path / "killed", random.Random(os.getpid())
    for trial in range(2):
        resume = ["--resume"] * (run / "run.json").exists()
        process = subprocess.Popen([sys.executable, "-m", "training.distill_veca",
                                    *veca_args(teacher_dir, image_dir, run, *common, *resume)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = logged_steps(run) + rng.randint(2, 4)
        while process.poll() is None and logged_steps(run) < target:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        process.send_signal(signal.SIGKILL)
        process.wait()
    distill_veca.main(veca_args(teacher_dir, image_dir, run, *common, "--resume"))
    assert_same_weights(tmp_path / "straight" / "final", run / "final")
    assert [m["step"] for m in read_metrics(run)] == list(range(1, 13))  # every line readable, each step once


@pytest.mark.parametrize("script", [distill_veca, distill_lookwhere])
def test_a_folder_without_a_readable_image_stops_instead_of_spinning(teacher_dir, tmp_path, script):
    folder = tmp_path / "broken"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.jpg").write_bytes(bytes(range(256)) * 4)
    make_args = veca_args if script is distill_veca else lookwhere_args
    args = make_args(teacher_dir, str(folder), tmp_path / "out", "--max-steps", "3")
    with pytest.raises(ValueError, match="no readable image in a whole epoch"):
        script.main(args)
