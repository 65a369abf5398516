"""ONNX export: dynamic batch, height and width, checked with onnxruntime against PyTorch."""

import re

import onnx
import onnxruntime
import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.export import main


# Two resolutions (non-square, neither the export size) x two batch sizes.
SHAPES = {"veca": [(1, 3, 24, 40), (2, 3, 48, 32)], "lookwhere": [(1, 3, 36, 28), (2, 3, 56, 44)]}


def saved(tmp_path, name: str):
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config()) if name == "veca" else LookWhereModel(tiny_lookwhere_config())
    model.eval().save_pretrained(tmp_path / name)
    return model, str(tmp_path / name)


def onnx_outputs(path: str, pixel_values: torch.Tensor) -> list[torch.Tensor]:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [torch.from_numpy(x) for x in session.run(None, {"pixel_values": pixel_values.numpy()})]


@pytest.mark.parametrize(
    "name, flags, budget",
    [("veca", ["--num-cores", "3"], {"num_cores": 3}), ("lookwhere", ["--k-ratio", "0.2"], {"k_ratio": 0.2})],
)
def test_onnxruntime_matches_pytorch_at_two_resolutions_and_batch_sizes(tmp_path, capsys, name, flags, budget):
    model, folder = saved(tmp_path, name)
    out = str(tmp_path / f"{name}.onnx")
    assert main([folder, out, *flags]) == 0
    assert "onnxruntime vs PyTorch" in capsys.readouterr().out
    generator = torch.Generator().manual_seed(2)
    for shape in SHAPES[name]:
        pixel_values = torch.randn(shape, generator=generator)
        with torch.no_grad():
            expected = model(pixel_values, **budget)
        last_hidden_state, pooler_output = onnx_outputs(out, pixel_values)
        assert last_hidden_state.shape == expected.last_hidden_state.shape
        torch.testing.assert_close(last_hidden_state, expected.last_hidden_state, atol=1e-4, rtol=0)
        torch.testing.assert_close(pooler_output, expected.pooler_output, atol=1e-4, rtol=0)


def test_lookwhere_fixed_k_graph(tmp_path):
    model, folder = saved(tmp_path, "lookwhere")
    out = str(tmp_path / "k.onnx")
    assert main([folder, out, "--k", "7", "--no-check"]) == 0
    pixel_values = torch.randn(1, 3, 40, 44)
    with torch.no_grad():
        expected = model(pixel_values, k=7).last_hidden_state
    torch.testing.assert_close(onnx_outputs(out, pixel_values)[0], expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_fp16_graph_runs_close_to_float32(tmp_path, name):
    model, folder = saved(tmp_path, name)
    out = str(tmp_path / "half.onnx")
    assert main([folder, out, "--dtype", "fp16", "--no-check"]) == 0
    graph = onnx.load(out).graph
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    sizes = {dtype: 0 for dtype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)}
    for tensor in graph.initializer:
        sizes[tensor.data_type] = sizes.get(tensor.data_type, 0) + int(torch.tensor(list(tensor.dims)).prod())
    assert sizes[onnx.TensorProto.FLOAT16] > 0.95 * sum(sizes.values())  # float32 only where the model wants it
    pixel_values = torch.randn(SHAPES[name][1], generator=torch.Generator().manual_seed(3))
    budget = {"num_cores": 8} if name == "veca" else {"k": 20}
    if name == "lookwhere":
        graph_out = str(tmp_path / "half_k.onnx")
        assert main([folder, graph_out, "--dtype", "fp16", "--k", "20", "--no-check"]) == 0
        out = graph_out
    with torch.no_grad():
        expected = model(pixel_values, **budget).last_hidden_state
    actual = onnx_outputs(out, pixel_values.half())[0].float()
    assert torch.nn.functional.cosine_similarity(actual.flatten(1), expected.flatten(1)).min() >= 0.999


@pytest.mark.parametrize(
    "name, flags, message",
    [
        ("veca", ["--k-ratio", "0.1"], "LookWhere budgets"),
        ("veca", ["--num-cores", "99"], r"--num-cores 99 is out of range: .* 1..8"),
        ("lookwhere", ["--num-cores", "4"], "--num-cores is VECA's budget"),
        ("lookwhere", ["--k-ratio", "1.5"], r"--k-ratio must lie in \(0, 1\]"),
        ("lookwhere", ["--k", "3"], r"--k must be at least num_fill_neighbors \(5\)"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, name, flags, message):
    _, folder = saved(tmp_path, name)
    assert main([folder, str(tmp_path / "out.onnx"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and re.search(message, err.strip().splitlines()[-1]), err
    assert not (tmp_path / "out.onnx").exists()


def test_bad_paths_exit_2_and_nothing_is_overwritten(tmp_path, capsys):
    _, folder = saved(tmp_path, "veca")
    existing = tmp_path / "mine.onnx"
    existing.write_text("keep me")
    assert main([folder, str(existing)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert existing.read_text() == "keep me"
    assert main([str(tmp_path / "missing"), str(tmp_path / "a.onnx")]) == 2
    assert "Cannot read a model config" in capsys.readouterr().err
    assert main([folder, str(tmp_path / "no" / "such" / "dir.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name, flags", [("veca", ["--num-cores", "3"]), ("lookwhere", ["--k-ratio", "0.2"])])
def test_graph_refuses_a_size_that_is_not_a_patch_multiple(tmp_path, name, flags):
    model, folder = saved(tmp_path, name)
    out = str(tmp_path / f"{name}.onnx")
    assert main([folder, out, *flags, "--no-check"]) == 0
    patch = model.config.patch_size
    onnx_outputs(out, torch.randn(1, 3, 6 * patch, 5 * patch))  # a multiple runs
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.Fail, match="cannot be reshaped"):
        onnx_outputs(out, torch.randn(1, 3, 6 * patch + 1, 5 * patch))
