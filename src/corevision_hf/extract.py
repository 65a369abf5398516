"""Features of a whole image collection, as a `datasets` dataset on disk.

    python -m corevision_hf.extract org/veca-base --data photos/ --num-cores 16 --resolution 1024 \
        --dense-stride 4 --output features/
    accelerate launch -m corevision_hf.extract ...      # the same job split over processes / GPUs

    import datasets
    features = datasets.load_from_disk("features/")    # columns: id, pooled (D,), dense (Hp/S, Wp/S, D) with -S

MODEL_OR_DIR: a VECA or LookWhere checkpoint (hub id or save_pretrained folder), or any transformers ViT whose
patch tokens come last (DINOv2, DINOv3). --data: an image folder (any nesting; the id is the path inside it), a
dataset saved with `save_to_disk`, or a hub dataset name (--split, --image-column). Every image keeps its aspect
ratio: its shorter side is resized to about --resolution and both sides are snapped to patch multiples, as the
models' image processor does (--square: resized to --resolution x --resolution instead); no crop, ImageNet
normalisation (`corevision_hf.images.to_pixel_values`). Images that resize to the same size are batched together
(--batch-size per size), never padded or squashed, so each image's features are those of a call on it alone.

The collection is cut into shards of --shard-size images; process p of P handles shards p, p + P, ... Each finished
shard is written under a temporary name in `OUT.partial/` next to OUT and renamed, so a rerun after a crash skips
it (a run that fails before finishing a shard removes `OUT.partial/`). When all are done the first process merges
them into a new folder in `OUT.partial/` with `extraction.json` (settings, counts, skipped images), moves that into
place as OUT (with --force, swapped with the old OUT in one step where the system allows) and removes `OUT.partial/`.
Unreadable images (`corevision_hf.images.open_image`) are skipped and counted.
"""

import argparse
import io
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env
from PIL import Image
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel
from transformers.utils import logging as transformers_logging

from .cli import HelpFormatter
import corevision_hf  # noqa: F401  (registers VECA and LookWhere with the Auto classes)

from .atomic import atomic_path, exchange_folders, follow_umask, write_text_atomically
from .cli import reading_weights, run
from .cpu import optimize_for_cpu
from .finite import check_forward_finite
from .images import check_pixels_fit, open_image, to_pixel_values, to_rgb
from .loading import load_checked
from .offline import check_hub_reachable
from .outputs import check_folder_output, files_under, record, refuse_overlap
from .tokens import patch_tokens


INFO_FILE = "extraction.json"
SETTINGS_FILE = "settings.json"
PENDING_BATCHES = 4  # images of other sizes wait for their batch up to this many batches' worth, then run
IMAGE_EXTENSIONS = {ext for ext, name in Image.registered_extensions().items() if name in Image.OPEN}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m corevision_hf.extract", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("model", metavar="MODEL_OR_DIR", help="hub id or save_pretrained folder")
    parser.add_argument("--data", required=True, help="image folder, save_to_disk folder or hub dataset name")
    parser.add_argument("--split", default="train", help="split of a dataset (default: train)")
    parser.add_argument("--image-column", default=None, help="image column of a dataset (default: the first Image one)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--num-cores", type=int, default=None, help="VECA: active cores (default: the whole bank)")
    budget.add_argument("--k-ratio", type=float, default=None, help="LookWhere: fraction of patches kept")
    parser.add_argument("--resolution", type=int, default=None,
                        help="shorter side in pixels, aspect ratio kept (default: config.image_size)")
    parser.add_argument("--square", action="store_true", help="resize to --resolution x --resolution instead")
    parser.add_argument("--dense-stride", type=int, default=None,
                        help="also store the patch features average-pooled by this factor (1: the full grid)")
    parser.add_argument("--output", required=True, help="folder to write; must not exist unless --force")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shard-size", type=int, default=1024, help="images per shard (the unit of resuming)")
    parser.add_argument("--device", default=None, help="default: the process's accelerator, else cpu")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- the collection


