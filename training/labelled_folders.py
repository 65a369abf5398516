"""Labelled ImageFolders for `training.finetune` and the commands around it: one sub-folder per class (hidden ones
skipped, none a link, none empty), its images at any depth; the groups of images (the crops of one photo) that a
validation split keeps whole and a paired comparison resamples whole; and the batches a run reads."""

import re

def labelled_files(folder: str, train: bool, flag: str = "--data") -> tuple[list[tuple[str, int]], list[str]]:
    """[(path, label)] of an ImageFolder (label: the index of its class, the sorted sub-folder names) and the class
    names. Hidden folders and files (.ipynb_checkpoints/) are skipped; a class folder that is a link or holds no image
    is an error naming it. A training folder may not hold the held-out photos (training.data.image_files refuses
    them)."""
    from pathlib import Path

    from evaluation.probes import image_files

    from .data import image_files as training_files

    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{flag} {folder} is no folder: give an ImageFolder (one sub-folder per class).")
    classes = class_folders(root, flag)
    files = training_files(root, "", train=True)[0] if train else [str(path) for path in image_files(folder)]
    files = [file for file in files if not any(part.startswith(".") for part in Path(file).relative_to(root).parts)]
    loose = [file for file in files if len(Path(file).relative_to(root).parts) < 2]
    if len(classes) < 2 or loose:
        raise ValueError(f"{root} is no ImageFolder: give one sub-folder per class (at least two) holding its images"
                         f"{f', not images at its top ({Path(loose[0]).name})' if loose else ''}.")
    examples = [(file, classes.index(Path(file).relative_to(root).parts[0])) for file in files]
    found = {label for _, label in examples}
    empty = [name for label, name in enumerate(classes) if label not in found]
    if empty:
        raise ValueError(f"{flag}: the class folder {root / empty[0]} holds no images: add its images or remove it.")
    return examples, classes


def class_folders(root, flag: str) -> list[str]:
    """The sorted names of the class folders of the ImageFolder `root`, hidden ones skipped; a ValueError naming a
    link among them (a run reads no folder through a link)."""
    entries = sorted((path for path in root.iterdir() if not path.name.startswith(".")), key=lambda path: path.name)
    links = [path for path in entries if path.is_symlink()]
    if links:
        raise ValueError(f"{flag}: {links[0]} is a symbolic link, and a run never follows one: put the class folder "
                         "itself there (copy or move it).")
    return [path.name for path in entries if path.is_dir()]


def check_images_open(examples: list, flag: str) -> None:
    """A ValueError naming the first image of `examples` ((path, label)) that cannot be decoded: a broken held-out
    image is found before training, not after the last epoch."""
    from corevision_hf.images import open_image

    print(f"checking that the {len(examples)} images of {flag} open", flush=True)
    for path, _ in examples:
        try:
            open_image(path)
        except (ValueError, OSError) as error:
            raise ValueError(f"{flag}: {error}") from None


def other_folder(folder: str | None, flag: str, classes: list[str], others: dict[str, list], why: str) -> list | None:
    """The (path, label) examples of the ImageFolder `folder` given as `flag` (None when not given): it must have
    `classes` and share no image with the examples of `others` ({flag: examples})."""
    import os

    if folder is None:
        return None
    examples, found = labelled_files(folder, train=False, flag=flag)
    if found != classes:
        raise ValueError(f"{flag} has the classes {found}, --data {classes}: give both the same sub-folders.")
    for other, other_examples in others.items():
        paths = {os.path.realpath(path) for path, _ in other_examples}
        shared = {os.path.realpath(path) for path, _ in examples} & paths
        if shared:
            raise ValueError(f"{flag} shares {len(shared)} images with {other} (e.g. {sorted(shared)[0]}): {why}; give "
                             "a separate folder.")
    return examples


def group_key(path: str, pattern: str) -> str | None:
    """The group of the file at `path`: the first group of `pattern` (or its whole match when it has none) searched
    in the file name without suffix, so that one key may name files in several class folders; None where it does not
    match."""
    from pathlib import Path

    match = re.search(pattern, Path(path).stem)
    return None if match is None else match.group(1) if match.re.groups else match.group(0)


