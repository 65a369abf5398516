"""ONNX export: dynamic batch, height and width, checked with onnxruntime against PyTorch."""

import re

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from conftest import lookwhere_training_numerics, tiny_lookwhere_config, tiny_veca_config

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


def test_lookwhere_graphs_follow_the_training_numerics(tmp_path):
    """A student with the authors' training numerics (tanh GELU, epsilon 1e-5, antialiased selector map) exports with
    them: the fixed and the elastic graph equal PyTorch, whose output they change."""
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config(**lookwhere_training_numerics())).eval()
    model.save_pretrained(tmp_path / "model")
    release = LookWhereModel(tiny_lookwhere_config(selector_antialias=False)).eval()
    release.load_state_dict(model.state_dict())
    fixed, elastic = str(tmp_path / "fixed.onnx"), str(tmp_path / "elastic.onnx")
    assert main([str(tmp_path / "model"), fixed, "--k-ratio", "0.2", "--no-check"]) == 0
    assert main([str(tmp_path / "model"), elastic, "--elastic", "--no-check"]) == 0
    pixel_values = torch.randn(SHAPES["lookwhere"][1], generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, other = model(pixel_values, k_ratio=0.2), release(pixel_values, k_ratio=0.2)
    assert (expected.selector_map - other.selector_map).abs().max() > 1e-2
    assert (expected.last_hidden_state - other.last_hidden_state).abs().max() > 1e-3
    torch.testing.assert_close(onnx_outputs(fixed, pixel_values)[0], expected.last_hidden_state, atol=1e-4, rtol=0)
    session = onnxruntime.InferenceSession(elastic, providers=["CPUExecutionProvider"])
    actual = session.run(None, {"pixel_values": pixel_values.numpy(), **budget_feed({"k_ratio": 0.2})})
    torch.testing.assert_close(torch.from_numpy(actual[0]), expected.last_hidden_state, atol=1e-4, rtol=0)


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


def test_exporting_into_the_working_folder_leaves_only_the_graph(tmp_path, monkeypatch, capsys):
    """The graph carries the mark that --force reads in its own metadata: no manifest is left beside it, --force
    replaces our graph, and a graph changed since (or a copy of the mark on another graph) is kept."""
    _, folder = saved(tmp_path, "veca")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main([folder, "veca.onnx", "--elastic", "--no-check"]) == 0
    assert sorted(p.name for p in work.iterdir()) == ["veca.onnx"]
    assert main([folder, "veca.onnx", "--num-cores", "3", "--no-check", "--force"]) == 0  # ours: replaced
    assert sorted(p.name for p in work.iterdir()) == ["veca.onnx"]
    capsys.readouterr()
    graph = onnx.load("veca.onnx")
    graph.producer_name = "edited by hand"  # the mark stays, the rest changed
    onnx.save(graph, "veca.onnx")
    edited = (work / "veca.onnx").read_bytes()
    assert main([folder, "veca.onnx", "--no-check", "--force"]) == 2
    assert "veca.onnx was not written by corevision_hf (or was changed since)" in capsys.readouterr().err
    assert (work / "veca.onnx").read_bytes() == edited


@pytest.mark.parametrize("name, flags", [("veca", ["--num-cores", "3"]), ("lookwhere", ["--k-ratio", "0.2"])])
def test_graph_refuses_a_size_that_is_not_a_patch_multiple(tmp_path, name, flags):
    model, folder = saved(tmp_path, name)
    out = str(tmp_path / f"{name}.onnx")
    assert main([folder, out, *flags, "--no-check"]) == 0
    patch = model.config.patch_size
    onnx_outputs(out, torch.randn(1, 3, 6 * patch, 5 * patch))  # a multiple runs
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.Fail, match="cannot be reshaped"):
        onnx_outputs(out, torch.randn(1, 3, 6 * patch + 1, 5 * patch))