class ImageSource:
    """A list of images with ids; `load(i)` returns (id, PIL image) or (id, None) when the image cannot be read."""

    def __init__(self, data: str, split: str, image_column: str | None):
        path = Path(data)
        self.folder = None
        if path.is_dir() and not _is_saved_dataset(path):
            self.folder = path
            self.files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not self.files:
                raise ValueError(f"{data} holds no images (looked for {', '.join(sorted(IMAGE_EXTENSIONS)[:8])}, ...).")
            return
        self.dataset = _load_dataset(data, split)
        images = [name for name, feature in self.dataset.features.items() if isinstance(feature, datasets.Image)]
        self.column = image_column or (images[0] if images else None)
        if self.column not in self.dataset.column_names:
            raise ValueError(
                f"{data} has no image column {self.column!r}; its columns are {self.dataset.column_names}: pass "
                "--image-column."
            )
        if isinstance(self.dataset.features[self.column], datasets.Image):
            # decoded here, one at a time, so that one corrupt image is skipped instead of failing a whole batch
            self.dataset = self.dataset.cast_column(self.column, datasets.Image(decode=False))
        self.ids = next((name for name in ("id", "image_id") if name in self.dataset.column_names), None)

    def __len__(self) -> int:
        return len(self.files) if self.folder else len(self.dataset)

    def load(self, index: int) -> tuple[str, Image.Image | None]:
        if self.folder:
            path = self.files[index]
            # A file name that is not UTF-8 (read with surrogate escapes) keeps its odd bytes as \xNN in the id.
            image_id = path.relative_to(self.folder).as_posix().encode("utf-8", "surrogateescape")
            image_id = image_id.decode("utf-8", "backslashreplace")
            return image_id, _decode(lambda: open_image(path))
        row = self.dataset[index]
        image_id = str(row[self.ids]) if self.ids else str(index)
        value = row[self.column]
        if isinstance(value, Image.Image):
            return image_id, _decode(lambda: to_rgb(value))
        if isinstance(value, dict) and value.get("bytes") is not None:  # an undecoded Image column
            return image_id, _decode(lambda: open_image(io.BytesIO(value["bytes"])))
        if isinstance(value, dict) and value.get("path"):
            return image_id, _decode(lambda: open_image(value["path"]))
        return image_id, None


def _decode(decoder) -> Image.Image | None:
    try:
        return decoder()
    except (OSError, ValueError):  # unreadable: skipped and counted, never fatal
        return None


def _is_saved_dataset(path: Path) -> bool:
    return any((path / name).is_file() for name in ("state.json", "dataset_dict.json"))


def _load_dataset(data: str, split: str) -> datasets.Dataset:
    path = Path(data)
    if path.is_dir():
        loaded = datasets.load_from_disk(data)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{data} has no split {split!r}; its splits are {list(loaded)}: pass --split.")
            loaded = loaded[split]
        return loaded
    if path.exists() or data.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"--data {data} is neither an image folder nor a dataset saved with save_to_disk.")
    try:
        return datasets.load_dataset(data, split=split)
    except Exception as error:  # the hub's errors are many; each means "this name or split cannot be read"
        raise ValueError(f"Could not load the dataset {data!r} (split {split!r}): {error}") from None


# ---------------------------------------------------------------- the model


def check_budget(config, args) -> dict:
    """The budget keyword for the model's forward, checked against the config."""
    if args.num_cores is not None:
        if config.model_type != "veca":
            raise ValueError(f"--num-cores is a VECA budget; {args.model} is a {config.model_type!r} model.")
        if not 1 <= args.num_cores <= config.num_cores:
            raise ValueError(f"--num-cores {args.num_cores} is outside 1..{config.num_cores} (the bank of {args.model}).")
        return {"num_cores": args.num_cores}
    if args.k_ratio is not None:
        if config.model_type != "lookwhere":
            raise ValueError(f"--k-ratio is a LookWhere budget; {args.model} is a {config.model_type!r} model.")
        if not 0 < args.k_ratio <= 1:
            raise ValueError(f"--k-ratio {args.k_ratio} is outside (0, 1]: give the fraction of patches to keep.")
        return {"k_ratio": args.k_ratio}
    return {}


def patch_size(config) -> int:
    size = config.patch_size
    return size[0] if isinstance(size, (tuple, list)) else size


