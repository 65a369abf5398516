"""publishing.publish against an in-memory hub behind huggingface_hub's HTTP client (no network): the real
`HfApi.upload_folder` code runs and what it sends is checked, then loaded back without the package."""

import base64
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote

import httpx2
import huggingface_hub
import pytest
import torch
from conftest import (
    load_without_package,
    make_offline_hub_cache,
    tiny_lookwhere_config,
    tiny_veca_config,
)
from huggingface_hub import ModelCard
from huggingface_hub.utils._http import default_client_factory
from huggingface_hub.utils.sha import git_hash
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification

from corevision_hf import (
    LookWhereForImageClassification,
    LookWhereImageProcessor,
    LookWhereModel,
    VecaForImageClassification,
    VecaImageProcessor,
    VecaModel,
    save_model_folder,
)
from publishing import publish


REPO_ID = "org/veca-tiny"
VECA_FILES = {
    "README.md", "config.json", "model.safetensors", "configuration_veca.py", "modeling_veca.py",
    "image_processing_veca.py", "pipeline_veca.py", "budget_veca.py", "preprocessor_config.json",
    "training_recipe.json", "evaluation.json", "evaluation.png",
}  # fmt: skip
LOOKWHERE_FILES = {
    "README.md", "config.json", "model.safetensors", "configuration_lookwhere.py", "modeling_lookwhere.py",
    "image_processing_lookwhere.py", "pipeline_lookwhere.py", "budget_lookwhere.py", "preprocessor_config.json",
    "evaluation.json",
}  # fmt: skip
# on the raw (quoted) path: a ref such as refs/pr/1 travels as one quoted segment
API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<action>[a-z-]+)(?:/(?P<ref>[^/]+))?)?")


class FakeHub:
    """The slice of the hub API that `model_info`, `create_repo`, `create_branch` and `upload_folder` use, kept in
    memory: repos hold branches of {path: bytes}. Every request is recorded; any other request fails the test.
    Preupload answers "regular" for every file, so contents travel base64 in the commit and the mock sees every byte
    (the LFS / xet transfer, which bypasses huggingface_hub's HTTP client, is not exercised)."""

    def __init__(self):
        self.repos = {}  # repo id -> {"private": bool, "branches": {ref: {path: bytes}}}
        self.requests = []  # (method, unquoted path)
        self.created = []  # create_repo payloads
        self.commits = []  # {"repo", "ref", "message", "files": {path: bytes}, "deleted": [path]}

    def add_repo(self, repo_id: str, files: dict[str, bytes], private: bool = False) -> None:
        self.repos[repo_id] = {"private": private, "branches": {"main": dict(files)}}

    def files(self, repo_id: str, ref: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id]["branches"][ref]

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.raw_path.decode().split("?")[0]
        if path == "/api/agent-harnesses":  # huggingface_hub's own user-agent telemetry, not part of publishing
            return httpx2.Response(404)
        self.requests.append((request.method, unquote(path)))
        if request.method == "POST" and path == "/api/repos/create":
            payload = json.loads(request.content)
            self.created.append(payload)
            repo_id = f"{payload['organization']}/{payload['name']}"
            url = {"url": f"https://huggingface.co/{repo_id}"}
            if repo_id in self.repos:
                return httpx2.Response(409, json={"error": "You already created this model repo", **url})
            self.add_repo(repo_id, {}, private=payload.get("visibility") == "private")
            return httpx2.Response(200, json=url)
        if request.method == "POST" and path == "/api/validate-yaml":  # upload_folder checks README.md's metadata
            return httpx2.Response(200, json={})
        match = API.fullmatch(path)
        assert match, f"unexpected hub request {request.method} {path}"
        repo_id, action, ref = match["repo"], match["action"], unquote(match["ref"] or "")
        if repo_id not in self.repos:
            return httpx2.Response(404, headers={"X-Error-Code": "RepoNotFound"})
        repo = self.repos[repo_id]
        if request.method == "GET" and action in (None, "revision", "tree"):
            ref = ref or "main"
            if ref not in repo["branches"]:
                return httpx2.Response(404, headers={"X-Error-Code": "RevisionNotFound"})
            blobs = [(name, len(data), git_hash(data)) for name, data in repo["branches"][ref].items()]
            if action == "tree":
                tree = [{"type": "file", "path": n, "size": z, "oid": h} for n, z, h in blobs]
                return httpx2.Response(200, json=tree)
            siblings = [{"rfilename": n, "size": z, "blobId": h} for n, z, h in blobs]
            return httpx2.Response(
                200, json={"id": repo_id, "sha": "0" * 40, "private": repo["private"], "siblings": siblings}
            )
        if request.method == "POST" and action == "branch":
            if ref in repo["branches"]:
                return httpx2.Response(409, json={"error": "Reference already exists"})
            repo["branches"][ref] = dict(repo["branches"]["main"])
            return httpx2.Response(200, json={})
        if request.method == "POST" and action == "preupload":
            files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                     for f in json.loads(request.content)["files"]]  # fmt: skip
            return httpx2.Response(200, json={"files": files})
        if request.method == "POST" and action == "discussions":
            assert json.loads(request.content)["pullRequest"] is True
            num = sum(ref.startswith("refs/pr/") for ref in repo["branches"]) + 1
            repo["branches"][f"refs/pr/{num}"] = dict(repo["branches"]["main"])
            return httpx2.Response(200, json={"num": num})
        if request.method == "GET" and action == "discussions":
            return httpx2.Response(200, json={
                "num": int(ref), "title": "pr", "author": {"name": "me"}, "createdAt": "2026-01-01T00:00:00.000Z",
                "status": "draft", "repo": {"name": repo_id, "type": "model"}, "isPullRequest": True, "events": [],
                "changes": {"base": "refs/heads/main"}, "filesWithConflicts": [],
            })  # fmt: skip
        if request.method == "POST" and action == "commit":
            if ref not in repo["branches"]:
                return httpx2.Response(404, headers={"X-Error-Code": "RevisionNotFound"})
            header, *lines = [json.loads(line) for line in request.content.decode().splitlines()]
            assert {line["key"] for line in lines} <= {"file", "deletedFile"}, "only regular files were announced"
            files = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
            deleted = [line["value"]["path"] for line in lines if line["key"] == "deletedFile"]
            repo["branches"][ref] = {
                **{name: data for name, data in repo["branches"][ref].items() if name not in deleted}, **files
            }
            self.commits.append(
                {"repo": repo_id, "ref": ref, "message": header["value"]["summary"], "files": files, "deleted": deleted}
            )
            pr = f"https://huggingface.co/{repo_id}/discussions/{ref.split('/')[-1]}" if "/pr/" in ref else None
            return httpx2.Response(200, json={
                "commitUrl": f"https://huggingface.co/{repo_id}/commit/{'1' * 40}", "commitOid": "1" * 40,
                "pullRequestUrl": pr,
            })  # fmt: skip
        raise AssertionError(f"unexpected hub request {request.method} {path}")


