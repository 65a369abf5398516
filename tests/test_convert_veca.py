"""Reference VECA checkpoint -> hub folder: a tiny model written out in the reference layout must come back exactly."""

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModel

from corevision_hf import VecaConfig, VecaModel
from corevision_hf.convert.veca import convert_reference_state_dict, main


class Opaque:
    """Not a tensor: weights_only loading must refuse it."""


def tiny_model(**overrides) -> VecaModel:
    # Not the tiny VECA of conftest: the reference's own layout (patch 16, a bank of 16 cores in chunks of 8, 2 heads,
    # LayerNorm eps 1e-5, PyTorch's default, as in the reference code), which the conversion asserts field by field.
    config = VecaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, num_cores=16,
        layer_norm_eps=1e-5, **overrides
    )
    model = VecaModel(config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():  # move off the init values so a misplaced weight changes the output
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


def to_reference(model: VecaModel) -> dict[str, torch.Tensor]:
    """Our weights in the authors' layout (the inverse of the converter, written independently)."""
    ours, config = model.state_dict(), model.config
    ref = {f"patch_embed.proj.{k}": ours[f"embeddings.patch_embeddings.projection.{k}"] for k in ("weight", "bias")}
    for i, chunk in enumerate(ours["embeddings.core_bank.cores"].split(8, dim=1)):
        ref[f"query_token_chunks.{i}"] = chunk.clone()
    for i, chunk in enumerate(ours["embeddings.core_bank.coordinates"][None].split(8, dim=1)):
        ref[f"qcoord_chunks.{i}"] = chunk.clone()
    heads = range(config.num_hidden_layers - 1)
    ref["pos_alpha"] = torch.cat([ours[f"encoder.coordinate_heads.{i}.alpha"] for i in heads])
    for k in ("weight", "bias"):
        for i in heads:
            ref[f"pos_linears.{i}.{k}"] = ours[f"encoder.coordinate_heads.{i}.proj.{k}"]
        for i in range(config.num_hidden_layers):
            layer = f"encoder.layers.{i}."
            for name in "qkv":
                ref[f"blocks.{i}.attn.{name}_proj.{k}"] = ours[f"{layer}attention.{name}_proj.{k}"]
            ref[f"blocks.{i}.attn.out_proj.{k}"] = ours[f"{layer}attention.o_proj.{k}"]
            ref[f"blocks.{i}.norm_attn.{k}"] = ours[f"{layer}norm1.{k}"]
            ref[f"blocks.{i}.norm_ffn.{k}"] = ours[f"{layer}norm2.{k}"]
            ref[f"blocks.{i}.fc1.{k}"] = ours[f"{layer}mlp.fc1.{k}"]
            ref[f"blocks.{i}.fc2.{k}"] = ours[f"{layer}mlp.fc2.{k}"]
        ref[f"final_norm.{k}"] = ours[f"norm.{k}"]
        if config.output_projection_size:
            ref[f"output_proj.{k}"] = ours[f"output_projection.{k}"]
    return {k: v.clone() for k, v in ref.items()}


def assert_same_outputs(expected: VecaModel, actual) -> None:
    pixel_values = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for num_cores in (16, 8, 3):
            want, got = expected(pixel_values, num_cores=num_cores), actual(pixel_values, num_cores=num_cores)
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
            torch.testing.assert_close(got.core_coordinates, want.core_coordinates)


@pytest.fixture(scope="module")
def reference_checkpoint(tmp_path_factory):
    model = tiny_model(output_projection_size=24)
    path = tmp_path_factory.mktemp("ref") / "veca_ref.pt"
    # DDP-wrapped training dict, as the reference saves it
    torch.save({"student": {f"module.{k}": v for k, v in to_reference(model).items()}, "epoch": 3}, path)
    return model, path


def test_convert_function_roundtrip():
    model = tiny_model()
    config, state_dict = convert_reference_state_dict(to_reference(model), num_attention_heads=2)
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (64, 2, 48)
    assert (config.num_cores, config.patch_size, config.num_channels) == (16, 16, 3)
    assert config.output_projection_size is None and config.num_attention_heads == 2
    converted = VecaModel(config).eval()
    converted.load_state_dict(state_dict, strict=True)
    assert_same_outputs(model, converted)


@pytest.mark.slow
def test_cli_roundtrip_loads_with_remote_code(reference_checkpoint, tmp_path):
    model, path = reference_checkpoint
    out = tmp_path / "hub"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "corevision_hf.convert.veca", str(path), str(out), "--num-attention-heads", "2"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {"config.json", "model.safetensors", "modeling_veca.py", "configuration_veca.py"} <= set(os.listdir(out))
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    assert loaded.config.output_projection_size == 24
    assert_same_outputs(model, loaded)


def capsys_text(capsys) -> str:
    return capsys.readouterr().err


def test_refuses_pickled_objects(tmp_path, capsys):
    path = tmp_path / "pickled.pt"
    torch.save({"student": to_reference(tiny_model()), "loader": Opaque()}, path)
    assert main([str(path), str(tmp_path / "out")]) == 2
    assert "not a plain tensor checkpoint and will not be unpickled" in capsys_text(capsys)
    assert not (tmp_path / "out").exists()


def test_missing_file(tmp_path, capsys):
    assert main([str(tmp_path / "nope.pt"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys_text(capsys)


def test_refuses_non_empty_out_dir_without_force(reference_checkpoint, tmp_path, capsys):
    _, path = reference_checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([str(path), str(out), "--num-attention-heads", "2"]) == 2
    assert "not empty; choose a new folder or pass --force" in capsys_text(capsys)
    assert os.listdir(out) == ["notes.txt"]
    main([str(path), str(out), "--num-attention-heads", "2", "--force"])
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").exists()


def test_rejects_unknown_missing_and_misshaped_keys():
    reference = to_reference(tiny_model())
    with pytest.raises(ValueError, match=r"not a supported VECA .*: 1 unexpected tensors \(blocks.0.ls1.gamma\)\.$"):
        convert_reference_state_dict({**reference, "blocks.0.ls1.gamma": torch.ones(64)}, 2)
    with pytest.raises(ValueError, match=r"1 unexpected tensors \(pos_linears.5.bias\)"):
        convert_reference_state_dict({**reference, "pos_linears.5.bias": torch.ones(2)}, 2)
    with pytest.raises(ValueError, match=r"1 tensors of the wrong shape \(patch_embed.norm.weight \(32,\) for \(64,\)\)"):
        convert_reference_state_dict({**reference, "patch_embed.norm.weight": torch.ones(32),
                                      "patch_embed.norm.bias": torch.ones(64)}, 2)
    del reference["blocks.1.fc1.bias"]
    with pytest.raises(ValueError, match=r"1 missing tensors \(encoder.layers.1.mlp.fc1.bias\)"):
        convert_reference_state_dict(reference, 2)


def test_preset_mismatch_is_refused(reference_checkpoint, tmp_path, capsys):
    _, path = reference_checkpoint
    assert main([str(path), str(tmp_path / "out"), "--preset", "base", "--num-attention-heads", "2"]) == 2
    assert "hidden_size is 64, not 768" in capsys_text(capsys)
