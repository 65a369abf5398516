"""The packaged `evaluate` metrics: hand-computed values, add_batch, offline loading by path (no network)."""

import math

import evaluate
import numpy as np
import pytest
from evaluate.loading import get_imports

from corevision_hf.metrics import ACCURACY, MEAN_IOU, load_metric

pytestmark = pytest.mark.usefixtures("offline_evaluate")


# Two images of different sizes, 4 classes; class 3 is in neither prediction nor reference.
# Without the two 255 pixels the counted (prediction, reference) pairs are
# (0,0) (1,0) (1,1) (1,1) (2,2) | (2,2) (0,2) (0,0), so per class:
#   class 0: intersection 2, prediction 3, reference 3 -> IoU 2/4, accuracy 2/3
#   class 1: intersection 2, prediction 3, reference 2 -> IoU 2/3, accuracy 2/2
#   class 2: intersection 2, prediction 2, reference 3 -> IoU 2/3, accuracy 2/3
# int32, as int64 maps make datasets' Image feature warn that it downcasts them.
PREDICTIONS = [np.array([[0, 1, 1], [1, 2, 0]], dtype=np.int32), np.array([[2, 0], [0, 1]], dtype=np.int32)]
REFERENCES = [np.array([[0, 0, 1], [1, 2, 255]], dtype=np.int32), np.array([[2, 2], [0, 255]], dtype=np.int32)]


def assert_results_equal(results: dict, expected: dict):
    assert results.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(results[name], value, rtol=1e-12, err_msg=name)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, 3 / 6),
        ({"normalize": False}, 3.0),
        ({"sample_weight": [0.5, 2, 0.7, 0.5, 9, 0.4]}, (0.5 + 2 + 9) / 13.1),
        ({"sample_weight": [0.5, 2, 0.7, 0.5, 9, 0.4], "normalize": False}, 0.5 + 2 + 9),
    ],
)
def test_accuracy_matches_hand_count(kwargs, expected):
    accuracy = evaluate.load(ACCURACY)
    results = accuracy.compute(predictions=[0, 1, 1, 2, 1, 0], references=[0, 1, 2, 0, 1, 2], **kwargs)
    assert results == {"accuracy": pytest.approx(expected, rel=1e-12)}
    assert isinstance(results["accuracy"], float)


def test_mean_iou_matches_hand_count_with_ignored_label_and_absent_class():
    mean_iou = evaluate.load(MEAN_IOU)
    results = mean_iou.compute(predictions=PREDICTIONS, references=REFERENCES, num_labels=4, ignore_index=255)
    assert_results_equal(
        results,
        {
            "mean_iou": (2 / 4 + 2 / 3 + 2 / 3) / 3,  # nanmean: the absent class 3 does not count
            "mean_accuracy": (2 / 3 + 1 + 2 / 3) / 3,
            "overall_accuracy": 6 / 8,
            "per_category_iou": [2 / 4, 2 / 3, 2 / 3, math.nan],
            "per_category_accuracy": [2 / 3, 1, 2 / 3, math.nan],
        },
    )


@pytest.mark.filterwarnings("ignore:Downcasting array dtype int64 to int32:UserWarning")
def test_mean_iou_matches_the_hub_metric_on_its_own_example():
    """The example and results published with `evaluate-metric/mean_iou` (labels 0-9, some pixels 255)."""
    predictions = [
        np.array([[1, 2], [3, 4], [5, 255]]),
        np.array([[2, 7], [9, 2], [3, 6]]),
        np.array([[2, 2, 3], [8, 2, 4], [3, 255, 2]]),
    ]
    references = [
        np.array([[0, 3], [5, 4], [6, 255]]),
        np.array([[1, 7], [9, 2], [3, 6]]),
        np.array([[1, 2, 2], [8, 2, 1], [3, 255, 1]]),
    ]
    results = load_metric("mean_iou").compute(
        predictions=predictions, references=references, num_labels=10, ignore_index=255, reduce_labels=False
    )
    assert_results_equal(
        results,
        {
            "mean_iou": 0.47750000000000004,
            "mean_accuracy": 0.5916666666666666,
            "overall_accuracy": 0.5263157894736842,
            "per_category_iou": [0.0, 0.0, 0.375, 0.4, 0.5, 0.0, 0.5, 1.0, 1.0, 1.0],
            "per_category_accuracy": [0.0, 0.0, 0.75, 2 / 3, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0],
        },
    )


