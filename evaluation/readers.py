"""The two frozen-feature readers of the task benchmarks, each with its weight decay chosen on validation examples:
the linear probe on a pooled vector (evaluation.probes) and the attentive probe on a token set
(evaluation.attentive_probe). Both fit one reader per decay on the training examples but the last `val`, keep the
decay of the best accuracy on those `val` (ties: the first listed), and predict the test examples with it."""

import torch

from evaluation.attentive_probe import fit_attentive_classifier, predict_tokens
from evaluation.probes import fit_linear_classifier


def probe(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor, val: int,
          decays: list[float]) -> dict:
    """The linear probe on frozen features: one head per weight decay, fitted on the training canvases but the last
    `val` (features centred and divided by one scale for all: per-feature scaling enlarges the weights of
    near-constant features, which a backbone's fine-tuning then swings), the decay of the best accuracy on those `val`
    canvases (ties: the first listed). That head is the line's, and the start of its fine-tuning, which picks its epoch
    on the same canvases. Returns the decay, the validation accuracies, the test predictions and the head."""
    fit, held = slice(0, len(train_labels) - val), slice(len(train_labels) - val, None)
    heads = {decay: fit_linear_classifier(train_features[fit], train_labels[fit], 10, weight_decay=decay,
                                          per_feature=False) for decay in decays}
    scores = {decay: float((head(train_features[held]).argmax(-1) == train_labels[held]).float().mean())
              for decay, head in heads.items()}
    decay = max(decays, key=lambda d: (scores[d], -decays.index(d)))
    return {"weight_decay": decay, "val_accuracy": scores, "predictions": heads[decay](test_features).argmax(-1),
            "head": heads[decay]}


def attentive_probe(train_tokens: torch.Tensor, train_labels: torch.Tensor, test_tokens: torch.Tensor, val: int,
                    decays: list[float], seed: int) -> dict:
    """The attentive probe (evaluation.attentive_probe) on frozen tokens (N, T, D), by the linear probe's rule: one
    fit per weight decay on the training canvases but the last `val`, the decay of the best accuracy on those (ties:
    the first listed). Returns the decay, the validation accuracies and the test predictions."""
    fit, held = slice(0, len(train_labels) - val), slice(len(train_labels) - val, None)
    probes = {decay: fit_attentive_classifier(train_tokens[fit], train_labels[fit], 10, weight_decay=decay, seed=seed)
              for decay in decays}
    scores = {decay: float((predict_tokens(p, train_tokens[held]) == train_labels[held]).float().mean())
              for decay, p in probes.items()}
    decay = max(decays, key=lambda d: (scores[d], -decays.index(d)))
    return {"weight_decay": decay, "val_accuracy": scores, "predictions": predict_tokens(probes[decay], test_tokens)}
