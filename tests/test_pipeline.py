"""Budgets through the standard paths: config defaults, from_pretrained, pipeline(model_kwargs=...) and the call."""

import json
import shutil
import textwrap

import pytest
import torch
from conftest import load_without_package, save_tiny_model_folders
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, pipeline

from corevision_hf import VecaImageFeatureExtractionPipeline


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny_model_folders(tmp_path_factory.mktemp("models"))


@pytest.fixture
def photo() -> Image.Image:
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (30, 45, 3), dtype=torch.uint8, generator=generator)
    return Image.frombytes("RGB", (45, 30), bytes(pixels.flatten().tolist()))


def reference(folder: str, image: Image.Image, **budget) -> torch.Tensor:
    processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(processor(image, return_tensors="pt").pixel_values, **budget).last_hidden_state


def test_veca_budget_in_the_pipeline_call(folders, photo):
    pipe = pipeline("image-feature-extraction", model=folders["veca"], trust_remote_code=True)
    for num_cores in (2, 8):
        features = pipe(photo, num_cores=num_cores, return_tensors=True)
        torch.testing.assert_close(features, reference(folders["veca"], photo, num_cores=num_cores))
    assert pipe(photo, num_cores=2, return_tensors=True).shape[1] == 2 + 4 * 6  # 30x45 -> 32x48 px: 4 x 6 patches
    with pytest.raises(ValueError, match=r"Unknown pipeline arguments \['num_core'\]"):
        pipe(photo, num_core=2)
    with pytest.raises(ValueError, match="num_cores=9 is out of range"):
        pipe(photo, num_cores=9)


def test_veca_default_budget_through_from_pretrained_and_model_kwargs(folders, photo):
    model = AutoModel.from_pretrained(folders["veca"], default_num_cores=3).eval()
    pixel_values = torch.randn(1, 3, 24, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values).last_hidden_state, model(pixel_values, num_cores=3).last_hidden_state)
    pipe = pipeline(
        "image-feature-extraction", model=folders["veca"], trust_remote_code=True, model_kwargs={"default_num_cores": 5}
    )
    torch.testing.assert_close(pipe(photo, return_tensors=True), reference(folders["veca"], photo, num_cores=5))
    with pytest.raises(ValueError, match=r"default_num_cores=9 .* 1..8"):
        AutoModel.from_pretrained(folders["veca"], default_num_cores=9)


def test_lookwhere_budget_in_the_pipeline_call_and_defaults(folders, photo):
    pipe = pipeline("image-feature-extraction", model=folders["lookwhere"], trust_remote_code=True)
    features = pipe(photo, k_ratio=0.5, return_tensors=True)
    torch.testing.assert_close(features, reference(folders["lookwhere"], photo, k_ratio=0.5))
    assert not torch.allclose(features, pipe(photo, return_tensors=True))  # the default k_ratio (0.25) differs
    kept = pipe(photo, k=5, fill_dense=False, return_tensors=True)
    assert kept.shape[1] == 1 + 4 + 5

    model = AutoModel.from_pretrained(folders["lookwhere"], default_k=6).eval()
    assert model(torch.randn(1, 3, 32, 32)).selected_indices.shape == (1, 6)
    pipe = pipeline(
        "image-feature-extraction", model=folders["lookwhere"], trust_remote_code=True, model_kwargs={"k_ratio": 0.5}
    )
    torch.testing.assert_close(pipe(photo, return_tensors=True), features)
    for bad, message in [({"k_ratio": 1.5}, r"k_ratio must lie in \(0, 1\]"), ({"default_k": 0}, "default_k must be")]:
        with pytest.raises(ValueError, match=message):
            AutoModel.from_pretrained(folders["lookwhere"], **bad)


PIPELINE_LOADER = textwrap.dedent(
    """
    import torch
    from PIL import Image
    from transformers import pipeline

    source, inputs_path, outputs_path = sys.argv[1:4]
    image = Image.fromarray(torch.load(inputs_path).numpy())
    pipe = pipeline("image-feature-extraction", model=source, trust_remote_code=True)
    assert type(pipe).__module__.startswith("transformers_modules"), type(pipe).__module__
    assert type(pipe.image_processor).__module__.startswith("transformers_modules"), type(pipe.image_processor)
    mixed = pipe([image, image.transpose(Image.Transpose.ROTATE_90)], batch_size=2, num_cores=4, return_tensors=True)
    torch.save({"features": pipe(image, num_cores=4, return_tensors=True), "mixed": mixed}, outputs_path)
    """
)


@pytest.mark.slow
def test_pipeline_and_processor_load_without_the_package(tmp_path, folders, photo):
    image = torch.frombuffer(bytearray(photo.tobytes()), dtype=torch.uint8).view(30, 45, 3)
    outputs = load_without_package(tmp_path, PIPELINE_LOADER, folders["veca"], image)
    torch.testing.assert_close(outputs["features"], reference(folders["veca"], photo, num_cores=4))
    # a batch of a landscape and a portrait photo: padded with a mask by the hub code, each as it is alone
    rotated = photo.transpose(Image.Transpose.ROTATE_90)
    torch.testing.assert_close(outputs["mixed"][0], reference(folders["veca"], photo, num_cores=4), atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs["mixed"][1], reference(folders["veca"], rotated, num_cores=4), atol=1e-5, rtol=0)


def test_older_checkpoints_take_the_pipeline_class(tmp_path, folders, photo):
    """A checkpoint saved without `custom_pipelines` gets the stock pipeline unless the class is passed."""
    folder = tmp_path / "old"
    shutil.copytree(folders["veca"], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["custom_pipelines"]
    (folder / "config.json").write_text(json.dumps(config))
    pipe = pipeline(
        "image-feature-extraction", model=str(folder), trust_remote_code=True,
        pipeline_class=VecaImageFeatureExtractionPipeline,
    )
    torch.testing.assert_close(pipe(photo, num_cores=3, return_tensors=True), reference(folders["veca"], photo, num_cores=3))
