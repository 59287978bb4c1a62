"""`classify`: a CSV of the top classes of image files and folders, from the best checkpoint."""

import csv
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ON_CPU, disk_full_past, on_data, refusal, run_cli, run_command
from PIL import Image

from {{ cookiecutter.package_name }}.commands.classify import image_files
from {{ cookiecutter.package_name }}.commands.predictor import Predictor
from {{ cookiecutter.package_name }}.datasets.images import read_rgb
from {{ cookiecutter.package_name }}.datasets.shapes import CLASSES
from {{ cookiecutter.package_name }}.errors import ConfigError


def classify(monkeypatch, *args: str) -> list[dict]:
    """The rows classify writes, by default with 3 classes each, into predictions.csv."""
    defaults = {"--output": "predictions.csv", "--top-k": "3"}
    options = defaults | dict(arg.split("=", 1) for arg in args if arg.split("=", 1)[0] in defaults)
    others = [arg for arg in args if arg.split("=", 1)[0] not in defaults]
    run_command(monkeypatch, "classify", *others, *(f"{name}={value}" for name, value in options.items()))
    with open(options["--output"], newline="") as file:
        return list(csv.DictReader(file))


def test_a_folder_and_a_single_image_get_their_top_classes(monkeypatch, trained, tiny_shapes, tmp_path):
    folder = tmp_path / "unsorted"
    shutil.copytree(tiny_shapes / "test", folder)
    (folder / "broken.png").write_bytes(b"not an image")
    single = next((tiny_shapes / "val" / CLASSES[0]).glob("*.png"))
    with pytest.warns(UserWarning, match="broken.png"):
        rows = classify(monkeypatch, str(folder), str(single))
    assert len(rows) == len(list((tiny_shapes / "test").rglob("*.png"))) + 1
    assert rows[-1]["path"] == str(single)
    for row in rows:
        top = [float(row[f"probability_{k}"]) for k in (1, 2, 3)]
        assert top == sorted(top, reverse=True) and 0 < sum(top) <= 1 + 1e-5
        assert {row[f"class_{k}"] for k in (1, 2, 3)} <= set(CLASSES)


def test_a_predictor_in_python_takes_a_file_its_bytes_a_pil_image_or_a_tensor_alike(
    monkeypatch, trained, tiny_shapes, tmp_path
):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    predictor = Predictor(str(checkpoint)).load()  # as docs/inference.md shows it
    # Turned on its side, as a phone's photo is, with the EXIF orientation that sets it upright.
    image, orientation = tmp_path / "sideways.png", Image.Exif()
    orientation[0x0112] = 6
    with Image.open(next((tiny_shapes / "val" / CLASSES[0]).glob("*.png"))) as upright:
        upright.transpose(Image.Transpose.ROTATE_90).save(image, exif=orientation.tobytes())
    with Image.open(image) as opened:
        given = [str(image), image, image.read_bytes(), opened, read_rgb(str(image))]
        prepared = [predictor.prepare(each) for each in given]
    assert all(torch.equal(each, prepared[0]) for each in prepared), "prepared differently"
    probabilities = predictor(torch.stack(prepared))
    assert probabilities.shape == (5, len(CLASSES)) and torch.allclose(probabilities.sum(1), torch.ones(5))
    # As classify predicts it: its top class and probability.
    (row,) = classify(monkeypatch, str(image), "--top-k=1")
    best = probabilities[0].argmax().item()
    assert predictor.class_names[best] == row["class_1"]
    assert probabilities[0, best].item() == pytest.approx(float(row["probability_1"]), abs=1e-6)
    with pytest.raises(ConfigError, match="takes a uint8 tensor of 3 x H x W"):
        predictor.prepare(read_rgb(str(image)).float() / 255)


def test_the_default_checkpoint_is_the_newest_runs_best(monkeypatch, trained, tiny_shapes):
    (best,) = trained.glob("runs/*/*/checkpoints/epoch*-acc*.ckpt")
    image = next((tiny_shapes / "test").rglob("*.png"))
    assert classify(monkeypatch, str(image)) == classify(monkeypatch, str(image), f"--checkpoint={best}")


