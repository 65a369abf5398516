"""Both converters on bad input: one clear line on stderr, exit status 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca


FIXTURES = Path(__file__).parent / "fixtures" / "parity"
VECA_CHECKPOINT = FIXTURES / "veca" / "tiny.pt"
LOOKWHERE_CHECKPOINT = FIXTURES / "lookwhere" / "lookwhere_dinov2.pt"
CONVERTERS = {"veca": convert_veca, "lookwhere": convert_lookwhere}


def run_cli(converter: str, capsys, *args) -> str:
    """Runs a converter's main() in-process; returns its stderr after asserting exit status 2."""
    assert CONVERTERS[converter].main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def bad_files(tmp_path) -> dict[str, Path]:
    text = tmp_path / "notes.pt"
    text.write_text("hello, this is not a checkpoint\n")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(VECA_CHECKPOINT.read_bytes()[:300_000])
    return {"text": text, "truncated": truncated}


@pytest.mark.parametrize("converter", sorted(CONVERTERS))
def test_unreadable_files(converter, tmp_path, capsys):
    for kind, path in bad_files(tmp_path).items():
        err = run_cli(converter, capsys, path, tmp_path / "out")
        assert "cannot be read as a PyTorch checkpoint: it is truncated, corrupted or not a .pt file" in err, kind
    assert not (tmp_path / "out").exists()


def test_each_converter_refuses_the_other_format(tmp_path, capsys):
    err = run_cli("veca", capsys, LOOKWHERE_CHECKPOINT, tmp_path / "out")
    assert "is not a VECA reference checkpoint: it holds no state dict of tensors" in err
    err = run_cli("lookwhere", capsys, VECA_CHECKPOINT, tmp_path / "out")
    assert "does not have the reference layout" in err
    assert not (tmp_path / "out").exists()


def test_veca_heads_are_never_guessed(tmp_path, capsys):
    """A bare state dict says nothing about heads: an error that names the option, then the option works."""
    bare = tmp_path / "bare.pt"
    student = torch.load(VECA_CHECKPOINT, weights_only=True)["student"]
    torch.save({f"student.{name}": value for name, value in student.items()}, bare)  # flat, with a prefix
    err = run_cli("veca", capsys, bare, tmp_path / "out")
    assert "pass --num-attention-heads" in err
    assert not (tmp_path / "out").exists()
    convert_veca.main([str(bare), str(tmp_path / "out"), "--num-attention-heads", "2"])
    printed = capsys.readouterr().out
    assert "rope_zero_fraction=0.125 assumed" in printed and "trained budgets [8, 16]" in printed


def test_veca_options_cannot_contradict_the_checkpoint(tmp_path, capsys):
    err = run_cli("veca", capsys, VECA_CHECKPOINT, tmp_path / "out", "--num-attention-heads", "4")
    assert "config gives num_attention_heads=2, but 4 was asked for" in err
    err = run_cli("veca", capsys, VECA_CHECKPOINT, tmp_path / "out", "--rope-zero-from", "high")
    assert "rope_zero_from='low'" in err


def test_veca_config_and_weights_must_agree(tmp_path, capsys):
    checkpoint = torch.load(VECA_CHECKPOINT, weights_only=True)
    checkpoint["config"]["num_layers"] = 5
    path = tmp_path / "inconsistent.pt"
    torch.save(checkpoint, path)
    err = run_cli("veca", capsys, path, tmp_path / "out")
    assert "config and weights disagree: num_hidden_layers 5 (config) vs 2 (weights)" in err


def test_lookwhere_unsupported_mlp_is_one_sentence(tmp_path, capsys):
    checkpoint = torch.load(LOOKWHERE_CHECKPOINT, weights_only=True)
    for part in (checkpoint["extractor"], checkpoint["selector"]["backbone"]):
        for name in [n for n in part if n.endswith("mlp.fc1.weight")]:
            part[name] = part[name][:100]
    path = tmp_path / "odd_mlp.pt"
    torch.save(checkpoint, path)
    err = run_cli("lookwhere", capsys, path, tmp_path / "out")
    assert "neither a plain MLP (equal widths) nor a packed SwiGLU" in err


@pytest.mark.parametrize("converter, checkpoint", [("veca", VECA_CHECKPOINT), ("lookwhere", LOOKWHERE_CHECKPOINT)])
def test_existing_output_is_left_alone(converter, checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the user's own weights")
    err = run_cli(converter, capsys, checkpoint, out)
    assert "exists and is not empty" in err
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == b"the user's own weights"
    assert not list(tmp_path.glob(".converting-*"))


def test_a_failed_save_leaves_nothing(tmp_path, monkeypatch, capsys):
    """The folder is written under a temporary name: a failure mid-save leaves neither it nor a partial folder."""
    from transformers import PreTrainedModel

    def fail(self, folder, *args, **kwargs):
        (Path(folder) / "config.json").write_text("{}")
        raise OSError("No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", fail)
    err = run_cli("veca", capsys, VECA_CHECKPOINT, tmp_path / "out")
    assert "No space left on device" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_error_has_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "corevision_hf.convert.veca", str(tmp_path / "missing.pt"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and "does not exist" in result.stderr
