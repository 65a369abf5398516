"""The web page (web/index.html): prepares a model folder and serves the page and the folder on localhost.

    python web/serve.py [MODEL] [--model-dir DIR] [--elastic INPUT] [--port 8000]   # `make web`; then open
                                                                                    # http://127.0.0.1:8000/

MODEL is a saved VECA or LookWhere folder or hub id (default: the checkpoint `make demo` distilled when there is one,
else a random-init VECA-S/14, whose features show the mechanics only). Its elastic graph
(`python -m corevision_hf.export MODEL DIR/onnx/model_elastic.onnx --elastic [INPUT]`: a LookWhere's slider sets
k_ratio, or k / k_mass with `--elastic k` / `--elastic k_mass`), config.json and
preprocessor_config.json are written to DIR (default outputs/web/model), laid out as a hub repo's `onnx/` is; without
MODEL, a DIR that already holds them (a repo staged by `python -m publishing.publish --onnx-elastic --staging-dir DIR`)
is served as it is. The page reads DIR at /model/, onnxruntime-web from web/node_modules (`npm ci` in web/ installs
the pinned version) and, at /sample.jpg, the shipped photo it shows until a file is picked (assets/photos/chelsea.jpg).
"""

import argparse
import functools
import http.server
import os
import shutil
import sys
from http import HTTPStatus
from pathlib import Path

from corevision_hf.cli import HelpFormatter, run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEMO_CHECKPOINT = ROOT / "outputs" / "demo" / "run" / "final"
GRAPH = Path("onnx") / "model_elastic.onnx"
SAMPLE = ROOT / "assets" / "photos" / "chelsea.jpg"  # CC0 (assets/photos/LICENSES.md)


def prepare(model: str, folder: Path, budget_input: str = "") -> None:
    """Writes MODEL's elastic graph, config.json and preprocessor_config.json (when it has one) into `folder`. A file
    there that this package did not write (a user's config.json, say) is never replaced: ValueError, nothing written."""
    from transformers.utils import cached_file

    from corevision_hf.atomic import atomic_path
    from corevision_hf.export import main as export
    from corevision_hf.outputs import not_ours, record_file

    names = [name for name in ("config.json", "preprocessor_config.json")
             if cached_file(model, name, _raise_exceptions_for_missing_entries=name == "config.json") is not None]
    theirs = not_ours(str(folder), names)  # checked before the export, so that a refusal leaves the folder as it was
    if theirs:
        raise ValueError(f"--model-dir {folder} holds {' and '.join(theirs)}, which corevision_hf did not write (or "
                         "which changed since): serving a model would replace them. Choose another --model-dir.")
    (folder / GRAPH.parent).mkdir(parents=True, exist_ok=True)
    if export([model, str(folder / GRAPH), "--elastic", budget_input, "--force"]) != 0:
        raise SystemExit(2)
    for name in names:
        with atomic_path(folder / name) as temporary:
            shutil.copyfile(cached_file(model, name), temporary)
        record_file(str(folder / name))


def random_veca(folder: Path) -> str:
    """A random-init VECA-S/14 with a bank of 32 cores, saved in `folder` (when not there yet)."""
    if not (folder / "config.json").is_file():
        import torch

        from corevision_hf import VecaConfig, VecaModel, save_model_folder

        torch.manual_seed(0)
        config = VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=224)
        save_model_folder(VecaModel(config), folder)
    return str(folder)


def inside(path: str, root: Path) -> bool:
    """Whether `path` lies in the real folder `root` (or is it) with no link on the way: each step below `root`,
    the file itself included, is checked, so a link planted in the served folder is never followed out of it."""
    relative = os.path.relpath(path, root)
    if relative == os.curdir:
        return True
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return False
    step = root
    for part in Path(relative).parts:
        step = step / part
        if step.is_symlink():
            return False
    return Path(os.path.realpath(path)).is_relative_to(root)


class Handler(http.server.SimpleHTTPRequestHandler):
    """web/ at /, the model folder at /model/, the sample photo at /sample.jpg; module scripts and WebAssembly with the
    types browsers require, the headers that let onnxruntime-web use threads (cross-origin isolation), nothing cached
    (a re-exported graph shows). A link in a served folder, or a path whose real place is outside it, is a 404: no
    file or listing from outside the folders is served."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm"}

    def __init__(self, *args, model_dir: Path, **kwargs):
        self.model_dir = Path(os.path.realpath(model_dir))  # the folder as given (a link the user chose is theirs)
        super().__init__(*args, directory=str(HERE), **kwargs)

    def translate_path(self, path: str) -> str:
        if path.split("?")[0] == "/sample.jpg":
            return str(SAMPLE)
        if path.startswith("/model/"):  # resolved as web/'s own paths are (no step out of the folder), then moved
            return str(self.model_dir / os.path.relpath(super().translate_path(path[len("/model"):]), HERE))
        return super().translate_path(path)

    def send_head(self):
        path = self.translate_path(self.path)
        if "\x00" in path or not self.served(path):  # a NUL: open() would raise (and the server log a traceback)
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        return super().send_head()

    def served(self, path: str) -> bool:
        """Whether `path` may be served: the sample photo, or a path inside web/ or the model folder with no link on
        the way, and for a folder, no link at the index page the server would open in its place."""
        if path == str(SAMPLE):
            return True
        root = self.model_dir if self.path.startswith("/model/") else HERE
        pages = [os.path.join(path, name) for name in ("index.html", "index.htm")] if os.path.isdir(path) else []
        return all(inside(candidate, root) for candidate in [path, *pages])

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("model", nargs="?", help="a saved VECA or LookWhere folder or hub id")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "outputs" / "web" / "model",
                        help="the folder the page reads: written from MODEL, or served as it is without MODEL")
    parser.add_argument("--elastic", default="", metavar="INPUT",
                        help="the graph's budget input, the slider's: a LookWhere's k_ratio (default), k or k_mass")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    if not (HERE / "node_modules" / "onnxruntime-web").is_dir():
        raise SystemExit("error: onnxruntime-web is not installed: run `npm ci` in web/ (make web does).")
    model = args.model
    if model is None and not (args.model_dir / GRAPH).is_file():
        demo = DEMO_CHECKPOINT.is_dir()
        model = str(DEMO_CHECKPOINT) if demo else random_veca(ROOT / "outputs" / "web" / "random-veca-s")
    if model is not None:
        prepare(model, args.model_dir, args.elastic)
    server = http.server.ThreadingHTTPServer(
        (args.host, args.port), functools.partial(Handler, model_dir=args.model_dir.resolve())
    )
    print(f"serving {args.model_dir} on http://{args.host}:{args.port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(run(main))