def test_a_damaged_last_checkpoint_of_the_newest_run_is_named(monkeypatch, capsys, trained, tiny_shapes):
    # Cut short (a copy onto a full disk): classify and predict (serve too) read it for the run's best checkpoint.
    (last,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    capsys.readouterr()  # the training of the `trained` fixture
    for command in (["classify", str(tiny_shapes / "test")], ["predict", *ON_CPU, *on_data(tiny_shapes)]):
        said = refusal(monkeypatch, capsys, *command)
        assert "last.ckpt cannot be read as a checkpoint: pass " in said and said.startswith("error: The newest run's ")


def test_without_a_checkpoint_it_says_to_train_first(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "classify", str(tiny_shapes / "test"))
    assert "train a model first, or pass --checkpoint" in message


def test_a_missing_checkpoint_is_named(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "classify", str(tiny_shapes / "test"), "--checkpoint=gone.ckpt")
    assert message == "error: --checkpoint gone.ckpt: no such file or folder."


def test_a_folder_without_images_is_named(monkeypatch, capsys, trained, tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    capsys.readouterr()  # the training's output
    assert "No images (.jpg" in refusal(monkeypatch, capsys, "classify", str(tmp_path / "empty"))
    # A mistyped path was "neither an image file nor a folder".
    missing = refusal(monkeypatch, capsys, "classify", str(tmp_path / "emtpy"))
    assert missing == f"error: {tmp_path / 'emtpy'} does not exist: give image files or folders of them."


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["--top-k=0"], "--top-k must be 1 or more, got 0 (python -m"),
        (["--batch-size=0"], "--batch-size must be 1 or more, got 0 (python -m"),
        (["--top-k=two"], "argument --top-k: invalid int value: 'two' (python -m"),
        (["--device=cuda:99"], "--device cuda:99: this machine has"),
        (["--device=gpu"], "--device gpu: Expected one of"),
        (["--output=."], "--output . is a folder: name the CSV file to write."),
        (["--output=configs/default.yaml/top.csv"], "is under configs/default.yaml, which is not a folder: name a"),
        (["--output=IMAGE"], "is one of the images: name the CSV to write."),  # it was written over
        pytest.param(
            ["--output=/dev/full"],
            "error: No space left on device (free some space, or write elsewhere)",
            marks=pytest.mark.skipif(not Path("/dev/full").exists(), reason="a full disk is Linux's /dev/full"),
        ),
    ],
)
def test_wrong_options_end_in_one_line(monkeypatch, capsys, trained, tiny_shapes, given, expected):
    capsys.readouterr()  # the training of the `trained` fixture, when it ran in this test
    image = str(next((tiny_shapes / "test").glob("*/*.png")))
    given = [arg.replace("IMAGE", image) for arg in given]
    assert expected in refusal(monkeypatch, capsys, "classify", str(tiny_shapes / "test"), *given)


def test_a_checkpoint_that_no_longer_fits_the_model_code_ends_in_one_line(monkeypatch, capsys, trained, tiny_shapes):
    # As after an edit of the model's code: its options build a head of another width than the weights'.
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    saved = torch.load(checkpoint, weights_only=True)
    head = [name for name, weights in saved["state_dict"].items() if weights.ndim == 2][-1]
    saved["state_dict"][head] = torch.cat([saved["state_dict"][head]] * 2, dim=1)
    torch.save(saved, trained / "edited.ckpt")
    capsys.readouterr()
    for command in ["classify", str(tiny_shapes / "test"), "--checkpoint=edited.ckpt"], ["export", "edited.ckpt"]:
        message = refusal(monkeypatch, capsys, *command)
        assert message.startswith(f"error: The weights in edited.ckpt do not fit the model this code builds from its "
                                  f"options (size mismatch for {head}: "), message  # fmt: skip
        assert message.endswith("the model's code changed since it was trained. Use the code it was trained with, "
                                "or train anew."), message  # fmt: skip


def test_only_unreadable_images_is_a_failure_that_keeps_the_earlier_output(monkeypatch, capsys, trained, tmp_path):
    (tmp_path / "notes.png").write_text("not an image")
    earlier = tmp_path / "predictions.csv"
    earlier.write_text("path,class_1,probability_1\n")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="notes.png"):
        line = refusal(monkeypatch, capsys, "classify", str(tmp_path / "notes.png"), f"--output={earlier}")
    assert "None of the 1 images could be read" in line
    assert earlier.read_text() == "path,class_1,probability_1\n"


