import math
from types import SimpleNamespace
from urllib.error import URLError

import lightning as L
import pytest
import torch
import torchvision

from {{ cookiecutter.package_name }}.backbone import head_names
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import ConfigError, MissingError
from {{ cookiecutter.package_name }}.model import ImageClassifier, warmup_cosine
from {{ cookiecutter.package_name }}.training.reports import per_class_accuracy


@pytest.mark.parametrize("backbone", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1"])
def test_forward_gives_one_logit_per_class(backbone):
    model = ImageClassifier(num_classes=7, backbone=backbone).eval()
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


def test_predicted_probabilities_keep_float32_digits_under_the_default_bf16_mixed():
    # predict's CSV gave bfloat16's 3 digits (0.578125 where float32 gives 0.580590).
    model = ImageClassifier(num_classes=7, backbone="resnet18").eval()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, probabilities = model(images), model.predict_step(images, 0)
    assert logits.dtype == torch.bfloat16 and probabilities.dtype == torch.float32
    assert torch.equal(probabilities, logits.float().softmax(-1))
    assert probabilities.sum(-1).sub(1).abs().max() < 1e-6


def test_unknown_backbone_fails_at_once_with_the_closest_names():
    with pytest.raises(ValueError, match="Unknown backbone 'resnet81'.*resnet18"):
        ImageClassifier(num_classes=3, backbone="resnet81")


def test_pretrained_weights_that_cannot_be_downloaded_say_where_to_put_them(monkeypatch):
    def offline(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    with pytest.raises(MissingError, match=r"resnet18-f37072fd\.pth.*--model\.pretrained=false"):
        ImageClassifier(num_classes=3, backbone="resnet18", pretrained=True)


@pytest.mark.parametrize("backbone", ["resnet18", "squeezenet1_1"])
def test_pretrained_weights_load_and_get_a_new_head(monkeypatch, backbone):
    imagenet = torchvision.models.get_model(backbone, weights=None).state_dict()
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", lambda *a, **k: imagenet)
    model = ImageClassifier(num_classes=4, backbone=backbone, pretrained=True).eval()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 4)
    some_kernel = next(name for name in imagenet if name.endswith("weight") and imagenet[name].ndim == 4)
    assert torch.equal(model.backbone.state_dict()[some_kernel], imagenet[some_kernel])


def test_init_weights_start_the_backbone_from_a_checkpoint_and_its_head_where_the_classes_are_the_same(tmp_path):
    trained = ImageClassifier(num_classes=6, backbone="resnet18", class_names=list("abcdef"))
    checkpoint = tmp_path / "trained.ckpt"
    torch.save({"state_dict": trained.state_dict(), "hyper_parameters": dict(trained.hparams)}, checkpoint)
    same = ImageClassifier(num_classes=6, backbone="resnet18", class_names=list("abcdef"), init_weights=str(checkpoint))
    assert all(torch.equal(weights, trained.backbone.state_dict()[name])
               for name, weights in same.backbone.state_dict().items())  # fmt: skip
    for other in (list("abcdeg"), list("abcd")):  # other names, another number
        started = ImageClassifier(num_classes=len(other), backbone="resnet18", class_names=other,
                                  init_weights=str(checkpoint))  # fmt: skip
        assert torch.equal(started.backbone.conv1.weight, trained.backbone.conv1.weight)
        assert not torch.equal(started.backbone.fc.bias[:4], trained.backbone.fc.bias[:4]), "a new head"


def test_a_model_and_data_made_in_python_train_at_the_datas_batch_size(caplog, tmp_path, tiny_shapes):
    # The model's batch_size kept its default, 64: the learning rate was scaled by it, and Lightning's
    # default logger stopped on two batch sizes in the run's hyperparameters.
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=16, image_size=32)
    model = ImageClassifier(num_classes=6, lr=0.002)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=1, default_root_dir=tmp_path,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with caplog.at_level("INFO"):
        trainer.fit(model, data)
    assert "Learning rate 0.0005 = 0.002 x effective batch 16 (16 per device" in caplog.text


def test_pretrained_googlenet_drops_its_auxiliary_heads(monkeypatch):
    imagenet = torchvision.models.get_model("googlenet", weights=None, aux_logits=True, init_weights=True).state_dict()
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", lambda *a, **k: imagenet)
    model = ImageClassifier(num_classes=4, backbone="googlenet", pretrained=True).train()
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 4)