def source_groups(examples: list, pattern: str, flag: str = "--val-groups") -> list[str]:
    """The `group_key` of each (path, label) example; a file name `pattern` (given as `flag`) does not match is an
    error."""
    from pathlib import Path

    keys = [group_key(path, pattern) for path, _ in examples]
    if None in keys:
        raise ValueError(f"{flag} {pattern!r} does not match {Path(examples[keys.index(None)][0]).name}: give a "
                         "pattern every file name matches.")
    return keys


def split_validation(examples: list, fraction: float, seed: int, groups: list[str] | None = None) -> tuple[list, list]:
    """(train, validation) of (path, label) examples: a seeded `fraction` of each class's examples (at least one), or
    with `groups` (one key per example, `source_groups`) whole groups, `split_by_groups`."""
    import random

    if groups is not None:
        return split_by_groups(examples, groups, fraction, seed)
    train, validation = [], []
    for label in sorted({label for _, label in examples}):
        members = [example for example in examples if example[1] == label]
        random.Random(seed * 1_000_003 + label).shuffle(members)
        count = max(1, round(fraction * len(members)))
        if count >= len(members):
            raise ValueError(f"Class {label} has {len(members)} image(s): too few to keep a validation share; add "
                             "images or lower --val-fraction.")
        validation += members[:count]
        train += members[count:]
    return train, validation


def training_split(args, examples: list, validation: list | None = None) -> tuple[list, list]:
    """(train, validation) of a run with `args` over the (path, label) `examples` of --data: with --val-data all of
    them and `validation` (--val-data's examples, as given), else the --val-fraction / --val-groups split."""
    if getattr(args, "val_data", None):  # run.json of runs before --val-data lack it
        return examples, validation
    groups = source_groups(examples, args.val_groups) if args.val_groups else None
    return split_validation(examples, 0.2 if args.val_fraction is None else args.val_fraction, args.seed, groups)


def split_by_groups(examples: list, groups: list[str], fraction: float, seed: int) -> tuple[list, list]:
    """(train, validation) with no group on both sides: the groups in a seeded order, each kept for validation when it
    brings the count closer to `fraction` of all examples (the first always). Every class must keep examples on both
    sides."""
    import random

    members = {}
    for example, key in zip(examples, groups):
        members.setdefault(key, []).append(example)
    keys = sorted(members)
    random.Random(seed).shuffle(keys)
    target, count, kept = fraction * len(examples), 0, set()
    for key in keys:
        if not kept or abs(count + len(members[key]) - target) < abs(count - target):
            kept.add(key)
            count += len(members[key])
    validation = [example for key in keys if key in kept for example in members[key]]
    train = [example for key in keys if key not in kept for example in members[key]]
    for side, part in (("training", train), ("validation", validation)):
        missing = sorted({label for _, label in examples} - {label for _, label in part})
        if missing:
            raise ValueError(f"Class {missing[0]} has no {side} image once the {len(members)} --val-groups groups are "
                             "kept whole: add groups (images of other sources), or change --val-fraction or --seed.")
    return train, validation


def loader(examples: list, size: int, batch_size: int, workers: int, seed: int | None = None):
    """Batches {"pixel_values": (B, 3, S, S), "labels": (B,)} of a DataLoader, shuffled each epoch from `seed` when
    given. An image that cannot be read is one ValueError naming it, with workers too (`Batches`)."""
    import torch

    from evaluation.probes import load_image

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return len(examples)

        def __getitem__(self, index):
            path, label = examples[index]
            try:
                return {"pixel_values": load_image(path, size), "labels": label, "error": ""}
            except (ValueError, OSError) as error:  # passed on as data: a worker's exception carries its traceback
                return {"pixel_values": torch.zeros(3, size, size), "labels": label, "error": str(error)}

    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return Batches(torch.utils.data.DataLoader(Images(), batch_size=batch_size, shuffle=seed is not None,
                                               generator=generator, num_workers=workers))


class Batches:
    """A DataLoader's batches without their "error" strings; the first non-empty one is raised as a ValueError."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            errors = [error for error in batch.pop("error") if error]
            if errors:
                raise ValueError(errors[0])
            yield batch