@torch.inference_mode()
def extract_batch(model, pixel_values: torch.Tensor, budget: dict, dense_stride: int | None) -> dict:
    """Pooled features (B, D) and, with `dense_stride`, patch features average-pooled by it (B, Hp/S, Wp/S, D), as
    float32 arrays on the CPU."""
    if model.config.model_type == "lookwhere" and not dense_stride:
        budget = {**budget, "fill_dense": False}  # the dense fill is not stored, so it need not run
    output = model(pixel_values, **budget)
    pooled = output.pooler_output if output.pooler_output is not None else output.last_hidden_state[:, 0]
    result = {"pooled": pooled.float().cpu().numpy()}
    if dense_stride:
        rows, columns = (s // patch_size(model.config) for s in pixel_values.shape[-2:])
        patches = patch_tokens(output, (rows, columns)).float()
        grid = patches.transpose(1, 2).reshape(len(patches), -1, rows, columns)
        if dense_stride > 1:  # a side the stride does not divide (aspect ratio kept) ends in a smaller block
            grid = F.avg_pool2d(grid, dense_stride, ceil_mode=True)
        result["dense"] = grid.permute(0, 2, 3, 1).cpu().numpy()
    return result


# ---------------------------------------------------------------- shards


def shard_features(width: int, dense_shape: tuple | None) -> datasets.Features:
    features = {"id": datasets.Value("string"), "pooled": datasets.List(datasets.Value("float32"), length=width)}
    if dense_shape and None in dense_shape:  # a grid per image, as its aspect ratio gives
        features["dense"] = datasets.List(datasets.List(datasets.List(datasets.Value("float32"), length=width)))
    elif dense_shape:
        features["dense"] = datasets.Array3D(shape=dense_shape, dtype="float32")
    return datasets.Features(features)


def write_shard(rows: dict, features: datasets.Features, folder: Path, skipped: list[str]) -> None:
    """Saves one shard under a temporary name (`atomic_path`) and renames it, so a folder that exists is complete. A
    shard whose every image was unreadable holds only its skipped.json (`datasets` cannot read back a dataset of no
    rows)."""
    with atomic_path(folder, folder=True) as temporary:
        if rows["id"]:
            datasets.Dataset.from_dict(rows, features=features).save_to_disk(temporary)
        Path(temporary, "skipped.json").write_text(json.dumps(skipped))


def run_shard(model, source: ImageSource, indices: range, args, budget: dict, features, folder: Path, progress) -> None:
    """Extracts one shard. Images are batched by the size they resize to (a bucket runs when it holds --batch-size
    images, or, the largest first, when more than PENDING_BATCHES batches' worth wait), then stored in order."""
    results, buckets, skipped = {}, {}, []  # results: position in the shard -> (id, features)
    patch = None if args.square else patch_size(model.config)

    def run(size: tuple[int, int]) -> None:
        waiting = buckets.pop(size)
        batch = extract_batch(model, torch.stack([p for _, _, p in waiting]).to(args.device), budget, args.dense_stride)
        for row, (position, image_id, _) in enumerate(waiting):
            results[position] = (image_id, {name: values[row] for name, values in batch.items()})

    for position, index in enumerate(indices):
        image_id, image = source.load(index)
        if image is None:
            skipped.append(image_id)
        else:
            pixels = to_pixel_values(image, args.resolution, patch)
            size = tuple(pixels.shape[-2:])
            buckets.setdefault(size, []).append((position, image_id, pixels))
            if len(buckets[size]) == args.batch_size:
                run(size)
            elif sum(map(len, buckets.values())) > PENDING_BATCHES * args.batch_size:  # bounded memory
                run(max(buckets, key=lambda s: len(buckets[s])))
        progress.update(1)
    for size in list(buckets):
        run(size)
    rows = {name: [] for name in features}
    for position in sorted(results):
        image_id, values = results[position]
        rows["id"].append(image_id)
        for name, value in values.items():
            rows[name].append(value)
    write_shard(rows, features, folder, skipped)


# ---------------------------------------------------------------- the job


def main(argv=None) -> datasets.Dataset | None:
    """Runs the extraction; returns the merged dataset on the first process (None on the others)."""
    args = parse_args(argv)
    datasets.disable_progress_bars()  # one bar, ours: not one per shard saved
    transformers_logging.disable_progress_bar()
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))  # as Accelerator reads it
    output = Path(args.output)
    partial = output.with_name(output.name + ".partial")

    # Checks, before any work: sizes and the output, the model's config and budget, the data, the device.
    check_sizes_and_output(args, partial)
    config = read_config(args.model)
    budget = check_budget(config, args)
    if args.resolution is None:
        args.resolution = config.image_size
    grid = check_grid(args.resolution, patch_size(config), args.dense_stride, args.batch_size)
    source = ImageSource(args.data, args.split, args.image_column)
    args.device = args.device or str(state.device)
    check_device(args.device)

    settings = {
        "model": args.model, "data": args.data, "split": args.split, "image_column": args.image_column,
        "resolution": args.resolution, "square": args.square, "budget": budget, "dense_stride": args.dense_stride,
        "shard_size": args.shard_size, "num_images": len(source),
    }
    started_here = open_partial(state, partial, settings)
    try:
        return extract(args, state, config, source, budget, grid, partial, output, settings)
    except BaseException:
        # A run that fails before its first finished shard leaves nothing; one with finished shards leaves
        # OUT.partial/ for the next run with the same arguments to resume.
        if state.is_main_process and started_here and not any(partial.glob("shard-?????")):
            shutil.rmtree(partial, ignore_errors=True)
        raise