@pytest.mark.parametrize("backbone", ["resnet18", "googlenet"])
def test_checkpoint_of_a_pretrained_model_reloads_offline_as_it_trained(monkeypatch, tmp_path, tiny_shapes, backbone):
    # googlenet (and inception_v3) came back without the input map torchvision sets with ImageNet weights
    # (transform_input): every prediction of the reloaded model was another model's.
    extra = {"aux_logits": True, "init_weights": True} if backbone == "googlenet" else {}
    imagenet = torchvision.models.get_model(backbone, weights=None, **extra).state_dict()
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", lambda *a, **k: imagenet)
    model = ImageClassifier(num_classes=6, backbone=backbone, pretrained=True)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, ImageDataModule(tiny_shapes, num_workers=0, batch_size=8))
    trainer.save_checkpoint(tmp_path / "model.ckpt")

    def offline(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    reloaded = ImageClassifier.load_from_checkpoint(tmp_path / "model.ckpt", map_location="cpu")
    assert torch.equal(reloaded.backbone.fc.weight, model.backbone.fc.weight)
    images = torch.randn(2, 3, 64, 64)
    # googlenet's input map, whose loss the near-constant outputs of a model this little trained hardly show.
    assert getattr(reloaded.backbone, "transform_input", None) == getattr(model.backbone, "transform_input", None)
    with torch.no_grad():  # to float32's rounding: the trained model's weights are laid out channels last
        torch.testing.assert_close(reloaded.eval()(images), model.eval()(images), rtol=0, atol=1e-5)
        # A new run started from its weights (model.init_weights) too.
        started = ImageClassifier(num_classes=6, backbone=backbone, init_weights=str(tmp_path / "model.ckpt"))
        torch.testing.assert_close(started.eval()(images), model(images), rtol=0, atol=1e-5)
    assert getattr(started.backbone, "transform_input", None) == getattr(model.backbone, "transform_input", None)


def fake_trainer(processes: int = 1, accumulate: int = 1, steps: float = 100) -> SimpleNamespace:
    """What configure_optimizers reads of a Trainer running `processes` data-parallel processes, from no checkpoint."""
    shards = {"num_replicas": processes, "rank": 0} if processes > 1 else None
    return SimpleNamespace(distributed_sampler_kwargs=shards, accumulate_grad_batches=accumulate, ckpt_path=None,
                           estimated_stepping_batches=steps, strategy=SimpleNamespace(),
                           gradient_clip_val=None)  # fmt: skip


@pytest.mark.parametrize("backbone", ["resnet18", "resnext50_32x4d"])
def test_the_small_image_stem_keeps_the_resolution_and_the_weights(backbone):
    side, weights = {}, {}
    for small in (False, True):
        model = ImageClassifier(num_classes=3, backbone=backbone, small_image_stem=small)
        model.backbone.layer1.register_forward_hook(lambda _, __, out, small=small: side.update({small: out.shape[-1]}))
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)
        weights[small] = {name: tensor.shape for name, tensor in model.state_dict().items()}
    # The ImageNet stem halves 32 px twice (stride-2 convolution, stride-2 max-pool); the small one neither.
    assert side == {False: 32 // 4, True: 32}
    assert weights[False] == weights[True]  # pretrained weights and checkpoints load into either


def test_the_small_image_stem_is_refused_where_a_backbone_has_no_resnet_stem():
    with pytest.raises(ConfigError, match="small_image_stem works with ResNet stems.*efficientnet_b0"):
        ImageClassifier(num_classes=3, backbone="efficientnet_b0", small_image_stem=True)


def test_norms_and_biases_get_no_weight_decay():
    model = ImageClassifier(num_classes=3, weight_decay=0.1)
    model._trainer = fake_trainer()
    groups = model.configure_optimizers()["optimizer"].param_groups  # the head's, then the backbone's
    assert [group["weight_decay"] for group in groups] == [0.1, 0.0, 0.1, 0.0]
    (head,) = head_names(model.backbone, 3)
    head_params = list(model.backbone.get_submodule(head).parameters())
    assert [p for group in groups[:2] for p in group["params"]] == head_params
    decay = [p for group in groups if group["weight_decay"] for p in group["params"]]
    no_decay = [p for group in groups if not group["weight_decay"] for p in group["params"]]
    assert all(p.ndim >= 2 for p in decay) and all(p.ndim == 1 for p in no_decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))


