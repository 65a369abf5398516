"""Reference LookWhere checkpoint -> hub folder: a tiny model written out in the reference layout must come back
exactly."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_lookwhere_config
from transformers import AutoModel

from corevision_hf import LookWhereModel
from corevision_hf.convert.lookwhere import convert_reference_state_dict, main


HEADS = 2  # hidden 32 is no multiple of DINOv2's head dim 64, so the heads are always passed


class Opaque:
    """Not a tensor: weights_only loading must refuse it."""


def tiny_model() -> LookWhereModel:
    """Width 32, 3 extractor blocks at 32 px (8 x 8 grid), 1 selector block at 12 px (3 x 3 grid), patch 4."""
    # the tiny LookWhere with fields off their defaults (the converter must read them from the shapes)
    config = tiny_lookwhere_config(
        num_attention_heads=HEADS, intermediate_size=48, num_register_tokens=2, map_head_ratio=2,
        selector_antialias=False,  # as the authors' released inference code
    )
    torch.manual_seed(0)
    model = LookWhereModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # move off the init values so a misplaced weight changes the output
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


def timm_vit(ours: dict, prefix: str, depth: int) -> dict:
    """One of our ViTs (`selector` / `extractor`) in timm's naming, without the CLS / register tokens."""
    ref = {"pos_embed": ours[f"{prefix}.embeddings.position_embeddings"]}
    for k in ("weight", "bias"):
        ref[f"patch_embed.proj.{k}"] = ours[f"{prefix}.embeddings.patch_embeddings.projection.{k}"]
        ref[f"norm.{k}"] = ours[f"{prefix}.norm.{k}"]
    for i in range(depth):
        b, o = f"blocks.{i}.", f"{prefix}.layers.{i}."
        for k in ("weight", "bias"):
            for timm_name, name in [("norm1", "norm1"), ("attn.proj", "attention.o_proj"), ("norm2", "norm2"),
                                    ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]:
                ref[f"{b}{timm_name}.{k}"] = ours[f"{o}{name}.{k}"]
            ref[f"{b}attn.qkv.{k}"] = torch.cat([ours[f"{o}attention.{p}_proj.{k}"] for p in "qkv"])  # timm's fused
        ref[b + "ls1.gamma"] = ours[o + "layer_scale1.lambda1"]
        ref[b + "ls2.gamma"] = ours[o + "layer_scale2.lambda1"]
    return {k: v.clone() for k, v in ref.items()}


def to_reference(model: LookWhereModel) -> dict:
    """Our weights in the authors' layout (the inverse of the converter, written independently)."""
    ours, config = model.state_dict(), model.config
    d, r = config.hidden_size, config.num_register_tokens
    selector = timm_vit(ours, "selector", config.selector_depth)
    selector["cls_token"] = ours["selector.embeddings.cls_token"].clone()
    selector["reg_token"] = ours["selector.embeddings.register_tokens"].clone()
    head = {f"{w}.{k}": ours[f"selector.map_head.{i}.{k}"].clone() for w, i in [("w1", 0), ("w2", 2)]
            for k in ("weight", "bias")}
    extractor = timm_vit(ours, "extractor", config.num_hidden_layers)
    # the reference keeps the extractor's own (unused) CLS and registers
    extractor["cls_token"], extractor["reg_token"] = torch.randn(1, 1, d), torch.randn(1, r, d)
    return {"selector": {"backbone": selector, "head": head}, "extractor": extractor}


def assert_same_outputs(expected: LookWhereModel, actual) -> None:
    pixel_values = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for budget in ({"k": 5}, {"k_ratio": 0.5}):
            want, got = expected(pixel_values, **budget), actual(pixel_values, **budget)
            torch.testing.assert_close(got.selected_indices, want.selected_indices, rtol=0, atol=0)
            torch.testing.assert_close(got.selector_map, want.selector_map, rtol=0, atol=1e-6)
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def reference_checkpoint(tmp_path_factory):
    model = tiny_model()
    path = tmp_path_factory.mktemp("ref") / "lookwhere_dinov2.pt"
    torch.save(to_reference(model), path)
    return model, path