def check_sizes_and_output(args, partial: Path) -> None:
    """A ValueError (or FileExistsError), before anything is read or written, for a --batch-size or --shard-size below
    1, an --output that is no UTF-8 path, overlaps MODEL_OR_DIR, or is in use (`check_folder_output`), or an OUT.partial
    that is no unfinished extraction (`check_unfinished`)."""
    for name in ("batch_size", "shard_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    try:  # pyarrow, which writes and reads the shards, takes UTF-8 paths only
        os.path.abspath(args.output).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"--output {os.fsencode(args.output)!r} is not a UTF-8 path, which the datasets library "
                         "cannot read: choose a UTF-8 name.") from None
    refuse_overlap(args.output, args.model)
    check_folder_output(args.output, args.force)  # with --force, OUT must hold only files an extraction wrote
    check_unfinished(partial)


def read_config(model: str):
    """The config of `model` (hub id or folder); a ValueError in one line when there is none to read."""
    check_hub_reachable(model)
    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as error:
        raise ValueError(f"Could not read a model config from {model!r}: {error}") from None


def check_grid(resolution: int, patch: int, dense_stride: int | None, batch_size: int) -> int:
    """The patch grid's side at `resolution`; a ValueError when `resolution` is no positive multiple of `patch`, a
    batch of such images would not fit in a tensor, or `dense_stride` does not divide the grid."""
    if resolution <= 0 or resolution % patch:
        raise ValueError(f"--resolution {resolution} is not a positive multiple of the patch size {patch}.")
    check_pixels_fit(resolution, resolution, batch_size, f"--resolution {resolution}")
    grid = resolution // patch
    if dense_stride is not None and (dense_stride < 1 or grid % dense_stride):
        divisors = [s for s in range(1, grid + 1) if grid % s == 0]
        raise ValueError(f"--dense-stride {dense_stride} does not divide the {grid} x {grid} patch grid at "
                         f"{resolution} px: use one of {divisors}.")
    return grid


def open_partial(state, partial: Path, settings: dict) -> bool:
    """OUT.partial with `settings` written in it, once every process has checked that an unfinished extraction there
    has the same settings (else a ValueError); whether this run created it."""
    settings_path = partial / SETTINGS_FILE
    if settings_path.exists() and json.loads(settings_path.read_text()) != settings:
        raise ValueError(f"{partial} holds an unfinished extraction with other settings: delete it, or rerun with the "
                         "same arguments to resume it.")
    state.wait_for_everyone()  # every process has checked before the first one writes
    started_here = not partial.exists()
    if state.is_main_process:
        partial.mkdir(parents=True, exist_ok=True)
        write_text_atomically(settings_path, json.dumps(settings, indent=2))
    state.wait_for_everyone()
    return started_here


def check_unfinished(partial: Path) -> None:
    """A ValueError or FileExistsError, before anything is written, when OUT.partial, where the run keeps its
    unfinished work, is a link or a folder that holds no unfinished extraction."""
    if partial.is_symlink():
        raise ValueError(f"{partial} is a link; this command keeps its unfinished work there and follows no link: "
                         "remove it, or choose another --output.")
    if partial.exists() and not (partial / SETTINGS_FILE).is_file():
        raise FileExistsError(f"{partial} exists but is no unfinished extraction (it holds no {SETTINGS_FILE}): move "
                              "it, or choose another --output.")