@pytest.fixture
def hub(monkeypatch):
    """Routes every huggingface_hub request of this process to a FakeHub; restores the real client afterwards."""
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # publish refuses to start offline
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(fake.handle)))
    try:
        yield fake
    finally:
        huggingface_hub.set_client_factory(default_client_factory)


def evaluation(model_type: str, budget_name: str, budgets: list) -> dict:
    """A small evaluation JSON in the format evaluation.evaluate_budgets writes."""
    results = [
        {
            "budget": budget,
            "cost": {"32": {"gflops": 0.01 * (i + 1), "latency_ms": 1.0, "throughput_images_per_s": 900.0,
                            "peak_memory_mib": 2.0}},
            "quality": {"cls_cosine": 0.5, "patch_cosine": 0.4, "probe_accuracy": 0.25, "segmentation_miou": None},
        }
        for i, budget in enumerate(budgets)
    ]  # fmt: skip
    return {
        "format": "corevision-evaluation/1", "model_type": model_type, "checkpoint": "final", "parameters": 100_000,
        "budget_name": budget_name, "budgets": budgets, "resolutions": [32], "quality_resolution": 32,
        "environment": {"device": "cpu", "dtype": "float32", "batch_size": 1}, "teacher": "facebook/dinov2-small",
        "datasets": {"agreement": "photos", "probe": "pets", "segmentation": None}, "teacher_cost": None,
        "results": results,
    }  # fmt: skip


@pytest.fixture(scope="module")
def veca_run(tmp_path_factory) -> Path:
    """A finished VECA run: final/ (weights, a recipe, its own preprocessor config) and eval/ (JSON and plot)."""
    run = tmp_path_factory.mktemp("veca_run")
    torch.manual_seed(0)
    save_model_folder(VecaModel(tiny_veca_config()).eval(), run / "final")  # as training's export saves it
    recipe = {"script": "training.distill_veca", "method": "veca", "teacher": "offline-dinov2-small",
              "command": f"python -m training.distill_veca --data /data/photos --output-dir {run / 'out'} --lr 0.0004",
              "data": "/data/photos", "steps": 10, "args": {"lr": 0.0004, "data": "/data/photos",
                                                             "output_dir": str(run / "out")}}
    (run / "final" / "training_recipe.json").write_text(json.dumps(recipe))
    preprocessor = json.loads((run / "final" / "preprocessor_config.json").read_text())
    (run / "final" / "preprocessor_config.json").write_text(json.dumps({**preprocessor, "image_mean": [0.5] * 3}))
    (run / "eval").mkdir()
    (run / "eval" / "evaluation.json").write_text(json.dumps(evaluation("veca", "num_cores", [2, 4, 8])))
    Image.new("RGB", (8, 8)).save(run / "eval" / "evaluation.png")
    return run


def publish_veca(run: Path, *extra: str) -> None:
    publish.main([str(run / "final"), "--evaluation", str(run / "eval" / "evaluation.json"), "--repo-id", REPO_ID,
                  *extra])  # fmt: skip


LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoModel

    source, inputs_path, outputs_path = sys.argv[1:4]
    model = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    inputs = torch.load(inputs_path)
    with torch.no_grad():
        torch.save({c: model(inputs, num_cores=c).last_hidden_state for c in (2, 8)}, outputs_path)
    """
)


@pytest.mark.slow
def test_publish_veca_sends_exactly_the_staged_files_which_load_without_the_package(tmp_path, hub, veca_run, images):
    publish_veca(veca_run)

    assert hub.requests == [
        ("GET", f"/api/models/{REPO_ID}"),  # does it exist, and with which code?
        ("POST", "/api/repos/create"),
        ("POST", "/api/validate-yaml"),
        ("POST", f"/api/models/{REPO_ID}/preupload/main"),
        ("POST", f"/api/models/{REPO_ID}/commit/main"),
    ]
    assert "visibility" not in hub.created[0]  # the namespace's default
    (commit,) = hub.commits
    files = commit["files"]
    assert set(files) == VECA_FILES
    assert commit["message"] == "Upload veca checkpoint, evaluation and model card"
    checkpoint = veca_run / "final"
    assert files["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()
    assert json.loads(files["config.json"])["auto_map"]["AutoModel"] == "modeling_veca.VecaModel"
    assert json.loads(files["preprocessor_config.json"])["image_mean"] == [0.5] * 3  # the checkpoint's own wins
    # the published recipe and evaluation name no path of this machine
    recipe = json.loads((checkpoint / "training_recipe.json").read_text())
    assert json.loads(files["training_recipe.json"]) == {
        **recipe, "data": "<photos>", "args": {"lr": 0.0004, "data": "<photos>", "output_dir": "<out>"},
        "command": "python -m training.distill_veca --data '<photos>' --output-dir '<out>' --lr 0.0004"}
    local_evaluation = json.loads((veca_run / "eval" / "evaluation.json").read_text())
    assert json.loads(files["evaluation.json"]) == {**local_evaluation, "checkpoint": REPO_ID}
    for name in ("README.md", "training_recipe.json", "evaluation.json", "config.json"):
        assert "/data/photos" not in files[name].decode() and str(veca_run) not in files[name].decode()
    assert files["evaluation.png"] == (veca_run / "eval" / "evaluation.png").read_bytes()
    card = ModelCard(files["README.md"].decode())
    assert card.data.base_model is None and "custom_code" in card.data.tags  # a VECA starts from random weights
    assert "evaluation.png" in card.text and f'"{REPO_ID}"' in card.text

    # what the hub now holds, served from an offline hub cache to a Python without corevision_hf
    (tmp_path / "downloaded").mkdir()
    for name, data in hub.files(REPO_ID).items():
        (tmp_path / "downloaded" / name).write_bytes(data)
    env = make_offline_hub_cache(tmp_path, tmp_path / "downloaded", REPO_ID)
    outputs = load_without_package(tmp_path, LOADER, REPO_ID, images, env=env)
    model = VecaModel.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        for num_cores in (2, 8):
            torch.testing.assert_close(outputs[num_cores], model(images, num_cores=num_cores).last_hidden_state,
                                       atol=0, rtol=0)  # fmt: skip


def test_publish_bfloat16_lookwhere_without_recipe_or_plot(tmp_path, hub):
    """What is sent; the weights keep their dtype. (Hub loading of LookWhere folders: test_modeling_lookwhere.)"""
    LookWhereModel(tiny_lookwhere_config()).to(torch.bfloat16).save_pretrained(tmp_path / "final")
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation("lookwhere", "k_ratio", [0.25, 1.0])))
    publish.main([str(tmp_path / "final"), "--evaluation", str(tmp_path / "evaluation.json"), "--repo-id", REPO_ID])

    (commit,) = hub.commits
    files = commit["files"]
    assert set(files) == LOOKWHERE_FILES
    assert files["model.safetensors"] == (tmp_path / "final" / "model.safetensors").read_bytes()
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModel"] == "modeling_lookwhere.LookWhereModel" and config["dtype"] == "bfloat16"
    card = ModelCard(files["README.md"].decode())
    assert "k_ratio=" in card.text and "evaluation.png" not in card.text


# appended to the card's snippet: what it computed, for the comparison in this process
SAVE_SNIPPET_OUTPUTS = """
torch.save({"pixel_values": inputs["pixel_values"], "last_hidden_state": out.last_hidden_state,
            "pooler_output": out.pooler_output}, sys.argv[3])
