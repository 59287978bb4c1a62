"""transforms.py: each augmentation option in a real fit step, and the preprocessing that a checkpoint
carries to validation{{ ", `classify` and `export`" if cookiecutter.inference == "yes" }}."""
{%- if cookiecutter.inference == "yes" %}

import json
import sys
from pathlib import Path
{%- else %}

import sys
{%- endif %}

import pytest
import torch
import torchvision
from conftest import ON_CPU, on_data
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from {{ cookiecutter.package_name }} import model as model_module
from {{ cookiecutter.package_name }}.cli import DEFAULT_CONFIGS, ClassifierCLI, build, main
from {{ cookiecutter.package_name }}.data import ImageDataModule
{%- if cookiecutter.inference == "yes" %}
from {{ cookiecutter.package_name }}.datasets.images import read_rgb
{%- endif %}
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.transforms import Preprocessing, train_transform

POLICIES = {"trivialaugment": v2.TrivialAugmentWide, "randaugment": v2.RandAugment, "autoaugment": v2.AutoAugment}


@pytest.mark.parametrize("augment", ["none", "basic", *POLICIES])
def test_each_augmentation_trains(in_project_copy, tiny_shapes, augment):
    # Bicubic, as many pretrained weights want: the policies' rotations on tensors cannot do it.
    erasing = [] if augment == "none" else ["--data.random_erasing=0.5"]
    cli = build([*ON_CPU, *on_data(tiny_shapes), "--trainer.fast_dev_run=2", f"--data.augment={augment}",
                 "--data.vflip=true", *erasing, "--data.image_size=32", "--data.interpolation=bicubic"])  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    steps = [type(step) for step in cli.datamodule.train_set.image_transform.transforms]
    assert cli.trainer.global_step == 2
    if augment == "none":
        assert steps == [v2.Resize, v2.CenterCrop, v2.ToDtype]
    else:
        assert steps[:3] == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.RandomVerticalFlip]
        policies = [step for step in steps if step in POLICIES.values()]
        assert policies == ([POLICIES[augment]] if augment in POLICIES else [])
        assert steps[-1] is v2.RandomErasing


def test_erasing_without_augmentation_is_refused():
    with pytest.raises(ConfigError, match="data.random_erasing needs an augmentation"):
        train_transform(Preprocessing(32), "none", True, False, min_crop_scale=0.35, random_erasing=0.25)


