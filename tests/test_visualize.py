"""corevision_hf.visualize: what each picture draws is checked on the figure's own artists, not only that it saves."""

import numpy as np
import pytest
import torch
from matplotlib.patches import Rectangle

from corevision_hf.visualize import (
    PCAColors,
    figure_to_image,
    patch_features,
    plot_cores,
    plot_evaluation,
    plot_feature_pca,
    plot_kept_patches,
)


PHOTO = np.random.default_rng(0).random((64, 96, 3))  # H=64, W=96: not square, so x and y cannot be swapped


def test_patch_features_are_the_last_tokens_on_the_grid():
    tokens = torch.arange(2 * (3 + 6) * 4, dtype=torch.float32).reshape(2, 9, 4)  # 3 prefix tokens, a 2 x 3 grid
    grid = patch_features(tokens, (2, 3))
    assert grid.shape == (2, 2, 3, 4)
    torch.testing.assert_close(grid[1, 1, 0], tokens[1, 3 + 3])  # row 1, column 0 = patch 3


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