# An elastic graph, checked at the budgets a user would pick: VECA 1, 8, 16 and the whole bank; LookWhere the fewest
# kept patches the dense fill takes (5), 10% and all of the grid, as k or as k_ratio.
def elastic_grid(name: str, model, shape) -> list[dict]:
    if name == "veca":
        return [{"num_cores": cores} for cores in (1, 8, 16, model.config.num_cores)]
    patches = (shape[2] // model.config.patch_size) * (shape[3] // model.config.patch_size)
    ks = [5, max(5, patches // 10), patches]
    if name == "lookwhere-k":
        return [{"k": k} for k in ks]
    return [{"k_ratio": (k + 0.5) / patches if k < patches else 1.0} for k in ks]  # the floor keeps k


def saved_elastic(tmp_path, name: str):
    """A tiny model with a bank of 24 cores (VECA) or a LookWhere, saved; the input the elastic graph takes."""
    torch.manual_seed(0)
    if name == "veca":
        model = VecaModel(tiny_veca_config(num_cores=24))
    else:
        model = LookWhereModel(tiny_lookwhere_config())
    model.eval().save_pretrained(tmp_path / "model")
    return model, str(tmp_path / "model"), {"veca": "num_cores", "lookwhere-k": "k", "lookwhere-k_ratio": "k_ratio",
                                            "lookwhere-k_mass": "k_mass"}[name]


def budget_feed(budget: dict) -> dict:
    return {name: np.array(value, dtype=np.float64 if name == "k_ratio" else np.int64) for name, value in budget.items()}


@pytest.mark.parametrize("name", ["veca", "lookwhere-k", "lookwhere-k_ratio"])
def test_one_elastic_graph_matches_pytorch_at_every_budget_and_two_sizes(tmp_path, capsys, name):
    model, folder, budget_input = saved_elastic(tmp_path, name)
    out = str(tmp_path / "elastic.onnx")
    assert main([folder, out, "--elastic", *([budget_input] if name == "lookwhere-k" else [])]) == 0
    assert f"{budget_input}=" in capsys.readouterr().out  # the command checked it at several budgets
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    inputs = {graph_input.name: graph_input for graph_input in session.get_inputs()}
    assert list(inputs) == ["pixel_values", budget_input] and inputs[budget_input].shape == []
    assert inputs[budget_input].type == ("tensor(double)" if budget_input == "k_ratio" else "tensor(int64)")
    generator = torch.Generator().manual_seed(2)
    shapes = SHAPES["veca" if name == "veca" else "lookwhere"]
    for shape in shapes:
        pixel_values = torch.randn(shape, generator=generator)
        for budget in elastic_grid(name, model, shapes[0]):
            with torch.no_grad():
                expected = model(pixel_values, **budget)
            actual = session.run(None, {"pixel_values": pixel_values.numpy(), **budget_feed(budget)})
            assert actual[0].shape == tuple(expected.last_hidden_state.shape), budget
            torch.testing.assert_close(torch.from_numpy(actual[0]), expected.last_hidden_state, atol=1e-4, rtol=0)
            torch.testing.assert_close(torch.from_numpy(actual[1]), expected.pooler_output, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["veca", "lookwhere-k_ratio"])
def test_elastic_fp16_graph_runs_close_to_float32_at_every_budget(tmp_path, name):
    model, folder, budget_input = saved_elastic(tmp_path, name)
    out = str(tmp_path / "half.onnx")
    assert main([folder, out, "--elastic", "--dtype", "fp16", "--no-check"]) == 0
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float16)"
    shape = SHAPES["veca" if name == "veca" else "lookwhere"][1]
    pixel_values = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    for budget in elastic_grid(name, model, shape):
        with torch.no_grad():
            expected = model(pixel_values, **budget).last_hidden_state
        actual = torch.from_numpy(session.run(None, {"pixel_values": pixel_values.half().numpy(), **budget_feed(budget)})[0])
        assert torch.nn.functional.cosine_similarity(actual.float().flatten(1), expected.flatten(1)).min() >= 0.999


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("veca", np.array(0), r"Name:'num_cores must lie in 1\.\.24'"),
        ("veca", np.array(25), r"Name:'num_cores must lie in 1\.\.24'"),
        ("veca", np.array(8, dtype=np.int32), r"Unexpected input data type\. Actual: \(tensor\(int32\)\) , expected: \(tensor\(int64\)\)"),
        ("lookwhere-k", np.array(4), r"Name:'k must lie in 5\.\.the image's patches'"),
        ("lookwhere-k", np.array(64), r"Name:'k must lie in 5\.\.the image's patches'"),  # the 36 x 28 image has 63
        ("lookwhere-k_ratio", np.array(1.5), r"Name:'k_ratio must lie in \(0, 1\] and keep at least 5 patches"),
        ("lookwhere-k_ratio", np.array(0.05), r"Name:'k_ratio must lie in \(0, 1\] and keep at least 5 patches"),
        ("lookwhere-k_ratio", np.array(0.5, dtype=np.float32), r"Actual: \(tensor\(float\)\) , expected: \(tensor\(double\)\)"),
        # onnxruntime does not check a 0-d input's shape: the graph's first reshape of it does, naming the fix
        ("veca", np.array([8, 8]), r"Name:'num_cores must be one number for the whole batch: a 0-d array"),
        ("lookwhere-k", np.array([5, 6]), r"Name:'k must be one number for the whole batch: a 0-d array"),
        ("lookwhere-k_ratio", np.array([0.5, 0.9]), r"Name:'k_ratio must be one number for the whole batch"),
        ("lookwhere-k_mass", np.array([0.5, 0.9]), r"Name:'k_mass must be one number for the whole batch"),
    ],
)
def test_elastic_graph_refuses_a_budget_out_of_range_or_of_another_dtype(tmp_path, name, bad, message):
    model, folder, budget_input = saved_elastic(tmp_path, name)
    out = str(tmp_path / "elastic.onnx")
    assert main([folder, out, "--elastic", budget_input, "--no-check"]) == 0
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    pixel_values = torch.randn(SHAPES["veca" if name == "veca" else "lookwhere"][0]).numpy()
    state = onnxruntime.capi.onnxruntime_pybind11_state
    with pytest.raises((state.InvalidArgument, state.Fail), match=message):
        session.run(None, {"pixel_values": pixel_values, budget_input: bad})


