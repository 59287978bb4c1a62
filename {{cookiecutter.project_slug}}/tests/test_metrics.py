"""Logged numbers against hand computations, for any batch size."""

import shutil
import warnings

import lightning as L
import pytest
import torch

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.metrics import MeanPerImage, classification_metrics


def one_hot_logits(ranking: list[list[int]], classes: int = 6) -> torch.Tensor:
    """Logits that rank the classes of each image in the given order, best first."""
    logits = torch.zeros(len(ranking), classes)
    for row, order in enumerate(ranking):
        for place, label in enumerate(order):
            logits[row, label] = classes - place
    return logits


def test_top5_stays_top5_after_a_first_batch_of_one_class_predicted_right():
    metrics = classification_metrics(6, "val/")
    # What a sanity check on class-sorted validation data can give: one class, every image right.
    metrics.update(one_hot_logits([[0, 1, 2, 3, 4, 5]] * 4), torch.zeros(4, dtype=torch.long))
    metrics.reset()
    # Four images: right at top-1; second; fifth; last (out of the top 5).
    ranking = [[3, 0, 1, 2, 4, 5], [0, 3, 1, 2, 4, 5], [0, 1, 2, 4, 3, 5], [0, 1, 2, 4, 5, 3]]
    metrics.update(one_hot_logits(ranking), torch.full((4,), 3))
    values = metrics.compute()
    assert values["val/acc"].item() == pytest.approx(1 / 4)
    assert values["val/top5"].item() == pytest.approx(3 / 4)


def test_mean_per_image_weights_each_image_whatever_the_batches():
    mean = MeanPerImage()
    mean.update(torch.ones(4))
    mean.update(torch.zeros(1))
    assert mean.compute().item() == pytest.approx(0.8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mean_per_image_keeps_float32_under_half_precision_models(dtype):
    mean = MeanPerImage().to(dtype=dtype)  # what Lightning's bf16-true and 16-true do to the module
    for _ in range(800):
        mean.update(torch.full((64,), 2.25, dtype=dtype))
    assert mean.compute().item() == 2.25


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_test_loss_is_the_mean_over_every_readable_image(tiny_shapes, tmp_path, batch_size):
    # 23 readable test images: batches of 3 end on 2 images, of 8 on 7, so a mean of batch means would
    # differ. Two unreadable ones are skipped: in batches of 1 they left batches of none, which ended the
    # test with the training's error.
    uneven = tmp_path / "uneven"
    shutil.copytree(tiny_shapes, uneven)
    first = next((uneven / "test").glob("*/*.png"))
    (first.parent / "truncated.png").write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    (first.parent / "garbage.jpg").write_bytes(b"not an image at all")
    first.unlink()
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=6, batch_size=batch_size)
    data = ImageDataModule(uneven, num_workers=0, batch_size=batch_size, image_size=32)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)  # fmt: skip
    with pytest.warns(UserWarning, match="Skipping the unreadable image"):
        (logged,) = trainer.test(model, data, verbose=False)

    model.eval()
    losses, correct = [], []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same two skipped
        for image, label in filter(None, data.test_set):
            logits = model(data.preprocessing.normalize(image[None]))[0].double()
            losses.append((torch.logsumexp(logits, 0) - logits[label]).item())
            correct.append(int(logits.argmax().item() == label))
    assert len(losses) == 23
    assert logged["test/loss"] == pytest.approx(sum(losses) / 23, rel=1e-5)
    assert logged["test/acc"] == pytest.approx(sum(correct) / 23, abs=1e-6)
