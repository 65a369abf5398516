"""The task benchmarks' teacher passes, cached on disk: a dense teacher run once per canvas and kept, so that larger
runs, reruns and the pilot cost the teacher once.

A pass is keyed by the teacher's weights (a SHA-256 of its config and every parameter), the code that draws the
canvases (`CANVAS_CODE`: a SHA-256 of evaluation.sparse_digits and of the pixels' normalisation, comments and
docstrings left out, so that a change to how canvases are drawn is never served the old passes), the canvases'
arguments (variant, split, count, seed, background, digit size, strokes, canvas size) and the resolution the teacher
ran at. Each pass is one safetensors file under the cache folder, its teacher and canvas code in its metadata, written
through corevision_hf.atomic (a name made for it, renamed when complete); a file that cannot be read, or that records
another teacher or canvas code than its name says, is computed again (and replaced), never trusted. A temporary that a
killed writer left (`.NAME.safetensors.*.tmp`, which no live writer holds locked) is removed by the next run.
`pass_record` gives a pass as the task's lines read it: the features of the linear probe, the tokens of the attentive
one, the maps.
"""

import ast
import fcntl
import hashlib
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from corevision_hf.atomic import atomic_path
from evaluation import sparse_digits
from evaluation.canvases import Split
from evaluation.sparse_digits import CELL
from training.teacher import MAP_QUERIES, teacher_targets_and_maps

STALE_AFTER_S = 60  # a temporary older than this, held by no writer, was left by a killed one


def code_digest(*sources: str) -> str:
    """SHA-256 of the Python `sources` as code: their syntax trees without docstrings (comments are not in them)."""
    digest = hashlib.sha256()
    for source in sources:
        tree = ast.parse(textwrap.dedent(source))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        digest.update(ast.dump(tree).encode())
    return digest.hexdigest()


# What draws the canvases the teacher sees: a pass made by other code is another entry of the cache.
CANVAS_CODE = code_digest(inspect.getsource(sparse_digits), inspect.getsource(Split.pixels))


