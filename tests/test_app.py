"""The demo page (space/app.py): served on localhost, loaded in headless Chromium, outputs rendered, screenshot saved.

Chromium (Debian's `chromium` package; .ci/run installs it) is driven over the DevTools protocol on a pipe, so no
extra Python package is needed; the test is skipped, with the reason, where Chromium or gradio is absent.
"""

import base64
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_veca_config

from corevision_hf import VecaConfig, VecaModel, veca_flops


ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "space" / "app.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# Screenshots go to the pytest tmp folder, or to $COREVISION_SCREENSHOT_DIR to keep one (e.g. in CI artifacts).
SCREENSHOT_DIR = os.environ.get("COREVISION_SCREENSHOT_DIR")


class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe: JSON messages separated by NUL bytes on fds 3/4."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1700):
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()

        def child_fds():  # the browser reads commands on fd 3 and writes answers on fd 4
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "--no-first-run", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=child_fds, pass_fds=(3, 4),  # kept open after preexec_fn placed the pipes there
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer, self._id = b"", 0

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._read, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:  # anything else is an event
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        os.close(self._write)
        os.close(self._read)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_until_listening(server: subprocess.Popen, port: int, timeout: float, what: str) -> None:
    """Waits until `server` accepts connections on localhost:`port`; fails with its output if it exits first."""
    def serving():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            assert server.poll() is None, server.stdout.read().decode()
            return False

    wait_for(serving, timeout, what)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run does)")
def test_the_page_renders_pictures_and_costs_in_chromium(tmp_path):
    pytest.importorskip("gradio", reason="the demo page needs gradio: pip install -e '.[app]'")
    torch.manual_seed(0)
    model_dir = tmp_path / "tiny-veca"
    VecaModel(tiny_veca_config(patch_size=14, image_size=224)).save_pretrained(model_dir)
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, str(APP), "--model", str(model_dir), "--host", "127.0.0.1",
                               "--port", str(port), "--resolution", "224"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    browser = None
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_listening(server, port, 90, "the app to listen")
        browser = DevTools(tmp_path / "chromium-profile")
        target = browser.call("Target.createTarget", url=url)["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

        def text(selector: str) -> str:
            result = browser.call("Runtime.evaluate", session,
                                  expression=f"document.querySelector({selector!r})?.innerText ?? ''")
            return result["result"].get("value", "")

        # the page runs the default model on the default photo when it opens
        cost = wait_for(lambda: "teacher / model" in text("#cost") and text("#cost"), 120, "the cost table")

        def both_pictures() -> list[int] | None:  # widths once both pictures have finished loading
            widths = browser.call("Runtime.evaluate", session, returnByValue=True, expression=(
                "[...document.querySelectorAll('#features img, #where img')].filter(i => i.complete && "
                "i.naturalWidth > 200).map(i => i.naturalWidth)"))["result"]["value"]
            return widths if len(widths) == 2 else None  # they arrive one after the other

        images = wait_for(both_pictures, 60, "both pictures")
        shot = base64.b64decode(browser.call("Page.captureScreenshot", session, format="png")["data"])
        folder = Path(SCREENSHOT_DIR or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "demo_page.png").write_bytes(shot)
    finally:
        if browser is not None:
            browser.close()
        server.kill()
        server.wait(timeout=10)

    assert len(images) == 2  # the PCA picture and the cores picture, each a rendered figure
    assert "veca, 8 cores" in cost and "dense teacher: random-init DINOv2 (64 wide, 2 layers)" in cost
    # analytic GFLOPs on the page equal the package's, at 224 px with the whole bank of 8 cores
    config = VecaConfig.from_pretrained(model_dir)
    row = next(line for line in cost.splitlines() if line.startswith("veca, 8 cores"))
    assert row.split("\t")[1].strip() == f"{veca_flops(config, 224, num_cores=8) / 1e9:.2f}"
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000


def test_a_target_on_the_page_picks_the_largest_budget_that_fits(tmp_path):
    gr = pytest.importorskip("gradio", reason="the demo page needs gradio: pip install -e '.[app]'")
    from PIL import Image

    spec = importlib.util.spec_from_file_location("demo_app", APP)
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    torch.manual_seed(0)
    model_dir = tmp_path / "tiny-veca"
    VecaModel(tiny_veca_config(patch_size=14, image_size=224)).save_pretrained(model_dir)
    config = VecaConfig.from_pretrained(model_dir)
    target = (veca_flops(config, 224, num_cores=4) + veca_flops(config, 224, num_cores=5)) / 2e9
    photo = Image.open(ROOT / "assets" / "photos" / "chelsea.jpg")
    _, _, cost = app.run(photo, str(model_dir), 224, 8, 0.1, target)
    row = f"| veca, 4 cores (largest within {target:g} GFLOPs) | {veca_flops(config, 224, num_cores=4) / 1e9:.2f} |"
    assert row in cost
    with pytest.raises(gr.Error, match="below the cheapest budget at 224x224 px: num_cores=1 costs"):
        app.run(photo, str(model_dir), 224, 8, 0.1, 1e-6)


def test_the_page_loads_only_the_models_it_offers_and_refuses_huge_photos(tmp_path):
    """A client can send any model name to the page's function: one that the page does not offer (a local path, a hub
    id) is refused before anything loads; so is a photo over the page's stated limit."""
    gr = pytest.importorskip("gradio", reason="the demo page needs gradio: pip install -e '.[app]'")
    from PIL import Image

    spec = importlib.util.spec_from_file_location("demo_app", APP)
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    photo = Image.new("RGB", (64, 48))
    app.load_model.cache_clear()
    with pytest.raises(gr.Error, match="'/etc' is not one of the models this page offers: pick one from the list"):
        app.run(photo, "/etc", 224, 8, 0.1, offered=(app.RANDOM_VECA,))
    assert app.load_model.cache_info().misses == 0  # nothing loaded
    huge = Image.new("1", (12_000, 12_000))  # 144 Mpx, one bit a pixel: 18 MB here
    with pytest.raises(gr.Error, match=r"This photo is 12000x12000 px \(144 Mpx\), more than the page's limit of 50"):
        app.run(huge, app.RANDOM_VECA, 224, 8, 0.1, offered=(app.RANDOM_VECA,))