def test_mean_iou_nan_to_num_replaces_nan_after_averaging():
    results = load_metric("mean_iou").compute(
        predictions=PREDICTIONS, references=REFERENCES, num_labels=4, ignore_index=255, nan_to_num=-1
    )
    assert results["per_category_iou"][3] == -1
    assert results["per_category_accuracy"][3] == -1
    assert results["mean_iou"] == pytest.approx((2 / 4 + 2 / 3 + 2 / 3) / 3)


def test_mean_iou_label_map_and_reduce_labels_rewrite_references():
    mean_iou = load_metric("mean_iou")
    shifted = [np.where(reference == 255, 255, reference + 1) for reference in REFERENCES]
    expected = mean_iou.compute(predictions=PREDICTIONS, references=REFERENCES, num_labels=4, ignore_index=255)
    # reduce_labels: reference 0 (background) is ignored and every other reference label moves down by one.
    background = [np.zeros_like(reference) for reference in REFERENCES]
    reduced = mean_iou.compute(
        predictions=PREDICTIONS + PREDICTIONS,
        references=shifted + background,
        num_labels=4,
        ignore_index=255,
        reduce_labels=True,
    )
    assert_results_equal(reduced, expected)
    mapped = mean_iou.compute(
        predictions=PREDICTIONS,
        references=shifted,
        num_labels=4,
        ignore_index=255,
        label_map={1: 0, 2: 1, 3: 2},
    )
    assert_results_equal(mapped, expected)


@pytest.mark.parametrize(
    "name, predictions, references, kwargs",
    [
        ("accuracy", [0, 1, 1, 2, 1, 0], [0, 1, 2, 0, 1, 2], {"sample_weight": [0.5, 2, 0.7, 0.5, 9, 0.4]}),
        ("mean_iou", PREDICTIONS, REFERENCES, {"num_labels": 4, "ignore_index": 255}),
    ],
)
def test_add_batch_over_two_batches_equals_one_compute(name, predictions, references, kwargs):
    metric = load_metric(name)
    expected = metric.compute(predictions=predictions, references=references, **kwargs)
    half = len(predictions) // 2
    metric.add_batch(predictions=predictions[:half], references=references[:half])
    metric.add_batch(predictions=predictions[half:], references=references[half:])
    assert_results_equal(metric.compute(**kwargs), expected)


def test_load_by_path_works_offline_and_copies_only_into_the_modules_cache(offline_evaluate):
    for name, path in [("accuracy", ACCURACY), ("mean_iou", MEAN_IOU)]:
        assert isinstance(evaluate.load(path), evaluate.Metric)
        # evaluate imports a copy of the script from HF_MODULES_CACHE, not the file in the package.
        assert list((offline_evaluate / "modules" / "evaluate_modules" / "metrics" / name).glob(f"*/{name}.py"))


@pytest.mark.parametrize("path", [ACCURACY, MEAN_IOU])
def test_metric_scripts_import_only_evaluate_datasets_numpy(path):
    """The script runs from a copy in evaluate's modules cache, so it cannot import our package or siblings."""
    assert sorted(name for _, name, _, _ in get_imports(path)) == ["datasets", "evaluate", "numpy"]


def test_load_metric_rejects_an_unknown_name():
    with pytest.raises(ValueError, match=r"Unknown metric 'f1'.*\['accuracy', 'mean_iou'\].*evaluate\.load"):
        load_metric("f1")


def test_accuracy_rejects_sample_weight_of_the_wrong_length():
    with pytest.raises(ValueError, match="sample_weight has shape .* 3 examples; pass one weight per example"):
        load_metric("accuracy").compute(predictions=[0, 1, 1], references=[0, 1, 0], sample_weight=[1.0, 2.0])


def test_mean_iou_rejects_a_prediction_of_another_shape():
    with pytest.raises(ValueError, match=r"shape \(2, 2\) has a reference of shape \(2, 3\).*resize the logits"):
        load_metric("mean_iou").compute(
            predictions=[np.zeros((2, 2), dtype=np.int32)],
            references=[np.zeros((2, 3), dtype=np.int32)],
            num_labels=2,
            ignore_index=255,
        )