def check_device(device: str) -> None:
    """A ValueError, before anything is written, when `device` cannot hold a tensor in this torch."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as error:  # bad name, torch built without CUDA, no such GPU
        usable = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"--device {device} is not usable here ({reason}): use one of {', '.join(usable)}, or leave "
                         "--device out to use the process's accelerator.") from None


def extract(args, state, config, source, budget: dict, grid: int, partial: Path, output: Path, settings: dict):
    """The shards this process has not finished yet, then, on the first process, the merge."""
    with reading_weights(args.model):
        model = check_forward_finite(load_checked(AutoModel, args.model).to(args.device).eval())
    if model.device.type == "cpu":  # the CPU opt-in: prepacked linear weights, faster for a second copy in memory
        optimize_for_cpu(model)
    width = getattr(config, "output_projection_size", None) or config.hidden_size
    if not args.dense_stride:
        dense_shape = None
    elif args.square:
        dense_shape = (grid // args.dense_stride, grid // args.dense_stride, width)
    else:
        dense_shape = (None, None, width)  # each image's own grid
    features = shard_features(width, dense_shape)

    num_shards = math.ceil(len(source) / args.shard_size)
    mine = [s for s in range(state.process_index, num_shards, state.num_processes)]
    todo = [s for s in mine if not (partial / f"shard-{s:05d}").is_dir()]
    done_images = sum(min(args.shard_size, len(source) - s * args.shard_size) for s in mine if s not in todo)
    finished = sum((partial / f"shard-{s:05d}").is_dir() for s in range(num_shards))
    if finished and state.is_main_process:
        print(f"resuming: {finished} of {num_shards} shards were done before")
    with tqdm(
        total=sum(min(args.shard_size, len(source) - s * args.shard_size) for s in mine), initial=done_images,
        unit="img", desc=f"extract (process {state.process_index + 1}/{state.num_processes})",
        disable=not state.is_local_main_process, dynamic_ncols=True,
    ) as progress:  # closed (its line ended) before an error is printed
        for shard in todo:
            start = shard * args.shard_size
            indices = range(start, min(start + args.shard_size, len(source)))
            run_shard(model, source, indices, args, budget, features, partial / f"shard-{shard:05d}", progress)
    state.wait_for_everyone()
    if not state.is_main_process:
        return None
    return merge(partial, output, num_shards, settings)


def merge(partial: Path, output: Path, num_shards: int, settings: dict) -> datasets.Dataset:
    """Concatenates the shards in order into a new folder in OUT.partial, writes extraction.json there, moves it into
    place as OUT and removes OUT.partial (a kill on the way leaves only OUT.partial, which the next run resumes from)."""
    shards = [partial / f"shard-{s:05d}" for s in range(num_shards)]
    missing = [s.name for s in shards if not s.is_dir()]
    if missing:
        raise FileNotFoundError(f"Shards {missing[:5]} are missing after every process finished; rerun to complete them.")
    skipped = [image_id for s in shards for image_id in json.loads((s / "skipped.json").read_text())]
    extracted = [datasets.load_from_disk(str(s)) for s in shards if (s / "state.json").is_file()]
    if not extracted:
        shutil.rmtree(partial)
        raise ValueError(f"None of the {len(skipped)} images of {settings['data']} could be read (e.g. "
                         f"{', '.join(skipped[:3])}): nothing was written.")
    merged = datasets.concatenate_datasets(extracted)
    for killed in partial.glob("merged.*"):  # left by a merge that was killed (rmtree follows no link)
        shutil.rmtree(killed, ignore_errors=True)
    temporary = Path(tempfile.mkdtemp(prefix="merged.", dir=partial))  # a name of our own: no planted link is followed
    follow_umask(str(temporary))
    merged.save_to_disk(str(temporary))
    info = {**settings, "num_extracted": len(merged), "num_skipped": len(skipped), "skipped": skipped}
    (temporary / INFO_FILE).write_text(json.dumps(info, indent=2))
    record(str(temporary), files_under(str(temporary)))
    if output.exists():  # --force, checked to hold only our files: replaced only now that the new one is whole
        exchange_folders(str(temporary), str(output))
    else:
        os.rename(temporary, output)
    shutil.rmtree(partial)
    print(f"wrote {output}: {len(merged)} images, {len(skipped)} unreadable skipped"
          + (f" ({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})" if skipped else "")
          + f"; datasets.load_from_disk({str(output)!r})")
    return datasets.load_from_disk(str(output))


def cli(argv=None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    return run(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
