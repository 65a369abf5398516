"""evaluation/teacher_free.py: retrieval and correspondence scores checked by hand, and the known geometry of a
correspondence pair checked against the pixels themselves."""

import numpy as np
import pytest
import torch
from PIL import Image

from corevision_hf.images import to_display
from evaluation import teacher_free as tf


def test_retrieval_top1_and_average_precision_by_hand():
    features = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]])
    labels = torch.tensor([0, 1, 0, 1])
    # query 0 ranks 1 (0.8), 2 (0.6), 3 (0): its relevant view 2 comes second -> top-1 0, AP 1/2
    # query 1 ranks 2 (0.96), 0 (0.8), 3 (0.6): relevant 3 third -> top-1 0, AP 1/3
    # query 2 ranks 1 (0.96), 3 (0.8), 0 (0.6): relevant 0 third -> top-1 0, AP 1/3
    # query 3 ranks 2 (0.8), 1 (0.6), 0 (0): relevant 1 second -> top-1 0, AP 1/2
    found = tf.retrieval(features, labels)
    assert found["top1"].tolist() == [0, 0, 0, 0]
    assert found["ap"].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 3, 1 / 2])
    separated = tf.retrieval(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), torch.tensor([0, 0, 1, 1]))
    assert separated["top1"].tolist() == [1, 1, 1, 1] and separated["ap"].tolist() == [1, 1, 1, 1]


def test_average_precision_over_two_relevant_views():
    # query 0 of label 0 ranks: label 0 (hit at 1), label 1, label 0 (hit at 3): AP = (1/1 + 2/3) / 2
    features = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.5, 0.5, 0.0], [0.1, 0.9, 0.0]])
    found = tf.retrieval(features, torch.tensor([0, 0, 1, 0]))
    assert found["ap"][0].item() == pytest.approx((1 + 2 / 3) / 2)


def test_correspondence_accuracy_by_hand():
    torch.manual_seed(0)
    patches = torch.randn(1, 16, 8)  # a 4 x 4 grid
    identity = torch.arange(16)[None]
    assert tf.correspondence_accuracy(patches, patches, identity).tolist() == [1.0]
    shifted = (identity % 4 + 2).clamp(max=3) + identity // 4 * 4  # the true cell 2 columns to the right (clamped)
    accuracy = tf.correspondence_accuracy(patches, patches, shifted).item()
    assert accuracy == pytest.approx(8 / 16)  # right in columns 2 and 3 only (true cell 3: one away, or itself)
    one_off = (identity % 4 + 1).clamp(max=3) + identity // 4 * 4
    assert tf.correspondence_accuracy(patches, patches, one_off).item() == 1.0  # within one cell counts


def test_each_patch_of_view_b_lies_where_the_pair_says():
    # colour encodes position: red grows left to right, green top to bottom, so a patch's mean colour says where in
    # the photo its centre came from
    width, height = 600, 400
    x, y = np.meshgrid((np.arange(width) + 0.5) / width * 255, (np.arange(height) + 0.5) / height * 255)
    image = Image.fromarray(np.stack([x, y, np.full_like(x, 128)], -1).round().astype(np.uint8))
    size, patch = 112, 14
    grid = size // patch
    flips = set()
    for seed in range(8):
        view_a, view_b, true = tf.correspondence_pair(image, size, patch, seed)
        colour = torch.from_numpy(to_display(view_b)).permute(2, 0, 1)[None].double()
        u, v = torch.nn.functional.avg_pool2d(colour, patch)[0, :2].flatten(1)  # where each centre lies, 0..1
        assert (u - (true % grid + 0.5) / grid).abs().max() <= 0.5 / grid + 0.01  # inside the true cell of A
        assert (v - (true // grid + 0.5) / grid).abs().max() <= 0.5 / grid + 0.01
        flips.add(bool(u[0] > u[grid - 1]))  # red falls from left to right: B was flipped
        assert view_a.shape == view_b.shape == (3, size, size)
    assert flips == {True, False}  # both a flipped and an unflipped pair were checked


def test_views_and_pixel_features_have_the_documented_shapes():
    image = Image.new("RGB", (300, 200), (10, 200, 30))
    views = tf.augmented_views(image, 8, 56, seed=3)
    assert views.shape == (8, 3, 56, 56)
    assert torch.equal(views, tf.augmented_views(image, 8, 56, seed=3))  # a function of the seed
    assert tf.pixel_features(views).shape == (8, 3 * 16 * 16)
    assert tf.pixel_patches(views, 14).shape == (8, 16, 3 * 14 * 14)
