"""The web page (web/): a tiny model's elastic graph served by web/serve.py, run by onnxruntime-web in headless
Chromium at two budgets, against onnxruntime in Python.

Chromium is driven as in test_app.py (DevTools over a pipe); the test is skipped, with the reason, where Chromium
(Debian's `chromium`) or the npm packages (`npm ci` in web/; `make web` and .ci/run install both) are absent.
"""

import base64
import functools
import http.server
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from PIL import Image
from test_app import CHROMIUM, SCREENSHOT_DIR, DevTools, free_port, wait_for, wait_until_listening

from corevision_hf import LookWhereModel, VecaModel, save_model_folder
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio


ROOT = Path(__file__).resolve().parents[1]
ORT_WEB = ROOT / "web" / "node_modules" / "onnxruntime-web"
# Per model: the image side in px and two budgets, the higher one doing over four times the work of the lower, so that
# the medians of alternated calls order them even on a busy machine. VECA (width 256, patch 8): 16 patches, and 1 core
# (17 tokens) against 64 (80 tokens, the cores attending to all); LookWhere (patch 4): 1024 patches, 10% of them
# through the extractor against all of them.
CASES = {
    "veca": (lambda: VecaModel(tiny_veca_config(num_cores=64, hidden_size=256, intermediate_size=384)), 32, (1, 64)),
    "lookwhere": (lambda: LookWhereModel(tiny_lookwhere_config()), 128, (0.1, 1.0)),
    "lookwhere-k_mass": (lambda: LookWhereModel(tiny_lookwhere_config()), 128, (0.1, 1.0)),  # `serve.py --elastic k_mass`
}
BUDGET_INPUTS = {"veca": "num_cores", "lookwhere": "k_ratio", "lookwhere-k_mass": "k_mass"}
TIMED_ROUNDS = 9
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="no Node.js here (Debian: apt-get install nodejs)")
def test_the_page_keeps_the_models_k_for_a_k_ratio():
    """web/budget.js's k for a k_ratio is the model's, over every two-decimal ratio and a few grids: 0.29 of 100
    patches keeps 29 (the float product is 28.999...)."""
    cases = [[j / 100, patches] for j in range(1, 101) for patches in (1, 7, 64, 100, 400, 1369)]
    script = (f"import {{ keptForRatio }} from {json.dumps((ROOT / 'web' / 'budget.js').as_uri())};"
              f"console.log(JSON.stringify({json.dumps(cases)}.map(([r, n]) => keptForRatio(r, n))));")
    result = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [kept_for_ratio(ratio, patches) for ratio, patches in cases]
    assert kept_for_ratio(0.29, 100) == 29 and kept_for_ratio(0.57, 100) == 57 and kept_for_ratio(0.01, 7) == 1


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run does)")
@pytest.mark.skipif(not ORT_WEB.is_dir(), reason="onnxruntime-web is not installed: run `npm ci` in web/ (make web does)")
@pytest.mark.parametrize("name", ["veca", "lookwhere", "lookwhere-k_mass"])
def test_the_page_gives_onnxruntimes_features_and_a_lower_budget_is_not_slower(tmp_path, name):
    build, side, (low, high) = CASES[name]
    torch.manual_seed(0)
    model = build()
    save_model_folder(model, tmp_path / "checkpoint")  # the page normalises with the processor's mean and std
    patch = model.config.patch_size
    photo = Image.open(ROOT / "assets" / "photos" / "chelsea.jpg").convert("RGB")
    photo.resize((side, side)).save(tmp_path / "photo.png")  # PNG: the browser and PIL decode the same bytes
    photo.resize((side + 2, side)).save(tmp_path / "uneven.png")

    port = free_port()
    served = tmp_path / "served"
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "web" / "serve.py"), str(tmp_path / "checkpoint"), "--model-dir", str(served),
         "--port", str(port), *(["--elastic", "k_mass"] if name == "lookwhere-k_mass" else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    browser = None
    try:
        wait_until_listening(server, port, 120, "web/serve.py to export the graph and listen")
        browser = DevTools(tmp_path / "chromium-profile", width=900, height=700)
        target = browser.call("Target.createTarget", url=f"http://127.0.0.1:{port}/")["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

        def evaluate(expression: str):
            answer = browser.call("Runtime.evaluate", session, expression=expression, awaitPromise=True,
                                  returnByValue=True)
            assert "exceptionDetails" not in answer, answer["exceptionDetails"]
            return answer["result"].get("value")

        def choose(path: Path) -> None:  # as a user picks a file
            element = browser.call("Runtime.evaluate", session, expression="document.querySelector('#image')")
            browser.call("DOM.setFileInputFiles", session, files=[str(path)], objectId=element["result"]["objectId"])
            wait_for(lambda: evaluate("window.corevision.state.chosen !== undefined"), 10, "the page to take the file")

        def loaded():
            try:
                return evaluate("window.corevision !== undefined")
            except RuntimeError:  # no page to evaluate in yet
                return False

        wait_for(loaded, 60, "the page's script")
        budget_input = evaluate("window.corevision.ready")
        # On load, before any file is picked: the sample photo, its features, the budget beside the slider, a latency.
        sample = evaluate("window.corevision.state.sample.then(() => ['#photo', '#features'].map((id) => "
                          "[document.querySelector(id).width, document.querySelector(id).height]).concat(["
                          "document.querySelector('#budget').value, document.querySelector('#budget-value').textContent,"
                          " document.querySelector('#latency').textContent, "
                          "document.querySelector('#image-name').textContent]))")
        choose(tmp_path / "photo.png")
        evaluate("window.corevision.state.chosen.then(() => true)")  # its first run, at the slider's default budget
        pixels = np.array(evaluate("Array.from(window.corevision.state.image.pixels)"), dtype=np.float32)
        results = {budget: evaluate(f"window.corevision.run({budget})") for budget in (low, high)}
        latency_text = evaluate("document.querySelector('#latency').textContent")
        colours = evaluate("(() => { const c = document.querySelector('#features'); const d = c.getContext('2d')"
                           ".getImageData(0, 0, c.width, c.height).data; const s = new Set();"
                           " for (let i = 0; i < d.length; i += 4) s.add(d[i] * 65536 + d[i + 1] * 256 + d[i + 2]);"
                           " return [c.width, c.height, s.size]; })()")
        shot = base64.b64decode(browser.call("Page.captureScreenshot", session, format="png")["data"])
        folder = Path(SCREENSHOT_DIR or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"web_page_{name}.png").write_bytes(shot)

        # Latency: the two budgets alternated, after a call of each, so that the machine's drift hits both alike.
        times = {low: [], high: []}
        for _ in range(TIMED_ROUNDS):
            for budget in (low, high):
                times[budget].append(evaluate(f"window.corevision.run({budget}).then(r => r.ms)"))

        choose(tmp_path / "uneven.png")
        error = wait_for(lambda: evaluate("document.querySelector('#error').textContent"), 10, "the page's error")
    finally:
        if browser is not None:
            browser.close()
        server.kill()
        server.wait(timeout=10)

    assert budget_input == BUDGET_INPUTS[name]
    cropped = [451 // patch * patch, 300 // patch * patch]  # assets/photos/chelsea.jpg, cropped to whole patches
    assert sample[0] == cropped and sample[1] == cropped, sample
    assert sample[3] == sample[2] != "" and "ms this call" in sample[4] and sample[5].startswith("The sample photo")
    # The page's pixels are the processor's: rescaled to [0, 1], normalised with its mean and std, at the image's size.
    processor = json.loads((served / "preprocessor_config.json").read_text())
    mean, std = np.array(processor["image_mean"]), np.array(processor["image_std"])
    expected_pixels = ((np.asarray(Image.open(tmp_path / "photo.png"), np.float64) / 255 - mean) / std).transpose(2, 0, 1)
    np.testing.assert_allclose(pixels.reshape(3, side, side), expected_pixels.astype(np.float32), atol=1e-6, rtol=0)

    graph = onnxruntime.InferenceSession(str(served / "onnx" / "model_elastic.onnx"), providers=["CPUExecutionProvider"])
    cells = (side // patch) ** 2
    for budget, result in results.items():
        feed = {"pixel_values": expected_pixels[None].astype(np.float32),
                budget_input: np.array(budget, dtype=np.int64 if budget_input == "num_cores" else np.float64)}
        expected = graph.run(None, feed)[0][0, -cells:]
        page = np.array(result["features"], dtype=np.float32).reshape(expected.shape)
        assert np.abs(page - expected).max() <= 1e-3, (budget, np.abs(page - expected).max())

    assert "ms this call" in latency_text and colours[:2] == [side, side] and colours[2] > cells // 2  # a picture, not a fill
    print(f"page latency medians, {name}: " + ", ".join(f"{b}: {statistics.median(t):.1f} ms" for b, t in times.items()))
    assert statistics.median(times[low]) <= statistics.median(times[high]), times
    assert error == (f"This image is {side + 2}x{side} px; the graph takes sides that are multiples of the {patch} px "
                     f"patch: crop or resize it to {side}x{side} px.")


def load_serve():
    spec = importlib.util.spec_from_file_location("web_serve", ROOT / "web" / "serve.py")
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    return serve


def test_serving_into_a_folder_of_the_users_replaces_none_of_its_files(tmp_path):
    """The page's folder holds the user's own config.json: refused before anything is written; a folder serve.py
    prepared itself is prepared again."""
    serve = load_serve()
    torch.manual_seed(0)
    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "veca")
    LookWhereModel(tiny_lookwhere_config()).save_pretrained(tmp_path / "lookwhere")
    user = tmp_path / "user"
    user.mkdir()
    (user / "config.json").write_text('{"the": "user\'s"}')
    with pytest.raises(ValueError, match=r"holds config.json, which corevision_hf did not write .* another --model-dir"):
        serve.prepare(str(tmp_path / "lookwhere"), user)
    assert sorted(p.name for p in user.iterdir()) == ["config.json"]
    assert (user / "config.json").read_text() == '{"the": "user\'s"}'

    served = tmp_path / "served"
    serve.prepare(str(tmp_path / "veca"), served)
    serve.prepare(str(tmp_path / "lookwhere"), served)  # ours: replaced, graph and config together
    assert json.loads((served / "config.json").read_text())["model_type"] == "lookwhere"


def test_the_page_gets_the_sample_photo_it_shows_on_load(tmp_path):
    serve = load_serve()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(serve.Handler, model_dir=tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/sample.jpg", timeout=10) as answer:
            assert answer.headers["Content-Type"] == "image/jpeg"
            assert answer.read() == (ROOT / "assets" / "photos" / "chelsea.jpg").read_bytes()
    finally:
        server.shutdown()
        server.server_close()
    page = (ROOT / "web" / "app.js").read_text()
    assert 'const SAMPLE = "sample.jpg"' in page and "ready.then(showSample)" in page


def test_a_nul_byte_in_a_request_is_a_404_not_a_traceback(tmp_path, capfd):
    serve = load_serve()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(serve.Handler, model_dir=tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for path in ("/model/%00", "/%00"):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=10)
            assert answer.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capfd.readouterr().err


def test_no_link_in_the_model_folder_is_followed(tmp_path):
    """Over loopback: a file of the model folder is served; a link planted there (to a file or folder outside, to a
    file inside, or at a folder's index page) is a 404, so nothing outside the folder is served or listed."""
    serve = load_serve()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside")
    served = tmp_path / "served"
    (served / "onnx").mkdir(parents=True)
    (served / "config.json").write_text('{"model_type": "veca"}')
    (served / "to-file").symlink_to(outside / "secret.txt")
    (served / "to-folder").symlink_to(outside, target_is_directory=True)
    (served / "to-config").symlink_to(served / "config.json")
    (served / "onnx" / "index.html").symlink_to(outside / "secret.txt")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(serve.Handler, model_dir=served))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/model/config.json", timeout=10) as answer:
            assert answer.read() == b'{"model_type": "veca"}'
        for path in ("/model/to-file", "/model/to-folder/", "/model/to-folder/secret.txt", "/model/to-config",
                     "/model/onnx/", "/model/%2e%2e/outside/secret.txt", "/model/../outside/secret.txt"):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(base + path, timeout=10)
            assert answer.value.code == 404, path
    finally:
        server.shutdown()
        server.server_close()
