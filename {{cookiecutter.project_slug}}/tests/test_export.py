"""`export`: ONNX and torch.export programs that give the PyTorch model's probabilities on real images."""

import json
import sys

import onnxruntime
import pytest
import torch

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.export import ServedClassifier, sample_images
from {{ cookiecutter.package_name }}.datasets.shapes import CLASSES
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.transforms import Preprocessing


def export(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "export", *args])
    with pytest.raises(SystemExit) as done:
        main()
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.err
    return printed.out


@pytest.mark.parametrize("form", ["onnx", "pt2"])
def test_the_export_matches_pytorch_on_real_images(monkeypatch, capsys, trained, tiny_shapes, form):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    printed = export(monkeypatch, capsys, str(checkpoint), f"--format={form}", f"--images={tiny_shapes / 'test'}")
    assert "uint8 images N x 3 x {{ cookiecutter.image_size }} x {{ cookiecutter.image_size }} in, 6 class probabilities out" in printed
    difference = float(printed.split("Largest difference from PyTorch on 8 real images: ")[1].split()[0])
    assert difference < 1e-4

    # Outside this project: another batch size, and the model's probabilities.
    preprocessing = Preprocessing({{ cookiecutter.image_size }})  # the defaults the run trained with
    images = sample_images([tiny_shapes / "val"], preprocessing, count=3)
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    expected = ServedClassifier(model, preprocessing)(images)
    exported = checkpoint.with_suffix(f".{form}")
    if form == "onnx":
        session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
        probabilities = torch.from_numpy(session.run(None, {"images": images.numpy()})[0])
        assert list(exported.parent.glob("*.data")) == [], "a small model's ONNX export is one file"
        metadata = session.get_modelmeta().custom_metadata_map
        assert json.loads(metadata["class_names"]) == list(CLASSES)
        assert metadata["image_size"] == "{{ cookiecutter.image_size }}" and "centre-crop" in metadata["preprocessing"]
    else:
        probabilities = torch.export.load(exported).module()(images)
    assert probabilities.shape == (3, 6) and torch.allclose(probabilities, expected, atol=1e-4)


def test_a_folder_checkpoint_is_sent_to_consolidate(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "export", str(tmp_path), "--format=pt2"])
    with pytest.raises(SystemExit):
        main()
    assert "consolidate" in capsys.readouterr().err
