"""`export`: ONNX and torch.export programs that give the PyTorch model's probabilities on real images."""

import json
import re
import shutil
import sys
from contextlib import nullcontext

import onnxruntime
import pytest
import torch
from conftest import refusal

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.export import ServedClassifier, sample_images
from {{ cookiecutter.package_name }}.datasets.images import read_rgb
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
    else:  # the same, as extra files: the classes' order was nowhere but beside the checkpoint
        metadata = dict.fromkeys(["class_names", "image_size", "preprocessing"], "")
        probabilities = torch.export.load(exported, extra_files=metadata).module()(images)
    assert json.loads(metadata["class_names"]) == list(CLASSES)
    assert metadata["image_size"] == "{{ cookiecutter.image_size }}" and "centre-crop" in metadata["preprocessing"]
    assert probabilities.shape == (3, 6) and torch.allclose(probabilities, expected, atol=1e-4)


def test_one_image_exports_a_model_that_takes_any_batch_size(monkeypatch, capsys, trained, tiny_shapes):
    # Traced on one image, torch.export fixed the batch at 1 and refused; and a bound let no batch above 1024 in.
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    image = min((tiny_shapes / "test").glob("*/*.png"))
    output = trained / "one-image.pt2"
    printed = export(monkeypatch, capsys, str(checkpoint), "--format=pt2", f"--images={image}", f"--output={output}")
    assert "Largest difference from PyTorch on 1 real image: " in printed
    images = sample_images([image], Preprocessing({{ cookiecutter.image_size }}), count=1).expand(1025, -1, -1, -1)
    with torch.no_grad():
        assert torch.export.load(output).module()(images).shape == (1025, len(CLASSES))


def test_the_check_images_come_from_every_class_of_a_folder_not_the_first(tiny_shapes):
    preprocessing = Preprocessing({{ cookiecutter.image_size }})
    firsts = [min((tiny_shapes / "test" / name).glob("*.png")) for name in CLASSES]
    transform = preprocessing.eval_transform()
    expected = torch.stack([transform(read_rgb(str(path))) for path in firsts])
    assert torch.equal(sample_images([tiny_shapes / "test"], preprocessing, count=len(CLASSES)), expected)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], "the following arguments are required: checkpoint (python -m"),
        (["missing.ckpt"], "CHECKPOINT missing.ckpt: no such file or folder."),
        (["notes.txt"], "notes.txt is not a Lightning checkpoint"),
        (["sharded"], "sharded is a sharded checkpoint: make it one file with `consolidate` first."),
        (["RUN"], "is a folder, and no sharded checkpoint (FSDP or DeepSpeed): name a checkpoint in it, such as "),
        (["CHECKPOINT", "--images=notes.txt"], "None of notes.txt is a readable image: pass --images with some."),
        (["CHECKPOINT", "--images=empty"], "or its folders.): point --images at image files or folders."),
        (["CHECKPOINT", "--format=tflite"], "argument --format: invalid choice: 'tflite'"),
        # Refused before the export, which took a while and then failed on writing.
        (["CHECKPOINT", "--output=empty"], "--output empty is a folder: name the file to write."),
        (["CHECKPOINT", "--output=broken/model.onnx"], "is under broken, which is not a folder: name a path"),
        (["CHECKPOINT", "--output=notes.txt/model.onnx"], "is under notes.txt, which is not a folder: name a path"),
        # An export written over its checkpoint lost the run's resume point; one under another format's
        # suffix was taken by classify and serve for the other.
        (["CHECKPOINT", "--output=CHECKPOINT"], "does not end in .onnx: name it "),
        (["TORCH_NAMED", "--format=pt2"], "is the checkpoint to export: name another file."),
        (["CHECKPOINT", "--format=pt2", "--output=model.onnx"], "--output model.onnx does not end in .pt2: name it"),
        (["last"], "CHECKPOINT last: no such file; export takes a checkpoint's path."),
    ],
)
def test_mistakes_end_in_one_line(monkeypatch, capsys, trained, given, expected):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    (trained / "notes.txt").write_text("not a checkpoint, not an image")
    (trained / "sharded").mkdir()
    (trained / "empty").mkdir()
    (trained / "broken").symlink_to(trained / "gone")
    (trained / "sharded" / ".metadata").write_bytes(b"")  # as torch's distributed checkpoint writes
    shutil.copy(checkpoint, trained / "model.pt2")
    paths = {"CHECKPOINT": str(checkpoint), "RUN": str(checkpoint.parent.parent), "TORCH_NAMED": "model.pt2"}
    arguments = [re.sub("|".join(paths), lambda name: paths[name.group()], arg) for arg in given]
    capsys.readouterr()  # the training of the `trained` fixture, when it ran in this test
    with pytest.warns(UserWarning, match="notes.txt") if "--images=notes.txt" in given else nullcontext():
        assert expected in refusal(monkeypatch, capsys, "export", *arguments)


def test_unreadable_check_images_are_skipped_and_the_output_folder_is_made(monkeypatch, capsys, trained, tiny_shapes):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    images = trained / "images"
    shutil.copytree(tiny_shapes / "test", images)
    (images / CLASSES[0] / "0000-broken.png").write_bytes(b"not an image")  # sorted first among the images
    output = trained / "exports" / "model.pt2"
    options = ["--format=pt2", f"--images={images}", f"--output={output}"]
    with pytest.warns(UserWarning, match="0000-broken.png"):
        printed = export(monkeypatch, capsys, str(checkpoint), *options)
    assert "Largest difference from PyTorch on 8 real images" in printed and output.is_file()