def test_a_full_disk_while_the_csv_is_written_keeps_the_earlier_one(monkeypatch, capsys, trained, tiny_shapes):
    (folder := trained / "classified").mkdir()
    earlier = folder / "predictions.csv"
    earlier.write_text("path,class_1,probability_1\n")
    capsys.readouterr()
    with disk_full_past(200):  # the test images' CSV is kilobytes
        line = refusal(monkeypatch, capsys, "classify", str(tiny_shapes / "test"), f"--output={earlier}")
    assert line == f"error: File too large: {earlier} (raise the file-size limit (ulimit -f), or write elsewhere)"
    assert earlier.read_text() == "path,class_1,probability_1\n"
    assert [path.name for path in folder.iterdir()] == ["predictions.csv"], "staging file left behind"


def test_a_linked_csv_is_written_through_its_link(monkeypatch, trained, tiny_shapes, tmp_path):
    (tmp_path / "latest.csv").symlink_to(tmp_path / "classified.csv")
    run_command(monkeypatch, "classify", str(tiny_shapes / "test"), f"--output={tmp_path / 'latest.csv'}")
    assert (tmp_path / "latest.csv").is_symlink()
    assert (tmp_path / "classified.csv").read_text().startswith("path,")


def test_an_onnx_export_classifies_as_its_checkpoint_into_a_new_folder(monkeypatch, trained, tiny_shapes):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    exported = trained / "model.onnx"
    run_command(monkeypatch, "export", str(checkpoint), f"--output={exported}", f"--images={tiny_shapes / 'test'}")
    images = str(tiny_shapes / "test")
    # More classes asked for than the model has: every class, and the header says as many.
    from_checkpoint = classify(monkeypatch, images, f"--checkpoint={checkpoint}", "--top-k=9", "--output=new/a.csv")
    from_onnx = classify(monkeypatch, images, f"--checkpoint={exported}", "--top-k=9", "--output=new/b.csv")
    assert list(from_onnx[0]) == ["path", *(f"{name}_{k}" for k in range(1, 7) for name in ("class", "probability"))]
    assert len(from_onnx) == len(from_checkpoint) == 6 * 4
    for onnx_row, checkpoint_row in zip(from_onnx, from_checkpoint, strict=True):
        assert onnx_row["path"] == checkpoint_row["path"] and onnx_row["class_1"] == checkpoint_row["class_1"]
        assert float(onnx_row["probability_1"]) == pytest.approx(float(checkpoint_row["probability_1"]), abs=1e-4)


def test_an_image_given_and_in_a_folder_given_is_classified_once(tiny_shapes):
    folder = tiny_shapes / "test"
    image = next(folder.glob("*/*.png"))
    found = image_files([image, folder, Path(f"{folder}/./{image.parent.name}")])
    assert found[0] == image and sorted(found) == sorted(folder.glob("*/*.png"))


def test_images_in_a_folder_under_a_hidden_one_are_found(tiny_shapes, tmp_path):
    # Only hidden names inside the folder given are skipped, not those of the folders above it.
    photos = tmp_path / ".cache" / "photos"
    shutil.copytree(tiny_shapes / "test", photos)
    (photos / ".ipynb_checkpoints").mkdir()
    shutil.copy(next(photos.rglob("*.png")), photos / ".ipynb_checkpoints" / "copy.png")
    assert image_files([photos]) == sorted(photos.rglob("[!.]*/*.png"))


def test_a_linked_folder_inside_one_given_is_named_and_can_be_given_itself(tiny_shapes, tmp_path):
    photos, elsewhere = tmp_path / "photos", tmp_path / "elsewhere"
    shutil.copytree(tiny_shapes / "test" / CLASSES[0], photos)
    shutil.copytree(tiny_shapes / "test" / CLASSES[1], elsewhere)
    (photos / "2024").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(UserWarning, match=rf"^1 linked folder\(s\) under {photos} \(such as 2024\) are not followed"):
        assert image_files([photos]) == sorted(photos.glob("*.png"))
    assert image_files([photos / "2024"]) == sorted((photos / "2024").glob("*.png"))