"""


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["veca", "lookwhere"])
def test_the_published_cards_usage_snippet_runs_as_written(tmp_path, hub, veca_run, model_type):
    """The card's Python block, verbatim, on a real photo in a Python without corevision_hf, against the published
    repo served from an offline hub cache: it gets the processor's pixels and the model's outputs at its budget."""
    if model_type == "veca":
        publish_veca(veca_run)
        checkpoint, processor_class = veca_run / "final", VecaImageProcessor
    else:
        checkpoint, processor_class = tmp_path / "final", LookWhereImageProcessor
        torch.manual_seed(0)
        save_model_folder(LookWhereModel(tiny_lookwhere_config()), checkpoint)  # k_ratio 0.25
        (tmp_path / "evaluation.json").write_text(json.dumps(evaluation("lookwhere", "k_ratio", [0.25, 1.0])))
        publish.main([str(checkpoint), "--evaluation", str(tmp_path / "evaluation.json"), "--repo-id", REPO_ID])
    card = hub.files(REPO_ID)["README.md"].decode()
    snippet = card.split("## Usage", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "downloaded").mkdir()
    for name, data in hub.files(REPO_ID).items():
        (tmp_path / "downloaded" / name).write_bytes(data)
    photo = Path(__file__).resolve().parents[1] / "assets" / "photos" / "chelsea.jpg"
    (tmp_path / "image.jpg").write_bytes(photo.read_bytes())  # the file name the snippet opens, where it runs

    env = make_offline_hub_cache(tmp_path, tmp_path / "downloaded", REPO_ID)
    saved = load_without_package(tmp_path, "import torch\n" + snippet + SAVE_SNIPPET_OUTPUTS, REPO_ID,
                                 torch.zeros(0), env=env)  # fmt: skip

    size = int(re.search(r'size=\{"shortest_edge": (\d+)\}', snippet)[1])
    name, value = re.search(r"model\(\*\*inputs, (num_cores|k_ratio)=([\d.]+)\)", snippet).groups()
    expected_pixels = processor_class.from_pretrained(checkpoint)(Image.open(photo), return_tensors="pt",
                                                                  size={"shortest_edge": size})["pixel_values"]
    torch.testing.assert_close(saved["pixel_values"], expected_pixels, atol=0, rtol=0)
    model = AutoModel.from_pretrained(checkpoint).eval()
    with torch.inference_mode():
        out = model(expected_pixels, **{name: int(value) if name == "num_cores" else float(value)})
    torch.testing.assert_close(saved["last_hidden_state"], out.last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(saved["pooler_output"], out.pooler_output, atol=0, rtol=0)


ELASTIC_ONNX = "onnx/model_elastic.onnx"


@pytest.mark.parametrize("model_type, onnx_elastic", [("veca", True), ("lookwhere", True), ("veca", False)])
def test_onnx_elastic_publishes_the_graph_whose_card_block_matches_pytorch(tmp_path, hub, veca_run, images,
                                                                          monkeypatch, model_type, onnx_elastic):
    """With --onnx-elastic, the staged and sent repo holds onnx/model_elastic.onnx, and the card's onnxruntime block,
    as written, fetches it from the published repo and gives the model's outputs at the card's budget; without, the
    repo and the card have no graph."""
    flags = ["--onnx-elastic"] if onnx_elastic else []
    if model_type == "veca":
        checkpoint = veca_run / "final"
        publish_veca(veca_run, *flags, "--staging-dir", str(tmp_path / "staged"))
    else:
        checkpoint = tmp_path / "final"
        torch.manual_seed(0)
        LookWhereModel(tiny_lookwhere_config()).save_pretrained(checkpoint)  # k_ratio 0.25
        (tmp_path / "evaluation.json").write_text(json.dumps(evaluation("lookwhere", "k_ratio", [0.25, 1.0])))
        publish.main([str(checkpoint), "--evaluation", str(tmp_path / "evaluation.json"), "--repo-id", REPO_ID,
                      "--staging-dir", str(tmp_path / "staged"), *flags])
    files = hub.files(REPO_ID)
    card = files["README.md"].decode()
    if not onnx_elastic:
        assert ELASTIC_ONNX not in files and not (tmp_path / "staged" / "onnx").exists() and ELASTIC_ONNX not in card
        return
    assert files[ELASTIC_ONNX] == (tmp_path / "staged" / ELASTIC_ONNX).read_bytes()
    assert set(files) - {ELASTIC_ONNX} == (VECA_FILES if model_type == "veca" else LOOKWHERE_FILES)

    (tmp_path / "downloaded" / "onnx").mkdir(parents=True)
    for name, data in files.items():
        (tmp_path / "downloaded" / name).write_bytes(data)
    cache = make_offline_hub_cache(tmp_path, tmp_path / "downloaded", REPO_ID)["HF_HUB_CACHE"]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    huggingface_hub.set_client_factory(default_client_factory)  # which refuses every request offline
    block = card.split("## Usage", 1)[1].split("```python\n", 2)[2].split("```", 1)[0]
    namespace = {"inputs": {"pixel_values": images}}
    exec(block, namespace)

    name, value = re.search(r'"(num_cores|k_ratio)": numpy\.array\(([\d.]+)\)', block).groups()
    model = AutoModel.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(images, **{name: int(value) if name == "num_cores" else float(value)})
    for actual, wanted in zip((namespace["last_hidden_state"], namespace["pooler_output"]),
                              (expected.last_hidden_state, expected.pooler_output)):
        torch.testing.assert_close(torch.from_numpy(actual), wanted, atol=1e-4, rtol=0)


def test_onnx_elastic_does_not_overwrite_another_graph_of_that_name_without_force(hub, veca_run):
    hub.add_repo(REPO_ID, {ELASTIC_ONNX: b"the user's export"})
    with pytest.raises(RuntimeError, match=rf"already holds another model \(its {ELASTIC_ONNX} differ.*--force"):
        publish_veca(veca_run, "--onnx-elastic")
    assert hub.commits == [] and hub.files(REPO_ID) == {ELASTIC_ONNX: b"the user's export"}


@pytest.mark.parametrize(
    "flags, create, ref",
    [
        (["--private"], {"visibility": "private"}, "main"),
        (["--revision", "v1"], {}, "v1"),
        (["--create-pr"], {}, "refs/pr/1"),
    ],
    ids=["private", "revision", "create_pr"],
)
def test_private_revision_and_create_pr(hub, veca_run, flags, create, ref):
    publish_veca(veca_run, *flags, "--commit-message", "first release")

    assert hub.created[0].items() >= create.items()
    assert hub.repos[REPO_ID]["private"] == ("--private" in flags)
    (commit,) = hub.commits
    assert commit["ref"] == ref and commit["message"] == "first release" and set(commit["files"]) == VECA_FILES
    assert set(hub.files(REPO_ID, ref)) == VECA_FILES
    if ref != "main":
        assert hub.files(REPO_ID) == {}  # the default branch is untouched
    assert (("POST", f"/api/models/{REPO_ID}/branch/v1") in hub.requests) == ("--revision" in flags)
    assert (("POST", f"/api/models/{REPO_ID}/discussions") in hub.requests) == ("--create-pr" in flags)


def test_dry_run_lists_the_files_and_sends_nothing(tmp_path, hub, veca_run, capsys):
    publish_veca(veca_run, "--dry-run", "--private", "--staging-dir", str(tmp_path / "staged"))

    assert hub.requests == []
    out = capsys.readouterr().out
    assert f"Would upload {len(VECA_FILES)} files to {REPO_ID} (main, private)" in out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert listed == VECA_FILES == {path.name for path in (tmp_path / "staged").iterdir()}


def test_existing_repo_with_other_code_needs_force(hub, veca_run, capsys):
    other_code = {"modeling_veca.py": b"# another model\n", "rope.py": b"# its helper\n"}
    hub.add_repo(REPO_ID, {"config.json": b"{}", "weights.bin": b"old", "notes.txt": b"kept",
                           "onnx/model.onnx": b"the user's export", **other_code})
    with pytest.raises(RuntimeError, match=r"already holds another model \(its config.json, modeling_veca.py "
                                           r"differ.*--force"):
        publish_veca(veca_run)
    with pytest.raises(RuntimeError, match="already holds another model"):
        publish_veca(veca_run, "--revision", "v2")  # a new branch starts from the default one
    assert hub.requests == [
        ("GET", f"/api/models/{REPO_ID}"),
        ("GET", f"/api/models/{REPO_ID}/revision/v2"),
        ("GET", f"/api/models/{REPO_ID}"),
    ]  # nothing written

    publish_veca(veca_run, "--force")
    out = capsys.readouterr().out
    assert "--force: overwriting" in out and "not ours to delete: onnx/model.onnx, rope.py, weights.bin" in out
    # files of the names we send are overwritten (the repo's history keeps them); none is deleted
    assert set(hub.files(REPO_ID)) == VECA_FILES | {"notes.txt", "onnx/model.onnx", "rope.py", "weights.bin"}
    assert hub.files(REPO_ID)["onnx/model.onnx"] == b"the user's export" and hub.commits[0]["deleted"] == []
    ours = (Path(publish.__file__).parents[1] / "src/corevision_hf/veca/modeling_veca.py").read_bytes()
    assert hub.files(REPO_ID)["modeling_veca.py"] == ours

    publish_veca(veca_run)  # the same model again (a new evaluation, say) needs no --force
    assert len(hub.commits) == 2


@pytest.mark.parametrize("changed", ["config.json", "model.safetensors"])
def test_the_same_code_with_other_weights_or_config_is_another_model(hub, veca_run, changed):
    publish_veca(veca_run)
    files = hub.files(REPO_ID)
    files[changed] = files[changed] + b" "  # our code, but another checkpoint's config or weights
    with pytest.raises(RuntimeError, match=rf"already holds another model \(its {changed} differ"):
        publish_veca(veca_run)
    assert len(hub.commits) == 1


CODE_REPO = "org/corevision-code"


def code_repo_files() -> dict[str, bytes]:
    """What a code repo serving VECA holds: this package's hub files of VECA, and a README."""
    return {**publish.code_files("veca"), "README.md": b"# corevision code\n"}


