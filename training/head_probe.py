"""Stage 1 of LP-FT (`training.finetune`, and the Trainer's way in docs/fine-tuning.md): the linear probe on the
frozen features the head reads, a logistic regression on standardised features (evaluation.probes), folded into the
model's head."""


def to_device(batch: dict, device) -> dict:
    """The batch's tensors on `device` (a budget or other plain value as it is)."""
    import torch

    return {name: value.to(device) if torch.is_tensor(value) else value for name, value in batch.items()}


def head_features(model, batches, budget: dict, device, desc: str = "features", view=None) -> tuple:
    """(the classifier's inputs (N, D), labels (N,)) over `batches` (dicts of the model's inputs with "labels") at
    `budget`: the frozen features the head reads; with `view`, of view(index, inputs) -> (inputs, budget) of each
    batch instead (an augmented view). Prints a progress line about every tenth of the batches."""
    import torch

    captured = []
    hook = model.classifier.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    labels = []
    model.eval()
    total = len(batches)
    with torch.no_grad():
        for index, batch in enumerate(batches, start=1):
            inputs = to_device(batch, device)
            labels.append(inputs.pop("labels").cpu())
            inputs, called = view(index - 1, inputs) if view else (inputs, budget)
            model(**inputs, **called)
            if index == total or index % max(1, total // 10) == 0:
                print(f"{desc}: {sum(map(len, labels))} images read ({index}/{total} batches)", flush=True)
    hook.remove()
    return torch.cat(captured).float().cpu(), torch.cat(labels)


def fit_head(model, batches, budget: dict, device="cpu", weight_decay: float = 1e-2) -> None:
    """Stage 1: the linear probe (logistic regression on standardised features) on the frozen features of `batches`
    (dicts of the model's inputs with "labels", such as a Trainer's collate gives) at `budget`, folded into
    `model.classifier`. A head trained by gradient steps from random fails here: the features carry a few large
    constant components that swamp the steps; the probe centres them. One scale for all features (not one each), so
    that no weight is enlarged for a feature that barely varies, which fine-tuning would then swing."""
    from evaluation.probes import fit_linear_classifier

    features, labels = head_features(model, batches, budget, device, "linear probe, training features")
    fold_probe(model, fit_linear_classifier(features, labels, model.config.num_labels, weight_decay,
                                            per_feature=False))


def choose_probe(model, features, labels, held, held_labels, penalties: list[float]) -> dict:
    """The linear probe for each L2 penalty of `penalties` on the training `features` (N, D) and `labels`; keeps
    (folds into the head) the one of the best accuracy on the validation features `held` and `held_labels` (ties: the
    lower validation loss, then the larger penalty). Returns {"weight_decay", "validation": {penalty: accuracy}}."""
    import torch.nn.functional as F

    from evaluation.probes import fit_linear_classifier

    scores, probes = {}, {}
    for penalty in penalties:
        probes[penalty] = fit_linear_classifier(features, labels, model.config.num_labels, penalty, per_feature=False)
        logits = probes[penalty](held)
        accuracy = (logits.argmax(-1) == held_labels).float().mean().item()
        scores[penalty] = (accuracy, -F.cross_entropy(logits, held_labels).item(), penalty)
    chosen = max(penalties, key=scores.__getitem__)
    fold_probe(model, probes[chosen])
    return {"weight_decay": chosen, "validation": {penalty: score[0] for penalty, score in scores.items()}}


def fold_probe(model, probe) -> None:
    """Writes evaluation.probes' (Standardize, Linear) `probe` into `model.classifier`:
    W (x - mean) / std + b = (W / std) x + (b - (W / std) mean)."""
    import torch

    standardize, linear = probe
    weight = linear.weight / standardize.std
    with torch.no_grad():
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(linear.bias - weight @ standardize.mean)