def test_learning_rate_scales_with_the_effective_batch():
    model = ImageClassifier(num_classes=3, lr=1e-3, batch_size=32, base_batch_size=64)
    model._trainer = fake_trainer(processes=4, accumulate=2)
    assert model.scaled_lr() == pytest.approx(1e-3 * 32 * 4 * 2 / 64)
    model.hparams.scale_lr = False
    assert model.scaled_lr() == 1e-3


def test_schedule_warms_up_then_decays_to_zero():
    factors = [warmup_cosine(step, warmup_steps=10, total_steps=100) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))
    assert factors[100] == pytest.approx(0.0, abs=1e-9) and math.isclose(factors[55], 0.5)


def test_schedule_needs_the_run_length():
    model = ImageClassifier(num_classes=3)
    model._trainer = fake_trainer(steps=math.inf)
    with pytest.raises(ValueError, match="max_epochs or trainer.max_steps"):
        model.configure_optimizers()


def test_class_names_must_match_num_classes():
    with pytest.raises(ValueError, match="3 class names"):
        ImageClassifier(num_classes=2, class_names=["a", "b", "c"])


def test_model_and_data_with_different_classes_stop_before_training(tiny_shapes):
    trainer = L.Trainer(accelerator="cpu", fast_dev_run=True, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="model has 3 classes but the data has 6"):
        trainer.fit(ImageClassifier(num_classes=3), ImageDataModule(tiny_shapes, num_workers=0))


class RecordLoss(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


def test_overfitting_one_batch_drives_the_loss_down(tiny_shapes):
    L.seed_everything(0)
    data = ImageDataModule(tiny_shapes, batch_size=8, image_size=32, num_workers=0)
    model = ImageClassifier(num_classes=6, lr=2e-3, warmup_fraction=0.0, batch_size=8, base_batch_size=8)
    recorder = RecordLoss()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=40,
        overfit_batches=1,
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    assert min(recorder.losses[-5:]) < 0.2 * recorder.losses[0]


@pytest.mark.parametrize(
    ("backbone", "channels_last", "expected"),
    [("resnet18", True, True), ("resnet18", False, False), ("vit_b_16", True, False)],
)
def test_convolutional_backbones_train_channels_last(tiny_shapes, backbone, channels_last, expected):
    model = ImageClassifier(num_classes=6, backbone=backbone, channels_last=channels_last)
    trainer = L.Trainer(accelerator="cpu", fast_dev_run=True, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(model, ImageDataModule(tiny_shapes, num_workers=0, batch_size=4, image_size=32 if expected else 224))
    kernels = [m.weight for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    assert all(k.is_contiguous(memory_format=torch.channels_last) for k in kernels) == expected
    assert all(k.is_contiguous() for k in kernels) != expected


def test_the_cpu_steps_adamw_with_its_fused_kernel(tiny_shapes):
    model = ImageClassifier(num_classes=6, backbone="resnet18")
    trainer = L.Trainer(accelerator="cpu", fast_dev_run=True, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(model, ImageDataModule(tiny_shapes, num_workers=0, batch_size=4, image_size=32))
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True


def test_compile_mode_compiles_the_backbone_in_place(monkeypatch):
    compiled = []
    model = ImageClassifier(num_classes=3, compile_mode="reduce-overhead")
    monkeypatch.setattr(model.backbone, "compile", lambda **options: compiled.append(options))
    model._trainer = SimpleNamespace(strategy=SimpleNamespace())
    model.configure_model()
    model.configure_model()  # once per process, whatever the number of stages
    assert compiled == [{"mode": "reduce-overhead"}]
    assert all(not name.startswith("backbone._orig_mod") for name in model.state_dict())


class HostReadError(AssertionError):
    """A tensor was read back to the host: on a GPU, the host would wait for the device there."""


class TrainingStepWithoutHostReads(ImageClassifier):
    def training_step(self, batch, batch_idx):
        def refuse(*args, **kwargs):
            raise HostReadError("the training step read a tensor back to the host")

        saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse)
        try:
            return super().training_step(batch, batch_idx)
        finally:
            for name, method in saved.items():
                setattr(torch.Tensor, name, method)


HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def test_the_training_step_never_waits_for_the_device(tiny_shapes):
    model = TrainingStepWithoutHostReads(num_classes=6, batch_size=8, base_batch_size=8)
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, ImageDataModule(tiny_shapes, num_workers=0, batch_size=8))
    assert trainer.global_step == 3


def test_per_class_accuracy_is_each_class_recall():
    matrix = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    first, second, absent = per_class_accuracy(matrix)
    assert (first, second) == (0.75, 1.0) and math.isnan(absent)