def test_code_repo_makes_the_weight_repo_name_one_code_repo_at_a_pinned_commit(hub, veca_run):
    hub.add_repo(CODE_REPO, code_repo_files())
    publish_veca(veca_run, "--code-repo", CODE_REPO)

    assert ("GET", f"/api/models/{CODE_REPO}") in hub.requests  # its commit and files, checked before any work
    (commit,) = hub.commits
    files = commit["files"]
    assert commit["repo"] == REPO_ID and set(files) == {name for name in VECA_FILES if not name.endswith(".py")}
    config, preprocessor = json.loads(files["config.json"]), json.loads(files["preprocessor_config.json"])
    assert config["auto_map"] == {key: f"{CODE_REPO}--{value}" for key, value in {
        "AutoConfig": "configuration_veca.VecaConfig", "AutoModel": "modeling_veca.VecaModel",
        "AutoModelForImageClassification": "modeling_veca.VecaForImageClassification",
        "AutoBackbone": "modeling_veca.VecaBackbone"}.items()}
    assert config["custom_pipelines"]["image-feature-extraction"]["impl"] == (
        f"{CODE_REPO}--pipeline_veca.VecaImageFeatureExtractionPipeline")
    assert preprocessor["auto_map"] == {"AutoImageProcessor": f"{CODE_REPO}--image_processing_veca.VecaImageProcessor"}
    card = files["README.md"].decode()
    assert f'trust_remote_code=True, code_revision="{"0" * 40}"' in card and f"[{CODE_REPO}](" in card
    assert hub.files(CODE_REPO) == code_repo_files()  # the code repo is only read


