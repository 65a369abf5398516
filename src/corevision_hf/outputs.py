"""What `--force` may replace: only files this package wrote, never a user's.

Every folder the CLIs write (a converted model, a converted teacher, extracted features) holds a manifest,
`.corevision_hf.json`, with the sha256 of each file written there; a single picture is listed in the manifest of its
folder, and an ONNX graph carries the mark in its own metadata (`export.GRAPH_MARK`), so that exporting into the
working folder leaves no file beside the graph. `--force` replaces a file only when its mark matches its current
sha256, so a user's file, or one of ours that the user has since edited, is kept and the run stops naming it (a
user's other files in an output folder stay). An output is also refused when it is, lies inside or holds one of the run's inputs.
"""

import hashlib
import json
import os

from .atomic import write_text_atomically


MANIFEST = ".corevision_hf.json"


def sha256(path: str) -> str:
    """The sha256 of the file at `path`, as 64 hex digits (read in 1 MiB blocks)."""
    return running_sha256(path).hexdigest()


def running_sha256(path: str):
    """hashlib's sha256 object fed the file at `path` (read in 1 MiB blocks), to be fed what is appended to it."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest


def read_manifest(folder: str) -> dict[str, str]:
    """{relative path: sha256} of the files this package wrote in `folder` ({} without a readable manifest)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            files = json.load(f)["files"]
        return {str(name): str(digest) for name, digest in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def files_under(folder: str) -> list[str]:
    """Every file below `folder` as a relative POSIX path, the manifest left out."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST:
                found.append(relative)
    return sorted(found)


def is_ours(folder: str, name: str, manifest: dict[str, str]) -> bool:
    """Whether `folder/name` is a file that `manifest` (read from `folder`) lists with its current content."""
    path = os.path.join(folder, name)
    return name in manifest and os.path.isfile(path) and sha256(path) == manifest[name]


def not_ours(folder: str, names: list[str]) -> list[str]:
    """Those of `names` (relative to `folder`) that exist there and that no manifest lists with their content."""
    manifest = read_manifest(folder)
    return [name for name in names
            if os.path.lexists(os.path.join(folder, name)) and not is_ours(folder, name, manifest)]


def record(folder: str, names: list[str], keep: bool = False, digests: dict[str, str] | None = None) -> None:
    """Writes `folder`'s manifest listing `names` (relative paths) with their sha256; with `keep`, the entries of
    other files already listed stay. `digests`: {name: sha256} the caller already holds (a log it appends to, its
    digest carried along), taken instead of reading those files again."""
    files = {name: digest for name, digest in read_manifest(folder).items() if keep and name not in names}
    files.update({name: (digests or {}).get(name) or sha256(os.path.join(folder, name)) for name in names})
    manifest = {"written_by": "corevision_hf", "files": dict(sorted(files.items()))}
    write_text_atomically(os.path.join(folder, MANIFEST), json.dumps(manifest, indent=1))  # never through a link


def refuse_overlap(output: str, *inputs: str) -> None:
    """A ValueError when `output` is one of `inputs`, lies inside one or holds one: writing there could replace
    the very files the run reads."""
    target = os.path.realpath(output)
    for source in inputs:
        if not source or not os.path.exists(source):  # a hub id or a dataset name is no path of this machine
            continue
        real = os.path.realpath(source)
        if target == real or target.startswith(real + os.sep) or real.startswith(target + os.sep):
            relation = "is" if target == real else "lies inside" if target.startswith(real + os.sep) else "holds"
            raise ValueError(f"The output {output} {relation} the input {source}: writing there could replace the "
                             "files this run reads. Choose an output outside it.")


def check_file_output(path: str, force: bool, ours=None) -> None:
    """An existing `path` is kept unless `force`, and even then only replaced when this package wrote it: `ours(path)`
    says so where given (a file that carries its own mark), else its folder's manifest must list it."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder; give the path of a file to write.")
    if not force:
        raise FileExistsError(f"{path} exists; pass --force to replace it (only a file this package wrote) or choose "
                              "another path.")
    if ours is not None:
        if not ours(path):
            raise ValueError(f"{path} was not written by corevision_hf (or was changed since): it carries no mark of "
                             "ours that matches its content, so --force will not replace it. Move it or choose another "
                             "path.")
        return
    folder, name = os.path.split(os.path.abspath(path))
    if not_ours(folder, [name]):
        raise ValueError(f"{path} was not written by corevision_hf (or was changed since): "
                         f"{os.path.join(folder, MANIFEST)} does not list it with its content, so --force will not "
                         "replace it. Move it or choose another path.")


def record_file(path: str) -> None:
    """Lists the file just written at `path` in its folder's manifest, so a later `--force` may replace it."""
    folder, name = os.path.split(os.path.abspath(path))
    record(folder, [name], keep=True)


def check_folder_output(folder: str, force: bool, replaced: list[str] | None = None) -> None:
    """A folder output must be new or empty, or, with `force`, each of `replaced` (relative paths; default: every
    file in it) that exists there must be a file this package wrote, unchanged. Other files of the user's stay."""
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} exists and is not a folder; choose another output folder.")
    if not os.path.isdir(folder) or not os.listdir(folder):
        return
    if not force:
        raise FileExistsError(f"{folder} exists and is not empty; choose a new folder or pass --force to write into it "
                              "(it replaces only files corevision_hf wrote there).")
    theirs = not_ours(folder, files_under(folder) if replaced is None else replaced)
    if theirs:
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise ValueError(f"{folder} holds files that corevision_hf did not write (or that changed since): {shown}; "
                         f"--force replaces only the files its {MANIFEST} lists. Move them or choose another folder.")
