"""The sparse-digits task (evaluation/sparse_digits.py): seeded, indexable, disjoint pools, labels and ink maps that
match the pixels."""

import shutil

import numpy as np
import pytest
from conftest import save_extra_photos

from evaluation.sparse_digits import (
    INK_LEVEL,
    _resized,
    cell_shares,
    draw_digit,
    make_canvases,
    mnist_digits,
    photo_background,
    photo_paths,
    photo_pool_digest,
    pool_indices,
)


def test_canvases_depend_only_on_their_index_and_arguments():
    canvases = make_canvases(6, split="test")
    again = make_canvases(6, split="test")
    tail = make_canvases(3, split="test", start=3)
    prefix = make_canvases(4, split="test")
    other_seed = make_canvases(6, split="test", seed=1)
    for field in ("images", "labels", "label_ink", "digit_ink", "ink", "layout"):
        assert np.array_equal(getattr(again, field), getattr(canvases, field)), field
        assert np.array_equal(getattr(tail, field), getattr(canvases, field)[3:]), field
        assert np.array_equal(getattr(prefix, field), getattr(canvases, field)[:4]), field
    assert not np.array_equal(other_seed.images, canvases.images)
    assert not np.array_equal(other_seed.layout, canvases.layout)


def test_train_and_test_pools_are_disjoint():
    images, labels = mnist_digits()
    train, test = pool_indices("train"), pool_indices("test")
    assert len(train) == 4000 and len(test) == 1000 and not np.intersect1d(train, test).size
    assert np.bincount(labels[test]).tolist() == [100] * 10
    train_bytes = {image.tobytes() for image in images[train]}
    assert not any(image.tobytes() in train_bytes for image in images[test])  # no digit image in both, by content
    rows = make_canvases(8, split="test").layout[..., 3]
    assert np.isin(rows, test).all()
    assert np.isin(make_canvases(8, split="train").layout[..., 3], train).all()


def test_draw_digit_and_cell_shares_by_hand():
    digit = np.zeros((28, 28), dtype=np.uint8)
    digit[0, 0] = digit[27, 27] = 255
    digit[5, 3] = INK_LEVEL - 1  # a faint rim pixel: drawn, but not ink
    grey = np.zeros((56, 56), dtype=np.uint8)
    mask = draw_digit(grey, digit, 10, 20)
    assert grey[10, 20] == grey[37, 47] == 255 and grey[15, 23] == INK_LEVEL - 1 and grey.astype(int).sum() == 573
    expected = np.zeros((4, 4), dtype=np.float32)
    expected[0, 1] = expected[2, 3] = 1 / 196  # (10, 20) is in cell (0, 1), (37, 47) in cell (2, 3)
    assert np.array_equal(cell_shares(mask, 14), expected)


def test_majority_label_and_ink_maps_match_the_pixels():
    canvases = make_canvases(12, variant="majority", split="test", seed=3)
    images, labels = mnist_digits()
    for image, label, layout, label_ink, digit_ink, ink in zip(canvases.images, canvases.labels, canvases.layout,
                                                               canvases.label_ink, canvases.digit_ink, canvases.ink):
        classes = labels[layout[:, 3]]  # from the MNIST rows, not the layout's own class column
        assert np.array_equal(classes, layout[:, 0])
        assert (classes == label).sum() == 3 and len(set(classes[classes != label])) == 2
        # each digit is on the canvas as drawn (no scribble or other digit over its box); its ink, read off the image,
        # is the label_ink / digit_ink cells
        label_mask, digit_mask = np.zeros((2, 518, 518), dtype=bool)
        for k, (_, y, x, row) in enumerate(layout):
            box = image[y : y + 28, x : x + 28, 0]
            assert np.array_equal(box, images[row])
            digit_mask[y : y + 28, x : x + 28] |= box >= INK_LEVEL
            label_mask[y : y + 28, x : x + 28] |= (box >= INK_LEVEL) & (k < 3)
        assert np.array_equal(label_ink, cell_shares(label_mask, 14))
        assert np.array_equal(digit_ink, cell_shares(digit_mask, 14))
        assert np.array_equal(ink, cell_shares(image[..., 0] >= INK_LEVEL, 14))
        assert (ink >= digit_ink).all() and (digit_ink >= label_ink).all() and (digit_ink > label_ink).any()
        assert (ink > digit_ink).sum() > 20  # the scribbles