@pytest.mark.slow
def test_weights_and_code_from_two_repos_load_without_the_package(tmp_path, hub, veca_run, images):
    hub.add_repo(CODE_REPO, code_repo_files())
    publish_veca(veca_run, "--code-repo", CODE_REPO)
    for repo_id in (REPO_ID, CODE_REPO):  # both served from one offline hub cache, the code at the pinned commit
        folder = tmp_path / repo_id.replace("/", "--")
        folder.mkdir()
        for name, data in hub.files(repo_id).items():
            (folder / name).write_bytes(data)
        env = make_offline_hub_cache(tmp_path, folder, repo_id, commit="0" * 40)
    loader = LOADER.replace("trust_remote_code=True", f'trust_remote_code=True, code_revision="{"0" * 40}"')
    outputs = load_without_package(tmp_path, loader, REPO_ID, images, env=env)
    model = VecaModel.from_pretrained(veca_run / "final").eval()
    with torch.no_grad():
        for num_cores in (2, 8):
            torch.testing.assert_close(outputs[num_cores], model(images, num_cores=num_cores).last_hidden_state,
                                       atol=0, rtol=0)


@pytest.mark.parametrize("case, message", [
    ("missing", f"error: --code-repo {CODE_REPO} does not exist on the hub: create it and upload"),
    ("other code", f"error: {CODE_REPO} at {'0' * 40} lacks this package's modeling_veca.py (missing or other code)"),
    ("no such revision", f"error: --code-repo {CODE_REPO} has no revision 'v9'"),
])
def test_a_code_repo_that_cannot_serve_is_one_line(hub, veca_run, capsys, case, message):
    extra = ["--code-revision", "v9"] if case == "no such revision" else []
    if case != "missing":
        hub.add_repo(CODE_REPO, {**code_repo_files(), "modeling_veca.py": b"# other code\n"} if case == "other code"
                     else code_repo_files())
    code = publish.cli([str(veca_run / "final"), "--evaluation", str(veca_run / "eval" / "evaluation.json"),
                        "--repo-id", REPO_ID, "--code-repo", CODE_REPO, *extra])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and error.startswith(message)
    assert hub.commits == []