def test_preprocessing_takes_lists_as_tuples_and_refuses_what_it_cannot_do():
    assert Preprocessing(32, mean=[0.5, 0.5, 0.5]) == Preprocessing(32, mean=(0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="one value per RGB channel"):
        Preprocessing(32, std=(0.5, 0.5))
    with pytest.raises(ConfigError, match="data.interpolation must be one of bilinear, bicubic, nearest"):
        Preprocessing(32, interpolation="lanczos")


def arrow(size: int = 16) -> torch.Tensor:
    """An image that is neither left-right nor up-down symmetric: bright top-left quarter."""
    image = torch.zeros(3, size, size, dtype=torch.uint8)
    image[:, : size // 2, : size // 4] = 255
    return image


@pytest.mark.parametrize("hflip, vflip", [(False, False), (True, False), (False, True)])
def test_flips_happen_only_when_switched_on(hflip, vflip):
    # A crop of the whole image, so the flips are the only change.
    transform = train_transform(Preprocessing(16), "basic", hflip, vflip, min_crop_scale=1.0, random_erasing=0)
    torch.manual_seed(0)
    seen = {tuple(transform(arrow()).flatten().tolist()) for _ in range(40)}
    expected = {arrow()}
    if hflip:
        expected.add(F.horizontal_flip(arrow()))
    if vflip:
        expected.add(F.vertical_flip(arrow()))
    assert seen == {tuple(image.flatten().tolist()) for image in expected}


def test_random_erasing_paints_a_rectangle_the_mean_colour():
    preprocessing = Preprocessing(32, mean=(0.2, 0.4, 0.6))
    transform = train_transform(preprocessing, "basic", False, False, min_crop_scale=1.0, random_erasing=1.0)
    image = torch.full((3, 32, 32), 255, dtype=torch.uint8)
    output = transform(image)
    erased = (output != 255).all(dim=0)
    assert 0.02 * 32 * 32 <= erased.sum() <= 0.33 * 32 * 32  # the erased area's default range
    assert output[:, erased].unique(dim=1).tolist() == [[51], [102], [153]]


def test_pretrained_weights_bring_their_own_preprocessing_unless_an_option_is_given(monkeypatch, in_project_copy):
    # The weights cannot be downloaded here: the backbone is built without them, the link is real.
    without_weights = lambda name, classes, *_: torchvision.models.get_model(name, num_classes=classes)  # noqa: E731
    monkeypatch.setattr(model_module, "build_backbone", without_weights)
    options = [*ON_CPU, "--model.backbone=efficientnet_b0", "--model.pretrained=true", "--data.image_size=224"]
    weights = build(options).datamodule.preprocessing
    # efficientnet_b0's weights: resize 256, crop 224, bicubic.
    assert (weights.resize_size, weights.image_size, weights.interpolation) == (256, 224, "bicubic")
    given = build([*options, "--data.interpolation=bilinear", "--data.crop_ratio=1.0"]).datamodule.preprocessing
    assert (given.resize_size, given.interpolation, given.mean) == (224, "bilinear", weights.mean)
    scratch = build([*ON_CPU, "--model.backbone=efficientnet_b0", "--data.image_size=224"]).datamodule.preprocessing
    assert scratch == Preprocessing(224)


def test_a_pretrained_runs_resume_keeps_its_preprocessing_without_a_word(monkeypatch, caplog, in_project_copy,
                                                                       tiny_shapes):  # fmt: skip
    without_weights = lambda name, classes, *_: torchvision.models.get_model(name, num_classes=classes)  # noqa: E731
    monkeypatch.setattr(model_module, "build_backbone", without_weights)
    options = [*ON_CPU, *on_data(tiny_shapes), "--model.pretrained=true", "--data.image_size=32",
               "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]  # fmt: skip
    run(monkeypatch, "fit", *options, "--trainer.max_epochs=1")
    (checkpoint,) = in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")
    caplog.clear()
    run(monkeypatch, "fit", *options, "--trainer.max_epochs=2", f"--ckpt_path={checkpoint}")
    # The configs' preprocessing is the weights' (resnet18's crop ratio 0.875), the checkpoint's too.
    assert "Using the checkpoint's preprocessing" not in caplog.text


CHANGED = ["--data.image_size=32", "--data.crop_ratio=0.75", "--data.interpolation=bicubic",
           "--data.mean=[0.5,0.5,0.5]", "--data.std=[0.25,0.25,0.25]"]  # fmt: skip


def run(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *args])
    main()


def validate(tiny_shapes, checkpoint, *options: str) -> tuple[dict, Preprocessing]:
    configs = [arg for path in DEFAULT_CONFIGS for arg in ("--config", str(path))]
    cli = ClassifierCLI(
        ImageClassifier, ImageDataModule, save_config_callback=None,
        args=["validate", *configs, *ON_CPU, *on_data(tiny_shapes), f"--ckpt_path={checkpoint}", *options],
    )  # fmt: skip
    return {name: float(value) for name, value in cli.trainer.callback_metrics.items()}, cli.datamodule.preprocessing
{%- if cookiecutter.inference == "yes" %}


def test_the_checkpoint_carries_its_preprocessing_to_validation_classify_and_export(
    monkeypatch, caplog, in_project_copy, tiny_shapes
):
{%- else %}


def test_the_checkpoint_carries_its_preprocessing_to_validation(monkeypatch, caplog, in_project_copy, tiny_shapes):
{%- endif %}
    run(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), *CHANGED, "--trainer.max_epochs=1")
    (checkpoint,) = in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")
    trained = Preprocessing(32, crop_ratio=0.75, interpolation="bicubic", mean=(0.5,) * 3, std=(0.25,) * 3)

    # Validation without the options prepares images as training did, and says so.
    as_configured, _ = validate(tiny_shapes, checkpoint, *CHANGED)
    assert "Using the checkpoint's preprocessing" not in caplog.text
    from_checkpoint, used = validate(tiny_shapes, checkpoint)
    assert used == trained and "On the data the checkpoint was trained on: " in caplog.text
    assert from_checkpoint == as_configured
{%- if cookiecutter.inference == "yes" %}

    # classify: by hand, resize the shorter side to round(32 / 0.75) = 43 px, crop 32, standardise.
    image_path = next((tiny_shapes / "test").rglob("*.png"))
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    image = F.center_crop(F.resize(read_rgb(str(image_path)), [43], F.InterpolationMode.BICUBIC, antialias=True), [32])
    with torch.no_grad():
        expected = model(((image.float() / 255 - 0.5) / 0.25)[None]).softmax(-1)[0]
    with pytest.raises(SystemExit):
        run(monkeypatch, "classify", str(image_path), f"--checkpoint={checkpoint}", "--output=top.csv", "--top-k=1")
    row = Path("top.csv").read_text().splitlines()[1].split(",")
    assert float(row[-1]) == pytest.approx(expected.max().item(), abs=1e-5)
    assert row[-2] == model.label_names()[expected.argmax()]

    # export: the same numbers in the exported program, and the preprocessing in its metadata.
    with pytest.raises(SystemExit) as done:
        run(monkeypatch, "export", str(checkpoint), "--format=onnx", f"--images={tiny_shapes / 'test'}")
    assert done.value.code == 0
    import onnx

    metadata = {entry.key: entry.value for entry in onnx.load(str(checkpoint.with_suffix(".onnx"))).metadata_props}
    assert metadata["preprocessing"].startswith("resize the shorter side to 43 px (bicubic, antialiased), centre-crop")
    assert json.loads(metadata["normalisation"]) == {"mean": [0.5] * 3, "std": [0.25] * 3}
{%- endif %}