def teacher_fingerprint(teacher) -> str:
    """SHA-256 of the teacher's config and parameters, in order: two teachers share a cache entry only when they
    compute the same thing."""
    digest = hashlib.sha256(teacher.config.to_json_string(use_diff=False).encode())
    for name, tensor in teacher.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def resized(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """Pixels downsized to `size` px (bicubic, antialiased), as a dense ViT at a lower resolution sees the canvas."""
    return F.interpolate(pixels, size=(size, size), mode="bicubic", align_corners=False, antialias=True)


@torch.inference_mode()
def compute_pass(teacher, split, size: int, batch_size: int) -> dict:
    """The teacher on every canvas of `split` at `size` px: "cls" (N, D) float32, "patches" (N, P, D) float16, and at
    the canvas size each "map_<query>" (N, G * G) of training.teacher's where targets, from the same forward."""
    canvas = split.images.shape[1]
    out = {"cls": [], "patches": [], **{f"map_{q}": [] for q in MAP_QUERIES if size == canvas}}
    for _, pixels in split.batches(batch_size):
        if size == canvas:
            grid = (canvas // CELL, canvas // CELL)
            cls, patches, maps = teacher_targets_and_maps(teacher, pixels, grid, MAP_QUERIES)
            for query in MAP_QUERIES:
                out[f"map_{query}"].append(maps[query].float())
        else:
            hidden = teacher(resized(pixels, size)).last_hidden_state
            cls, patches = hidden[:, 0], patch_tokens(teacher, hidden)
        out["cls"].append(cls.float())
        out["patches"].append(patches.half())
    return {name: torch.cat(parts).contiguous() for name, parts in out.items()}


def patch_tokens(teacher, hidden: torch.Tensor) -> torch.Tensor:
    """(B, P, D) the patch tokens of the teacher's output (B, 1 + R + P, D): its registers, if any, left out."""
    return hidden[:, 1 + getattr(teacher.config, "num_register_tokens", 0):]


def teacher_features(teacher, pixels: torch.Tensor) -> torch.Tensor:
    """(B, 2D) float32 [CLS ; mean patch] of the teacher on `pixels`, registers left out: `pass_record`'s features,
    from a live forward (what fine-tuning the teacher trains through)."""
    hidden = teacher(pixels).last_hidden_state
    return torch.cat([hidden[:, 0], patch_tokens(teacher, hidden).mean(1)], dim=-1).float()


def pass_record(tensors: dict, keep_patches: bool = True) -> dict:
    """A teacher pass (compute_pass's tensors) as the lines read it: "features" (N, 2D) [CLS ; mean patch], "maps" by
    query, and "cls", "patches" when `keep_patches`."""
    record = {"features": torch.cat([tensors["cls"], tensors["patches"].float().mean(1)], dim=-1),
              "maps": {query: tensors[f"map_{query}"] for query in MAP_QUERIES if f"map_{query}" in tensors}}
    if keep_patches:
        record.update(cls=tensors["cls"], patches=tensors["patches"])
    return record


def tokens_of(record: dict) -> torch.Tensor:
    """(N, 1 + P, D) float16 [CLS ; patches] of a teacher pass: what the attentive probe reads."""
    return torch.cat([record["cls"].half().unsqueeze(1), record["patches"]], dim=1)


class TeacherPasses:
    """Cached teacher passes in `folder` for one teacher (`fingerprint`): `get(split, key, size)`. Temporaries that
    killed writers left in `folder` are removed."""

    def __init__(self, folder: Path, teacher, batch_size: int):
        self.folder, self.teacher, self.batch_size = Path(folder), teacher, batch_size
        self.fingerprint = teacher_fingerprint(teacher)
        self.metadata = {"teacher": self.fingerprint, "canvas_code": CANVAS_CODE}
        remove_stale_temporaries(self.folder)

    def path(self, key: dict, size: int) -> Path:
        entry = json.dumps({**self.metadata, **key, "size": size}, sort_keys=True)
        return self.folder / f"{hashlib.sha256(entry.encode()).hexdigest()[:32]}.safetensors"

    def get(self, split, key: dict, size: int) -> dict:
        """The teacher's pass over `split` (whose canvases `key` names) at `size` px: read from the cache when it is
        there and readable, else computed and stored."""
        path = self.path(key, size)
        tensors = self.read(path)
        if tensors is None or len(tensors["cls"]) != len(split):
            tensors = compute_pass(self.teacher, split, size, self.batch_size)
            self.write(path, tensors)
        return tensors

    def read(self, path: Path) -> dict | None:
        """The pass stored at `path`, or None: none there, unreadable, or recorded for another teacher or canvas code
        (said in a warning: its name promised this teacher's pass)."""
        if not path.is_file() or path.is_symlink():
            return None
        try:
            with safe_open(str(path), "pt") as f:
                recorded = f.metadata() or {}
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError):
            return None  # a partial or foreign file: computed again
        if wrong := [name for name, value in self.metadata.items() if recorded.get(name) != value]:
            print(f"warning: {path} records another {' and '.join(wrong).replace('_', ' ')} than this run's (copied "
                  "or damaged?): its teacher pass is computed again and replaces it", file=sys.stderr)
            return None
        return tensors

    def write(self, path: Path, tensors: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary, open(temporary, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # held while written: a later run removes only what no writer holds
            save_file(tensors, temporary, metadata=self.metadata)


def remove_stale_temporaries(folder: Path) -> None:
    """Removes the temporaries of passes (`.NAME.safetensors.*.tmp`, corevision_hf.atomic's names) in `folder` that a
    killed writer left: older than STALE_AFTER_S and locked by no live writer (TeacherPasses.write holds its lock)."""
    for path in folder.glob(".*.safetensors.*.tmp") if folder.is_dir() else ():
        try:
            if path.is_symlink() or not path.is_file() or time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            with open(path, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while a writer holds it
                path.unlink()
        except OSError:
            continue