@pytest.mark.parametrize(
    "name, flags, message",
    [
        ("veca", ["--elastic", "--num-cores", "3"], "argument --num-cores: not allowed with argument --elastic"),
        ("lookwhere", ["--k-ratio", "0.2", "--elastic"], "argument --elastic: not allowed with argument --k-ratio"),
        ("lookwhere", ["--elastic", "num_cores"], "--elastic num_cores: a lookwhere graph's budget input is k_ratio or k"),
        ("veca", ["--elastic", "k"], "--elastic k: a veca graph's budget input is num_cores"),
    ],
)
def test_elastic_with_a_fixed_budget_or_another_models_input_is_one_error(tmp_path, capsys, name, flags, message):
    _, folder = saved(tmp_path, name)
    try:
        status = main([folder, str(tmp_path / "out.onnx"), *flags])
    except SystemExit as exit:  # argparse refuses two budget flags itself
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err.strip().splitlines()[-1], err
    assert not (tmp_path / "out.onnx").exists()


def test_fixed_k_ratio_graph_refuses_an_image_whose_k_is_below_the_fill(tmp_path):
    """A --k-ratio graph keeps floor(k_ratio * patches) of each image, at least num_fill_neighbors (5) for the fill:
    a large image runs, one too small for 5 kept patches is refused by name."""
    model, folder, _ = saved_elastic(tmp_path, "lookwhere-k_ratio")
    out = str(tmp_path / "fixed.onnx")
    assert main([folder, out, "--k-ratio", "0.25", "--no-check"]) == 0
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    patch = model.config.patch_size
    pixel_values = torch.randn(1, 3, 6 * patch, 5 * patch, generator=torch.Generator().manual_seed(4))  # k = 7
    with torch.no_grad():
        expected = model(pixel_values, k_ratio=0.25).last_hidden_state
    torch.testing.assert_close(torch.from_numpy(session.run(None, {"pixel_values": pixel_values.numpy()})[0]), expected,
                               atol=1e-4, rtol=0)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="keep at least 5 patches"):
        session.run(None, {"pixel_values": torch.randn(1, 3, 4 * patch, 4 * patch).numpy()})  # k = 4


def test_elastic_graph_keeps_the_floor_of_a_decimal_k_ratio_as_the_model_does(tmp_path):
    """On a 10 x 10 grid, k_ratio 0.29 keeps 29 patches and 0.57 keeps 57 (their float64 products are 28.999... and
    56.999...), 0.53 keeps 53 (its float32 product is 52.999...): the graph gives the model's output at that k, and
    the model's own at that k_ratio."""
    model, folder, _ = saved_elastic(tmp_path, "lookwhere-k_ratio")
    out = str(tmp_path / "elastic.onnx")
    assert main([folder, out, "--elastic", "--no-check"]) == 0
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    pixel_values = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(5))  # patch 4: 10 x 10
    for k_ratio, kept in [(0.29, 29), (0.57, 57), (0.53, 53), (0.59, 59), (0.07, 7), (1.0, 100)]:
        with torch.no_grad():
            at_k = model(pixel_values, k=kept).last_hidden_state
            at_ratio = model(pixel_values, k_ratio=k_ratio).last_hidden_state
        actual = session.run(None, {"pixel_values": pixel_values.numpy(), **budget_feed({"k_ratio": k_ratio})})[0]
        torch.testing.assert_close(torch.from_numpy(actual), at_k, atol=1e-4, rtol=0, msg=f"k_ratio {k_ratio}")
        torch.testing.assert_close(at_ratio, at_k, atol=0, rtol=0, msg=f"k_ratio {k_ratio}")
