"""corevision_hf.visualize: what each picture draws is checked on the figure's own artists, not only that it saves."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from matplotlib.patches import Rectangle
from PIL import Image
from transformers.modeling_outputs import BaseModelOutput

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.images import to_pixel_values
from corevision_hf.outputs import MANIFEST
from corevision_hf.visualize import (
    PCAColors,
    cli as visualize_cli,
    figure_to_image,
    main as visualize_main,
    model_pictures,
    patch_features,
    plot_cores,
    plot_evaluation,
    plot_feature_pca,
    plot_kept_patches,
)


PHOTO = np.random.default_rng(0).random((64, 96, 3))  # H=64, W=96: not square, so x and y cannot be swapped


def test_patch_features_are_the_patch_tokens_on_the_grid():
    tokens = torch.arange(2 * (1 + 6) * 4, dtype=torch.float32).reshape(2, 7, 4)  # CLS, then a 2 x 3 grid
    grid = patch_features(BaseModelOutput(last_hidden_state=tokens), (2, 3))
    assert grid.shape == (2, 2, 3, 4)
    torch.testing.assert_close(grid[1, 1, 0], tokens[1, 1 + 3])  # row 1, column 0 = patch 3
    with pytest.raises(ValueError, match="grid given does not match"):
        patch_features(BaseModelOutput(last_hidden_state=tokens), (2, 2))


def test_pca_colours_follow_feature_directions_not_norms():
    torch.manual_seed(0)
    directions = torch.randn(3, 16)
    features = torch.randn(200, 3) @ directions + 0.01 * torch.randn(200, 16)
    colors = PCAColors(features)
    rgb = colors(features)
    assert rgb.shape == (200, 3) and rgb.min() >= 0 and rgb.max() <= 1
    np.testing.assert_allclose(colors(5 * features), rgb, atol=1e-6)  # a scaled copy (e.g. a student) looks the same
    np.testing.assert_allclose(colors(features[:1].repeat(4, 1)), rgb[:1].repeat(4, 0), atol=1e-6)
    assert np.ptp(rgb, axis=0).min() > 0.5  # each channel spans most of its range


def test_feature_pca_uses_the_first_panel_colours_and_says_when_it_cannot():
    torch.manual_seed(0)
    teacher = torch.randn(4, 6, 8)
    figure = plot_feature_pca([(PHOTO, {"teacher": teacher, "same": teacher.clone(), "narrow": torch.randn(4, 6, 5)})],
                              title="t")
    axes = figure.axes
    assert [a.get_title() for a in axes] == ["photo", "teacher", "same", "narrow\n(own colours: other width)"]
    np.testing.assert_array_equal(axes[1].images[0].get_array(), axes[2].images[0].get_array())
    assert axes[1].images[0].get_extent() == [0, 96, 64, 0]  # drawn over the photo's extent


def test_cores_are_drawn_where_their_coordinates_say():
    coordinates = torch.tensor([[-1.0, -1.0], [0.0, 0.5], [0.98, 0.0]])  # (x, y) in (-1, 1)
    figure = plot_cores(PHOTO, {"3 cores": coordinates})
    axis = figure.axes[0]
    np.testing.assert_allclose(axis.collections[0].get_offsets(), [[0, 0], [48, 48], [95.04, 32]], atol=1e-4)
    assert axis.get_title() == "3 cores\n2 of 3 within 2.5% of the border"
    assert axis.get_xlim()[0] < 0 and axis.get_xlim()[1] > 96  # a margin: border cores are drawn whole
    assert figure.axes[-1].get_ylabel() == "core index (order in the bank)"  # the colour bar


def test_kept_patches_are_outlined_and_counted():
    selector_map = torch.arange(12.0)
    figure = plot_kept_patches(PHOTO, selector_map, {"k 3": torch.tensor([0, 5, 11])}, grid=(3, 4))
    kept_axis = figure.axes[1]
    corners = sorted(p.get_xy() for p in kept_axis.patches if isinstance(p, Rectangle))
    assert corners == [(0.0, 0.0), (24.0, 21 + 1 / 3), (72.0, 42 + 2 / 3)]  # patches 0, 5 and 11 of a 3 x 4 grid
    assert kept_axis.get_title() == "k 3\nkept 3 of 12 patches (25%)"
    assert any(a.get_ylabel() == "selector score (logit)" for a in figure.axes)


def evaluation_report() -> dict:
    results = []
    for budget, gflops, cls in [(4, 5.7, 0.70), (8, 5.8, 0.69), (32, 6.4, 0.69)]:
        results.append({"budget": budget, "cost": {"224": {"gflops": gflops, "latency_ms": 40.0}},
                        "quality": {"cls_cosine": cls, "cls_cosine_std": 0.1, "patch_cosine": 0.49,
                                    "patch_cosine_std": None, "probe_accuracy": None, "segmentation_miou": None}})
    return {"model_type": "veca", "budget_name": "num_cores", "resolutions": [224], "quality_resolution": 224,
            "agreement_images": 2, "teacher_cost": {"224": {"gflops": 12.2, "latency_ms": 90.0}}, "results": results,
            "environment": {"device": "cpu", "dtype": "float32", "batch_size": 1}}


def test_evaluation_plot_has_full_axes_the_teacher_and_error_bars():
    figure = plot_evaluation(evaluation_report())
    cls_axis, patch_axis, latency_axis = figure.axes
    for axis in (cls_axis, patch_axis):
        assert axis.get_ylim() == pytest.approx((0.0, 1.05))  # not an autoscaled sliver around 0.69
        assert axis.get_xlim()[0] == 0 and axis.get_xlim()[1] > 12.2  # the teacher's GFLOPs are on the axis
        stars = [line for line in axis.lines if line.get_marker() == "*"]
        assert [tuple(s.get_xydata()[0]) for s in stars] == [(12.2, 1.0)]
    assert "mean ± sd over 2 images" in cls_axis.get_ylabel() and "sd" not in patch_axis.get_ylabel()
    assert len(cls_axis.containers) == 3 and cls_axis.containers[0].has_yerr  # one error bar per budget
    assert [t.get_text() for t in cls_axis.get_legend().get_texts()] == ["teacher", "4", "8", "32"]
    assert 90.0 in [line.get_ydata()[0] for line in latency_axis.lines]  # the teacher's latency as a line
    assert figure_to_image(figure).size[0] > 800


# ---------------------------------------------------------------- python -m corevision_hf.visualize


def saved_photo(path) -> str:
    """A 60 x 90 (H x W) random photo: not square, so the pictures keep the aspect ratio."""
    pixels = (np.random.default_rng(1).random((60, 90, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path)


@pytest.fixture
def veca_folder(tmp_path):
    torch.manual_seed(0)
    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "models" / "veca")  # patch 8, a bank of 8 cores
    return str(tmp_path / "models" / "veca")


@pytest.fixture
def lookwhere_folder(tmp_path):
    torch.manual_seed(0)
    LookWhereModel(tiny_lookwhere_config()).save_pretrained(tmp_path / "models" / "lookwhere")  # patch 4
    return str(tmp_path / "models" / "lookwhere")


def test_command_draws_the_cores_a_direct_call_computes(tmp_path, veca_folder):
    photo = saved_photo(tmp_path / "photo.png")
    paths = visualize_main([veca_folder, photo, "--num-cores", "2", "8", "--resolution", "24",
                            "--output", str(tmp_path / "out.png")])
    assert paths == {"features": str(tmp_path / "out.png"), "cores": str(tmp_path / "out-cores.png")}
    assert Image.open(paths["features"]).format == "PNG" and Image.open(paths["cores"]).format == "PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "models", "out-cores.png", "out.png", "photo.png"]

    model = VecaModel.from_pretrained(veca_folder).eval()
    pictures = model_pictures(model, Image.open(photo), [{"num_cores": 8}, {"num_cores": 2}], resolution=24)
    pixel_values = to_pixel_values(Image.open(photo), 24, patch_size=8)[None]
    assert pixel_values.shape[-2:] == (24, 32)  # 60 x 90 -> 24 x 36, 36 / 8 = 4.5 patches rounded (to even) to 4
    with torch.inference_mode():
        direct = {n: model(pixel_values, num_cores=n) for n in (8, 2)}
    axes = pictures["cores"].axes
    assert [a.get_title().split("\n")[0] for a in axes[:2]] == ["8 cores", "2 cores"]
    for axis, n in zip(axes, (8, 2)):
        xy = direct[n].core_coordinates[0]
        expected = torch.stack([(xy[:, 0] + 1) / 2 * 32, (xy[:, 1] + 1) / 2 * 24], -1)
        np.testing.assert_allclose(axis.collections[0].get_offsets(), expected.numpy(), atol=1e-4)
    colours = PCAColors(patch_features(direct[8], (3, 4))[0])
    np.testing.assert_allclose(pictures["features"].axes[2].images[0].get_array(),
                               colours(patch_features(direct[2], (3, 4))[0]), atol=1e-6)


def test_command_draws_the_patches_a_direct_call_keeps(tmp_path, lookwhere_folder):
    photo = saved_photo(tmp_path / "photo.png")
    paths = visualize_main([lookwhere_folder, photo, "--k-ratio", "0.25", "--resolution", "32",
                            "--output", str(tmp_path / "out.png")])
    assert set(paths) == {"features", "kept"} and paths["kept"] == str(tmp_path / "out-kept.png")
    model = LookWhereModel.from_pretrained(lookwhere_folder).eval()
    pixel_values = to_pixel_values(Image.open(photo), 32, patch_size=4)[None]
    with torch.inference_mode():
        kept = model(pixel_values, k_ratio=0.25).selected_indices[0]
    grid = (pixel_values.shape[-2] // 4, pixel_values.shape[-1] // 4)  # 8 x 12
    figure = model_pictures(model, Image.open(photo), [{"k_ratio": 0.25}], resolution=32)["kept"]
    corners = sorted(p.get_xy() for p in figure.axes[1].patches if isinstance(p, Rectangle))
    expected = sorted((float(i % grid[1] * 4), float(i // grid[1] * 4)) for i in kept.tolist())
    assert len(kept) == 24 and corners == expected  # 25% of the 8 x 12 patches, where the model put them


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--num-cores", "9"], "num_cores"),  # the model's own range check: a bank of 8
        (["--k-ratio", "0.1"], "--k-ratio does not apply to a veca model; use --num-cores"),
        (["--resolution", "0"], "--resolution must be a positive number of pixels"),
        (["--output", "{tmp}/out.txt"], "give a .png, .jpg, .pdf or .svg"),
        (["--output", "{tmp}/nowhere/out.png"], "its folder does not exist"),
        (["--image", "{tmp}/missing.png"], "missing.png"),
    ],
)
def test_command_bad_input_is_one_line_and_keeps_what_was_there(tmp_path, veca_folder, capsys, arguments, message):
    photo = saved_photo(tmp_path / "photo.png")
    (tmp_path / "earlier.png").write_bytes(b"the user's earlier picture")
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    if arguments[0] == "--image":
        photo, arguments = arguments[1], []
    if "--output" not in arguments:
        arguments += ["--output", str(tmp_path / "out.png")]
    assert visualize_cli([veca_folder, photo, *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1, error
    assert (tmp_path / "earlier.png").read_bytes() == b"the user's earlier picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.png", "models", "photo.png"]  # no temp


def test_command_help_and_missing_matplotlib(tmp_path):
    command = [sys.executable, "-m", "corevision_hf.visualize"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--num-cores" in done.stdout and "--k-ratio" in done.stdout
    # without matplotlib: one line that says how to install it, exit 2
    script = ("import runpy, sys\nsys.modules['matplotlib'] = None\nsys.argv = ['visualize', 'model', 'photo.png', "
              "'--output', 'out.png']\nrunpy.run_module('corevision_hf.visualize', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "pip install matplotlib" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
