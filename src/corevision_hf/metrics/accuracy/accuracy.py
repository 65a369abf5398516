"""Accuracy: the fraction of predictions equal to their reference (the hub's `evaluate-metric/accuracy`, numpy only)."""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = """
Accuracy is the proportion of correct predictions among the examples: (TP + TN) / (TP + TN + FP + FN).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[int]`): Predicted labels.
    references (`list[int]`): Ground-truth labels.
    normalize (`bool`, defaults to `True`): If `False`, return the (weighted) number of correct examples
        instead of their fraction.
    sample_weight (`list[float]`, *optional*): One weight per example.

Returns:
    accuracy (`float`): In [0, 1], or the (weighted) count of correct examples when `normalize=False`.

Example:
    >>> accuracy = evaluate.load(corevision_hf.metrics.ACCURACY)
    >>> accuracy.compute(predictions=[0, 1, 1, 2, 1, 0], references=[0, 1, 2, 0, 1, 2])
    {'accuracy': 0.5}
"""

_CITATION = """
@article{scikit-learn,
  title={Scikit-learn: Machine Learning in {P}ython},
  author={Pedregosa, F. and Varoquaux, G. and Gramfort, A. and Michel, V. and Thirion, B. and Grisel, O. and
          Blondel, M. and Prettenhofer, P. and Weiss, R. and Dubourg, V. and Vanderplas, J. and Passos, A. and
          Cournapeau, D. and Brucher, M. and Perrot, M. and Duchesnay, E.},
  journal={Journal of Machine Learning Research},
  volume={12},
  pages={2825--2830},
  year={2011}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
            reference_urls=["https://huggingface.co/spaces/evaluate-metric/accuracy"],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = np.asarray(predictions) == np.asarray(references)
        if sample_weight is None:
            sample_weight = np.ones(len(correct))
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        if sample_weight.shape != correct.shape:
            raise ValueError(
                f"sample_weight has shape {sample_weight.shape} but there are {len(correct)} examples; "
                "pass one weight per example."
            )
        score = np.dot(correct, sample_weight)
        if normalize:
            score = score / sample_weight.sum()
        return {"accuracy": float(score)}