def test_a_folder_with_images_of_types_not_read_says_how_many(tiny_shapes, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(tiny_shapes / "test" / CLASSES[0], photos)
    (photos / "holiday.heic").write_bytes(b"")
    with pytest.warns(UserWarning, match=rf"^Skipped 1 image file\(s\) under {photos} of types not read \(1 .heic\)"):
        assert image_files([photos]) == sorted(photos.glob("*.png"))


def test_the_default_checkpoint_is_the_best_that_training_recorded(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # A recipe whose best checkpoint goes by the validation loss, under a name of its own.
    (in_project_copy / "mine.yaml").write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {monitor: val/loss, mode: min, filename: 'lowest-loss-{epoch}'}\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {filename: last, enable_version_counter: false}\n"
    )
    run_cli(monkeypatch, "fit", "--config=mine.yaml", *ON_CPU, *on_data(tiny_shapes), "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.logger=false")  # fmt: skip
    (best,) = in_project_copy.glob("checkpoints/lowest-loss-*.ckpt")
    capsys.readouterr()
    classify(monkeypatch, str(tiny_shapes / "test"), "--runs=.")
    assert f"{best.name}: predictions.csv" in capsys.readouterr().err


def test_classify_and_report_look_for_the_newest_run_where_the_configs_put_runs(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    recipe = in_project_copy / "configs" / "default.yaml"
    recipe.write_text(recipe.read_text().replace("save_dir: runs", "save_dir: experiments"))
    run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1")  # fmt: skip
    (best,) = Path("experiments").glob("*/*/checkpoints/epoch*.ckpt")
    capsys.readouterr()
    classify(monkeypatch, str(tiny_shapes / "test"))
    assert f"with {best}" in capsys.readouterr().err
    run_command(monkeypatch, "report")
    assert capsys.readouterr().out.startswith(f"Wrote {best.parent.parent / 'reports' / 'curves.png'}")


def test_predict_writes_each_test_images_top_classes_as_classify_does(monkeypatch, trained, tiny_shapes):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    run_cli(monkeypatch, "predict", *ON_CPU, *on_data(tiny_shapes, batch_size=5), f"--ckpt_path={checkpoint}")
    with (checkpoint.parent.parent / "reports" / "predictions_test.csv").open(newline="") as file:
        predicted = list(csv.DictReader(file))
    # classify reads and transforms the same images on its own path: the same classes, the same numbers.
    rows = classify(monkeypatch, str(tiny_shapes / "test"), f"--checkpoint={checkpoint}")
    classified = {row["path"]: row for row in rows}
    assert sorted(row["path"] for row in predicted) == sorted(classified) and len(predicted) == 6 * 4
    for row in predicted:
        same = classified[row["path"]]
        for k in (1, 2, 3):
            assert row[f"class_{k}"] == same[f"class_{k}"]
            assert float(row[f"probability_{k}"]) == pytest.approx(float(same[f"probability_{k}"]), abs=1e-5)


def test_predict_leaves_out_an_unreadable_test_image_and_names_every_other_rightly(
    monkeypatch, trained, tiny_shapes, tmp_path
):
    data = tmp_path / "data"
    shutil.copytree(tiny_shapes, data)
    # Sorted first, so that every row after it would shift if it were counted but not predicted.
    (data / "test" / CLASSES[0] / "0000-broken.png").write_bytes(b"not an image")
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    with pytest.warns(UserWarning, match="0000-broken.png"):
        run_cli(monkeypatch, "predict", *ON_CPU, *on_data(data, batch_size=5), f"--ckpt_path={checkpoint}")
    # Another folder than the checkpoint's data: its predictions are a run of their own.
    (predictions,) = trained.glob("runs/*/*/reports/predictions_test.csv")
    assert checkpoint.parent.parent not in predictions.parents
    with predictions.open(newline="") as file:
        predicted = {row["path"]: row for row in csv.DictReader(file)}
    with pytest.warns(UserWarning, match="0000-broken.png"):
        rows = classify(monkeypatch, str(data / "test"), f"--checkpoint={checkpoint}")
    classified = {row["path"]: row for row in rows}
    assert sorted(predicted) == sorted(classified) and len(predicted) == 6 * 4
    for path, row in predicted.items():
        assert [row[f"class_{k}"] for k in (1, 2, 3)] == [classified[path][f"class_{k}"] for k in (1, 2, 3)]