def test_single_variant_has_one_digit_of_the_label():
    canvases = make_canvases(10, variant="single", split="train", digit_size=42, strokes=10)
    assert canvases.layout.shape == (10, 1, 4)
    assert np.array_equal(mnist_digits()[1][canvases.layout[:, 0, 3]], canvases.labels)
    assert np.array_equal(canvases.label_ink, canvases.digit_ink)
    image, (_, y, x, row) = canvases.images[0], canvases.layout[0, 0]
    assert np.array_equal(image[y : y + 42, x : x + 42, 0], _resized(mnist_digits()[0][row], 42))


def test_photo_background_is_under_the_black_canvas():
    black = make_canvases(3, split="test", background="black", start=2)
    photo = make_canvases(3, split="test", background="photo", start=2)
    for i in range(3):
        background = photo_background(0, "test", "majority", 28, 518, 2 + i)
        assert np.array_equal(photo.images[i], np.maximum(background, black.images[i]))
    assert not np.array_equal(photo.images, black.images)
    for field in ("labels", "label_ink", "digit_ink", "ink", "layout"):
        assert np.array_equal(getattr(photo, field), getattr(black, field)), field


@pytest.mark.parametrize("arguments, match", [
    (dict(n=-1), "n must be"),
    (dict(n=2, variant="triple"), "variant must be one of"),
    (dict(n=2, split="val"), "split must be one of"),
    (dict(n=2, background="white"), "background must be one of"),
    (dict(n=2, digit_size=0), "digit_size must be"),
    (dict(n=2, digit_size=100), "digit_size must be"),
    (dict(n=2, start=-3), "start must be"),
    (dict(n=2, strokes=-1), "strokes must be"),
    (dict(n=2, canvas_size=500), "multiple of cell"),
])
def test_bad_arguments_are_one_value_error(arguments, match):
    with pytest.raises(ValueError, match=match):
        make_canvases(**arguments)


def test_photo_pools_are_disjoint_and_a_photos_pool_is_its_name_s_alone(tmp_path):
    """The shipped pools as before, and of --extra-photos each photo in one pool by its name's hash: none in both, none
    lost, and a photo's pool does not move when other photos come or go. A photo canvas's background is a crop of its
    own split's pool, and the pool's digest changes with any photo's bytes."""
    paths = save_extra_photos(tmp_path / "extra")
    train, test = photo_paths("train", tmp_path / "extra"), photo_paths("test", tmp_path / "extra")
    assert not set(train) & set(test) and set(paths) <= set(train) | set(test)
    assert [p.name for p in paths if p in test] == ["extra-1.jpg", "extra-3.jpg"]
    assert set(photo_paths("train")) < set(train) and set(photo_paths("test")) < set(test)
    assert not any("heldout" in str(path) for path in train + test)
    (tmp_path / "fewer").mkdir()
    shutil.copyfile(paths[3], tmp_path / "fewer" / paths[3].name)
    assert [p.name for p in photo_paths("test", tmp_path / "fewer")][-1] == "extra-3.jpg"
    photo = make_canvases(4, split="test", background="photo", extra_photos=tmp_path / "extra")
    black = make_canvases(4, split="test")
    for i in range(4):
        background = photo_background(0, "test", "majority", 28, 518, i, tmp_path / "extra")
        assert np.array_equal(photo.images[i], np.maximum(background, black.images[i]))
    before = photo_pool_digest("test", tmp_path / "extra")
    paths[1].write_bytes(paths[0].read_bytes())
    assert photo_pool_digest("test", tmp_path / "extra") != before
    assert photo_pool_digest("train", tmp_path / "extra") == photo_pool_digest("train", tmp_path / "extra")
    with pytest.raises(ValueError, match="gcompris_photos"):
        make_canvases(1, background="photo", extra_photos=tmp_path / "nowhere")