def test_convert_function_roundtrip():
    model = tiny_model()
    config, state_dict = convert_reference_state_dict(to_reference(model), num_attention_heads=HEADS)
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size) == (32, 2, 48)
    assert (config.num_hidden_layers, config.selector_depth, config.num_register_tokens) == (3, 1, 2)
    assert (config.patch_size, config.num_channels, config.image_size, config.selector_image_size) == (4, 3, 32, 12)
    assert config.map_head_ratio == 2 and config.qkv_bias
    converted = LookWhereModel(config).eval()
    converted.load_state_dict(state_dict, strict=True)
    assert_same_outputs(model, converted)


def test_extractor_tokens_are_optional():
    reference = to_reference(tiny_model())
    del reference["extractor"]["cls_token"], reference["extractor"]["reg_token"]
    config, state_dict = convert_reference_state_dict(reference, HEADS)
    assert not any(name.startswith("extractor.") and "token" in name for name in state_dict)


@pytest.mark.slow
def test_cli_roundtrip_loads_with_remote_code(reference_checkpoint, tmp_path):
    model, path = reference_checkpoint
    out = tmp_path / "hub"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "corevision_hf.convert.lookwhere", str(path), str(out), "--num-attention-heads", "2"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    files = {"config.json", "model.safetensors", "modeling_lookwhere.py", "configuration_lookwhere.py"}
    assert files <= set(os.listdir(out))
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    assert type(loaded).__name__ == "LookWhereModel" and loaded.config.num_attention_heads == 2
    assert_same_outputs(model, loaded)


def test_refuses_pickled_objects(tmp_path, capsys):
    path = tmp_path / "pickled.pt"
    torch.save({**to_reference(tiny_model()), "loader": Opaque()}, path)
    assert main([str(path), str(tmp_path / "out"), "--num-attention-heads", "2"]) == 2
    assert "not a plain tensor checkpoint and will not be unpickled" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_file(tmp_path, capsys):
    assert main([str(tmp_path / "nope.pt"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_refuses_non_empty_out_dir_without_force(reference_checkpoint, tmp_path, capsys):
    _, path = reference_checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([str(path), str(out), "--num-attention-heads", "2"]) == 2
    assert "not empty; choose a new folder or pass --force" in capsys.readouterr().err
    assert os.listdir(out) == ["notes.txt"]
    main([str(path), str(out), "--num-attention-heads", "2", "--force"])
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").exists()


def test_rejects_wrong_map_head_width():
    reference = to_reference(tiny_model())
    head = reference["selector"]["head"]
    head["w2.weight"], head["w2.bias"] = head["w2.weight"][:4], head["w2.bias"][:4]  # 2 x 2 cells, not 3 x 3
    with pytest.raises(ValueError, match=r"w2.weight has 4 output features.*= 9"):
        convert_reference_state_dict(reference, HEADS)


def test_rejects_unknown_missing_and_mis_shaped_keys():
    reference = to_reference(tiny_model())
    extra = {**reference, "extractor": {**reference["extractor"], "head.weight": torch.ones(10, 32)}}
    with pytest.raises(ValueError, match=r"1 unexpected tensors \(extractor.head.weight\)\.$"):
        convert_reference_state_dict(extra, HEADS)
    with pytest.raises(ValueError, match="pass --num-attention-heads"):
        convert_reference_state_dict(reference, None)
    reference["selector"]["backbone"]["blocks.0.ls2.gamma"] = torch.ones(16)
    with pytest.raises(ValueError, match=r"wrong shape \(selector.backbone.blocks.0.ls2.gamma \(16,\) for \(32,\)\)"):
        convert_reference_state_dict(reference, HEADS)
    del reference["extractor"]["blocks.2.mlp.fc1.bias"]
    with pytest.raises(ValueError, match=r"1 missing tensors \(extractor.layers.2.mlp.fc1.bias\)"):
        convert_reference_state_dict(reference, HEADS)
