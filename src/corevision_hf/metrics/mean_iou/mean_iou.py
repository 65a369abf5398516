"""Mean IoU of segmentation maps (the hub's `evaluate-metric/mean_iou`, numpy only)."""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = """
IoU is the area of overlap between the predicted and the ground-truth segmentation of a class divided by the area of
their union. Mean IoU averages it over the classes present in the predictions or the references.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[ndarray]`): Predicted label maps, each of shape (height, width); sizes may differ per image.
    references (`list[ndarray]`): Ground-truth label maps, each the shape of its prediction.
    num_labels (`int`): Number of classes; labels outside [0, num_labels) are not counted as any class.
    ignore_index (`int`): Reference label whose pixels are left out (e.g. 255); `None` leaves none out.
    nan_to_num (`int`, *optional*): If given, replaces every nan in the results (applied after the means).
    label_map (`dict[int, int]`, *optional*): Old -> new reference label ids, all mapped from the original labels.
    reduce_labels (`bool`, defaults to `False`): Reference label 0 (background) becomes 255 and every other label
        is reduced by 1 (ADE20k style).

Returns:
    mean_iou (`float`): IoU averaged over the classes, nan (absent from predictions and references) skipped.
    mean_accuracy (`float`): Per-class accuracy averaged the same way.
    overall_accuracy (`float`): Correct pixels over counted reference pixels, over all images.
    per_category_iou (`ndarray` of shape (num_labels,)): nan for a class absent from predictions and references.
    per_category_accuracy (`ndarray` of shape (num_labels,)): nan for a class absent from the references.

Example:
    >>> mean_iou = evaluate.load(corevision_hf.metrics.MEAN_IOU)
    >>> mean_iou.compute(predictions=[np.array([[0, 1], [1, 1]])], references=[np.array([[0, 1], [0, 255]])],
    ...                  num_labels=3, ignore_index=255)["mean_iou"]
    0.5
"""

_CITATION = """
@software{MMSegmentation_Contributors_OpenMMLab_Semantic_Segmentation_2020,
author = {{MMSegmentation Contributors}},
license = {Apache-2.0},
month = {7},
title = {{OpenMMLab Semantic Segmentation Toolbox and Benchmark}},
url = {https://github.com/open-mmlab/mmsegmentation},
year = {2020}
}
"""


def intersect_and_union(prediction, reference, num_labels, ignore_index, label_map=None, reduce_labels=False):
    """Per-class pixel counts of one image: (intersection, union, prediction, reference), each (num_labels,)."""
    prediction = np.asarray(prediction)
    reference = np.array(reference)  # a copy: label_map and reduce_labels edit it
    if prediction.shape != reference.shape:
        raise ValueError(
            f"A prediction of shape {prediction.shape} has a reference of shape {reference.shape}; "
            "predict one label per reference pixel (resize the logits to the reference size before the argmax)."
        )
    if label_map is not None:
        original = reference.copy()
        for old_id, new_id in label_map.items():
            reference[original == old_id] = new_id
    if reduce_labels:
        reference[reference == 0] = 255
        reference = reference - 1
        reference[reference == 254] = 255

    counted = reference != ignore_index
    prediction, reference = prediction[counted], reference[counted]

    def area(labels):
        labels = labels[(labels >= 0) & (labels < num_labels)]
        return np.bincount(labels, minlength=num_labels)

    intersection = area(prediction[prediction == reference])
    area_prediction, area_reference = area(prediction), area(reference)
    return intersection, area_prediction + area_reference - intersection, area_prediction, area_reference


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MeanIoU(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            # Image features (as the hub's) store label maps of any size compactly and accept arrays, lists and PIL.
            features=datasets.Features({"predictions": datasets.Image(), "references": datasets.Image()}),
            reference_urls=["https://huggingface.co/spaces/evaluate-metric/mean_iou"],
        )

    def _compute(
        self, predictions, references, num_labels, ignore_index, nan_to_num=None, label_map=None, reduce_labels=False
    ):
        totals = np.zeros((4, num_labels), dtype=np.float64)
        for prediction, reference in zip(predictions, references):
            totals += intersect_and_union(prediction, reference, num_labels, ignore_index, label_map, reduce_labels)
        intersection, union, _, area_reference = totals

        # A class absent from both predictions and references has 0 / 0 = nan IoU by design.
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = intersection / union
            accuracy = intersection / area_reference
            metrics = {
                "mean_iou": float(np.nanmean(iou)),
                "mean_accuracy": float(np.nanmean(accuracy)),
                "overall_accuracy": float(intersection.sum() / area_reference.sum()),
                "per_category_iou": iou,
                "per_category_accuracy": accuracy,
            }
        if nan_to_num is not None:
            metrics = {name: np.nan_to_num(value, nan=nan_to_num) for name, value in metrics.items()}
        return metrics
