"""`evaluate` metrics that ship with the package, so they load offline by path.

    >>> import evaluate
    >>> from corevision_hf.metrics import MEAN_IOU
    >>> mean_iou = evaluate.load(MEAN_IOU)  # same inputs and results as evaluate.load("mean_iou")
"""

import os

import evaluate


_HERE = os.path.dirname(os.path.abspath(__file__))

ACCURACY = os.path.join(_HERE, "accuracy", "accuracy.py")
MEAN_IOU = os.path.join(_HERE, "mean_iou", "mean_iou.py")

_METRICS = {"accuracy": ACCURACY, "mean_iou": MEAN_IOU}


def load_metric(name: str, **kwargs) -> evaluate.EvaluationModule:
    """Loads a packaged metric without the hub.

    Args:
        name: "accuracy" or "mean_iou".
        **kwargs: passed to `evaluate.load` (e.g. `cache_dir`, `keep_in_memory`, `num_process`, `process_id`).

    Returns:
        The `evaluate.EvaluationModule`, with the hub metric's inputs and results.
    """
    if name not in _METRICS:
        raise ValueError(
            f"Unknown metric {name!r}: corevision_hf.metrics ships {sorted(_METRICS)}. "
            "For any other metric call evaluate.load(...) directly (it downloads from the hub)."
        )
    return evaluate.load(_METRICS[name], **kwargs)