def test_a_dry_run_with_a_code_repo_needs_its_revision(tmp_path, hub, veca_run):
    with pytest.raises(ValueError, match="--dry-run asks the hub nothing, so it cannot look up the commit"):
        publish_veca(veca_run, "--dry-run", "--code-repo", CODE_REPO)
    publish_veca(veca_run, "--dry-run", "--code-repo", CODE_REPO, "--code-revision", "v1", "--staging-dir",
                 str(tmp_path / "staged"))
    assert hub.requests == [] and not list((tmp_path / "staged").glob("*.py"))
    config = json.loads((tmp_path / "staged" / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == f"{CODE_REPO}--modeling_veca.VecaModel"


BAD_INPUTS = {
    "no_weights": "holds no weights",
    "missing_evaluation": "does not exist: run python -m evaluation.evaluate_budgets",
    "invalid_json": "is not valid JSON",
    "wrong_format": "is not a 'corevision-evaluation/1' evaluation",
    "model_type_mismatch": "evaluates a 'lookwhere' model but .* holds a 'veca' one",
    "no_results": "no results",
    "no_namespace": "is not a hub repo id",
    "bad_repo_id": "is not a hub repo id",
    "pr_to_branch": "--create-pr opens a pull request against the default branch",
    "bad_code_repo": "--code-repo 'corevision code' is not a hub repo id",
    "revision_without_code_repo": "--code-revision pins the code of --code-repo",
    "onnx_elastic_without_onnxruntime": "--onnx-elastic writes the graph with onnx and checks it with onnxruntime: pip",
}
BAD_EVALUATIONS = {
    "invalid_json": "{not json",
    "wrong_format": json.dumps({"format": "other"}),
    "model_type_mismatch": json.dumps(evaluation("lookwhere", "k", [4])),
    "no_results": json.dumps(evaluation("veca", "num_cores", [])),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_a_clear_error_before_any_work(tmp_path, hub, veca_run, monkeypatch, case):
    monkeypatch.setattr(publish, "stage", lambda *args: pytest.fail("staged before the inputs were checked"))
    checkpoint, evaluation_path = veca_run / "final", veca_run / "eval" / "evaluation.json"
    repo_id, extra = REPO_ID, []
    if case == "no_weights":
        checkpoint = tmp_path / "final"
        checkpoint.mkdir()
        (checkpoint / "config.json").write_bytes((veca_run / "final" / "config.json").read_bytes())
    elif case == "missing_evaluation":
        evaluation_path = tmp_path / "evaluation.json"
    elif case in BAD_EVALUATIONS:
        evaluation_path = tmp_path / "evaluation.json"
        evaluation_path.write_text(BAD_EVALUATIONS[case])
    elif case == "no_namespace":
        repo_id = "veca-tiny"
    elif case == "bad_repo_id":
        repo_id = "org/veca tiny"
    elif case == "pr_to_branch":
        extra = ["--create-pr", "--revision", "v1"]
    elif case == "bad_code_repo":
        extra = ["--code-repo", "corevision code"]
    elif case == "revision_without_code_repo":
        extra = ["--code-revision", "v1"]
    elif case == "onnx_elastic_without_onnxruntime":
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed: importing it fails
        extra = ["--onnx-elastic"]

    with pytest.raises((ValueError, FileNotFoundError), match=BAD_INPUTS[case]):
        publish.main([str(checkpoint), "--evaluation", str(evaluation_path), "--repo-id", repo_id, *extra])
    assert hub.requests == []


def test_no_network_is_one_clear_line(veca_run, monkeypatch, capsys):
    def unreachable(request):
        raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(unreachable)))
    try:
        code = publish.cli([str(veca_run / "final"), "--evaluation", str(veca_run / "eval" / "evaluation.json"),
                            "--repo-id", REPO_ID])
    finally:
        huggingface_hub.set_client_factory(default_client_factory)
    error = capsys.readouterr().err  # after the progress bars of staging, one line and no traceback
    assert code == 2 and "Traceback" not in error and error.count("error: ") == 1
    last = error.rstrip().splitlines()[-1]
    assert last.startswith("error: Could not reach the hub (ConnectError") and "--dry-run" in last


def test_bad_input_from_the_command_line_is_one_line(tmp_path, veca_run, capsys):
    code = publish.cli([str(tmp_path / "missing"), "--evaluation", str(veca_run / "eval" / "evaluation.json"),
                        "--repo-id", REPO_ID, "--dry-run"])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and "does not exist: pass a save_pretrained folder" in error


STAGED_KINDS = ["final/model.safetensors", "final/config.json", "final/preprocessor_config.json",
                "final/training_recipe.json", "eval/evaluation.json", "eval/evaluation.png", "eval/features.png"]


@pytest.mark.parametrize("kind", STAGED_KINDS)
def test_a_staged_file_that_is_a_link_is_refused_naming_it(tmp_path, hub, veca_run, kind, capsys):
    """A link where publish reads a file it stages (here to a copy of the real file kept elsewhere, so that only the
    link can make it fail) is one line naming it, before anything is staged: a link could publish any file it
    points at (a secret), the way a picture outside the evaluation's folder would."""
    run = tmp_path / "run"
    for folder in ("final", "eval"):
        shutil.copytree(veca_run / folder, run / folder)
    record = json.loads((run / "eval" / "evaluation.json").read_text())
    (run / "eval" / "evaluation.json").write_text(json.dumps({**record, "pictures": {"features": "features.png"}}))
    Image.new("RGB", (8, 8)).save(run / "eval" / "features.png")
    # a picture linking out of its folder is refused as such already: this one links inside it
    elsewhere = (run / "eval" / "kept" if kind == "eval/features.png" else tmp_path / "elsewhere") / kind
    elsewhere.parent.mkdir(parents=True)
    shutil.move(run / kind, elsewhere)
    (run / kind).symlink_to(elsewhere)
    code = publish.cli([str(run / "final"), "--evaluation", str(run / "eval" / "evaluation.json"), "--repo-id",
                        REPO_ID, "--dry-run", "--staging-dir", str(tmp_path / "staged")])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1, error
    assert error.startswith(f"error: {run / kind} is a symbolic link: publish")
    assert hub.requests == [] and not (tmp_path / "staged").exists()


CLASSES = {0: "cat", 1: "dog", 2: "fox"}
CLASSIFIER_FILES = (VECA_FILES - {"evaluation.json", "evaluation.png"}) | {"heldout.json", "validation.json"}


def finetuned_folder(folder: Path, model_type: str, *flags: str, heldout: bool = True) -> Path:
    """best/ as `python -m training.finetune` leaves it: the classifier and its processor, training_recipe.json (the
    script's own arguments and recipe writer), validation.json and, unless `heldout` is False, heldout.json."""
    from types import SimpleNamespace

    from training import finetune
    from training.checkpointing import training_recipe

    labels = {"num_labels": 3, "id2label": CLASSES, "label2id": {name: i for i, name in CLASSES.items()}}
    config = tiny_veca_config(**labels) if model_type == "veca" else tiny_lookwhere_config(**labels)
    model_class = VecaForImageClassification if model_type == "veca" else LookWhereForImageClassification
    torch.manual_seed(0)
    save_model_folder(model_class(config).eval(), folder)
    args = finetune.parse_args([str(folder.parent / "distilled"), "--data", "/data/pets/train", "--eval-data",
                                "/data/pets/heldout", "--output-dir", str(folder.parent), "--image-size", "32", *flags])
    recipe = training_recipe(SimpleNamespace(num_processes=1, mixed_precision="no"), finetune.SCRIPT, args, model_type)
    (folder / "training_recipe.json").write_text(json.dumps(recipe))
    (folder / "validation.json").write_text(json.dumps({"epoch": 1, "loss": 0.5, "accuracy": 0.75, "images": 8}))
    if heldout:
        (folder / "heldout.json").write_text(json.dumps({"data": "/data/pets/heldout", "loss": 0.4, "accuracy": 0.8125,
                                                         "images": 16}))
    return folder


SAVE_CLASSIFIER_OUTPUTS = """
torch.save({"pixel_values": inputs["pixel_values"], "logits": logits}, sys.argv[3])
"""


@pytest.mark.slow
@pytest.mark.parametrize("model_type, flags, budget", [("veca", ["--eval-num-cores", "4"], {"num_cores": 4}),
                                                       ("lookwhere", ["--no-hflip"], {"k_ratio": 0.25})])
def test_a_fine_tuned_classifier_is_published_as_a_classifier_whose_usage_runs(tmp_path, hub, model_type, flags,
                                                                               budget):
    """No --evaluation: the repo gets the classifier, its held-out and validation results (no local path) and a
    classifier's card, whose Python block, verbatim, in a Python without corevision_hf, gives the model's logits at
    the budget the accuracy was scored at."""
    checkpoint = finetuned_folder(tmp_path / "run" / "best", model_type, *flags)
    publish.main([str(checkpoint), "--repo-id", REPO_ID])
    (commit,) = hub.commits
    files = commit["files"]
    expected = CLASSIFIER_FILES if model_type == "veca" else {
        name.replace("veca", "lookwhere") for name in CLASSIFIER_FILES}
    assert set(files) == expected
    assert json.loads(files["heldout.json"]) == {"data": "<heldout>", "loss": 0.4, "accuracy": 0.8125, "images": 16}
    config = json.loads(files["config.json"])
    assert config["id2label"] == {str(i): name for i, name in CLASSES.items()}
    assert config["auto_map"]["AutoModelForImageClassification"].endswith("ForImageClassification")
    card = ModelCard(files["README.md"].decode())
    assert card.data.pipeline_tag == "image-classification" and card.data.eval_results[0].metric_value == 0.8125
    recipe = json.loads(files["training_recipe.json"])
    assert recipe["command"].startswith("python -m training.finetune '<distilled>' --data '<train>'")
    assert recipe["command"] in card.text and ("--no-hflip" in recipe["command"]) == ("--no-hflip" in flags)
    for name in ("README.md", "training_recipe.json", "heldout.json", "config.json"):
        assert "/data/" not in files[name].decode() and str(tmp_path) not in files[name].decode()

    snippet = card.text.split("## Usage", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "downloaded").mkdir()
    for name, data in hub.files(REPO_ID).items():
        (tmp_path / "downloaded" / name).write_bytes(data)
    photo = Path(__file__).resolve().parents[1] / "assets" / "photos" / "chelsea.jpg"
    (tmp_path / "image.jpg").write_bytes(photo.read_bytes())
    env = make_offline_hub_cache(tmp_path, tmp_path / "downloaded", REPO_ID)
    saved = load_without_package(tmp_path, "import torch\n" + snippet + SAVE_CLASSIFIER_OUTPUTS, REPO_ID,
                                 torch.zeros(0), env=env)
    model = AutoModelForImageClassification.from_pretrained(checkpoint).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    pixel_values = processor(Image.open(photo), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(saved["pixel_values"], pixel_values, atol=0, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(saved["logits"], model(pixel_values, **budget).logits, atol=0, rtol=0)


def test_a_classifier_is_staged_with_its_results_and_refused_without_a_held_out_accuracy(tmp_path, hub, veca_run):
    checkpoint = finetuned_folder(tmp_path / "run" / "best", "veca")
    publish.main([str(checkpoint), "--repo-id", REPO_ID, "--dry-run", "--staging-dir", str(tmp_path / "staged")])
    assert {path.name for path in (tmp_path / "staged").iterdir()} == CLASSIFIER_FILES and hub.requests == []
    cases = [
        ([str(checkpoint), "--evaluation", str(veca_run / "eval" / "evaluation.json")],
         "is an image classifier: its card quotes its own heldout.json, not a feature evaluation; leave --evaluation"),
        ([str(checkpoint), "--onnx-elastic"], "the elastic graph is the feature extractor's alone: leave --onnx"),
        ([str(finetuned_folder(tmp_path / "run" / "final", "veca", heldout=False))],
         "no heldout.json, so its card would have no held-out accuracy: publish the folder --eval-data scored"),
        ([str(veca_run / "final")], "is a distilled veca checkpoint, whose card is built from its evaluation: pass "
                                    "--evaluation"),
    ]
    for argv, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            publish.main([*argv, "--repo-id", REPO_ID, "--dry-run"])
