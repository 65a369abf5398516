"""The card (README.md) of each model folder `training.finetune` writes, and the line that says what its --recipe
set."""


def recipe_summary(args) -> str | None:
    """What --recipe set, as flags, and the recipe's flags the command line changed; None without --recipe."""
    from .recipes import load_recipe

    if args.recipe is None:
        return None
    values = {name: value for name, value in load_recipe(args.recipe).items() if name != "script" and value is not None}

    def flag(name: str, value) -> str:
        return f"--{name.replace('_', '-')} {value}"

    kept = [flag(name, value) for name, value in values.items() if getattr(args, name) == value]
    changed = [flag(name, getattr(args, name)) for name, value in values.items() if getattr(args, name) != value]
    summary = f"--recipe {args.recipe} (training/recipes/{args.recipe}.yaml): {' '.join(kept)}"
    return summary + (f"; changed on the command line: {' '.join(changed)}" if changed else "")


def card(args, command: str, augmented: str, classes: list[str], model_type: str, epoch: int, validation: dict,
         heldout: dict | None, probe_penalty: float, wise_ft: float | None = None) -> str:
    """The README.md of an exported model folder: what it classifies, how it was fine-tuned (the `command`, the recipe
    and the `augmented` line) and how well (on the validation split and, for the folder --eval-data scored, the
    held-out data)."""
    heldout_line = "- held-out accuracy: " + (f"see {args.evaluate or 'best'}/" if args.eval_data else
                                              "none (no --eval-data)")
    split = f"whole groups by --val-groups `{args.val_groups}`" if args.val_groups else "per class"
    source = f"of {args.val_data}" if args.val_data else f"carved from {args.data} ({split})"
    weights = f"epoch {epoch} (0: the probe alone)"
    if wise_ft is not None:
        weights = f"epoch {epoch}'s mixed with the probe's, {1 - wise_ft:g} probe + {wise_ft:g} fine-tuned (WiSE-FT)"
    if heldout:
        heldout_line = (f"- held-out accuracy ({args.eval_data}, {heldout['images']} images): "
                        f"**{heldout['accuracy']:.4f}**")
    recipe = recipe_summary(args)
    mixed = f"; then the weights mixed with the probe at {args.wise_ft} (WiSE-FT)"
    mixed = "" if args.wise_ft in (None, "none") else mixed
    views = f" and {args.probe_views} augmented views of each" if args.probe_views else ""
    chosen = [f"- kept by --choose paired: {validation['chosen_by']} (OUT/choice.json)"] if (
        "chosen_by" in validation) else []
    return "\n".join([
        f"# {model_type} image classifier fine-tuned from {args.checkpoint}", "",
        f"Classes: {', '.join(classes)}. Images resized to {args.image_size} x {args.image_size} (the saved "
        "processor does the same).", "",
        "## Recipe (LP-FT)", "",
        *([f"Preset: `{recipe}`.", ""] if recipe else []),
        f"1. linear probe on the frozen features of the training images{views} (L-BFGS logistic regression, L2 "
        f"penalty {probe_penalty:g}, folded into the head);",
        f"2. fine-tuning of the backbone and the head for {args.epochs} epochs: AdamW, lr {args.lr}, layer decay "
        f"{args.layer_decay}, weight decay {args.weight_decay}, batch {args.batch_size}, budget per step "
        f"{(args.num_cores or 'config.training_budgets') if model_type == 'veca' else args.k_ratio}; LookWhere's "
        f"selector frozen{mixed}.", "",
        f"Augmentations of the training images: {augmented}.", "",
        f"Command: `{command}`", "",
        "## Accuracy", "",
        f"- these weights: {weights}; validation accuracy on {validation['images']} images "
        f"{source}: {validation['accuracy']:.4f}",
        *chosen,
        heldout_line, "",
        "```python",
        "from transformers import AutoModelForImageClassification",
        "model = AutoModelForImageClassification.from_pretrained(FOLDER, trust_remote_code=True)",
        "```", "",
    ])
