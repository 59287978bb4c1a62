"""The training recipe's options, each in real training: Mixup/CutMix, EMA of the weights, class
imbalance, stochastic depth and fine-tuning's backbone learning rate."""

import json
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import ON_CPU, on_data, refusal, run_cli
from lightning.pytorch.strategies import ModelParallelStrategy
from PIL import Image
from test_exact_resume import FORMAT_OF
from torchvision.ops import StochasticDepth

from {{ cookiecutter.package_name }} import model as model_module
from {{ cookiecutter.package_name }}.backbone import build_backbone, head_names
from {{ cookiecutter.package_name }}.cli import build
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.datasets.sampling import ClassBalancedSampler
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.model import backbone_factor, warmup_cosine
from {{ cookiecutter.package_name }}.training.batch_mixing import BatchMixing
from {{ cookiecutter.package_name }}.training.ema import ModelEMA

SMALL = ["--data.image_size=32", "--trainer.limit_val_batches=2", "--trainer.deterministic=true"]


def logged_to(folder: str) -> list[str]:
    """A CSV logger writing under `folder`, where the run's checkpoints go too."""
    return ["--trainer.logger={{ cookiecutter.package_name }}.training.csv_logging.ResumableCSVLogger",
            f"--trainer.logger.save_dir={folder}", "--trainer.logger.name=run"]  # fmt: skip


def last_checkpoint(folder: str) -> dict:
    """The newest run's last.ckpt (a run resumed outside the CLI writes into a run folder of its own)."""
    saved = [torch.load(path, weights_only=True) for path in Path(folder).glob("run/*/checkpoints/last.ckpt")]
    return max(saved, key=lambda checkpoint: checkpoint["global_step"])


def fitted(tiny_shapes, *options: str, ckpt_path: str | None = None):
    cli = build([*ON_CPU, *on_data(tiny_shapes), *SMALL, *options])
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path)
    return cli


def batch(classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(classes, 3, 8, 8), torch.arange(classes)  # one image of each class


def test_gradients_clip_under_bf16_mixed_on_the_cpu(monkeypatch, in_project_copy, tiny_shapes):
    # The CPU's fused AdamW, which Lightning refuses to clip under mixed precision: a traceback at the first step.
    bf16 = ["--trainer.accelerator=cpu", "--trainer.precision=bf16-mixed", "--trainer.fast_dev_run=true"]
    run_cli(monkeypatch, "fit", *bf16, *on_data(tiny_shapes), "--trainer.gradient_clip_val=0.5")


def test_mixup_blends_each_image_with_its_neighbour_and_the_labels_alike():
    images, labels = batch()
    state = torch.random.get_rng_state()
    mixed, targets = BatchMixing(4, mixup_alpha=0.4, cutmix_alpha=0, prob=1, switch_prob=0)(images, labels, 0, 0, 5)
    assert torch.equal(torch.random.get_rng_state(), state), "the run's own random state is untouched"
    share = targets[0, 0].item()  # how much of image 0 is in mixed image 0
    assert 0 < share < 1 and torch.allclose(targets.sum(1), torch.ones(4))
    assert torch.allclose(mixed, share * images + (1 - share) * images.roll(1, 0), atol=1e-6)
    assert torch.allclose(targets, share * torch.eye(4) + (1 - share) * torch.eye(4).roll(1, 0))
    again, _ = BatchMixing(4, 0.4, 0, 1, 0)(images, labels, 0, 0, 5)
    other, _ = BatchMixing(4, 0.4, 0, 1, 0)(images, labels, 0, 1, 5)
    assert torch.equal(again, mixed) and not torch.equal(other, mixed), "seeded by run, process and batch"


def test_cutmix_labels_weigh_each_image_by_the_area_it_keeps():
    images, labels = batch()
    mixed, targets = BatchMixing(4, mixup_alpha=0, cutmix_alpha=1.0, prob=1, switch_prob=1)(images, labels, 0, 0, 3)
    kept = (mixed == images).all(dim=1).flatten(1).float().mean(1)  # share of each image's own pixels
    pasted = (mixed == images.roll(1, 0)).all(dim=1).flatten(1).float().mean(1)
    assert torch.allclose(kept + pasted, torch.ones(4))
    assert torch.allclose(targets[torch.arange(4), labels], kept, atol=1e-6)


def test_unmixed_batches_get_one_hot_targets():
    images, labels = batch()
    mixed, targets = BatchMixing(4, 0.4, 1.0, prob=0, switch_prob=0.5)(images, labels, 0, 0, 0)
    assert torch.equal(mixed, images) and torch.equal(targets, torch.eye(4))


def test_mixing_trains_on_soft_targets_and_turns_training_accuracy_off(in_project_copy, tiny_shapes):
    cli = fitted(tiny_shapes, "--trainer.fast_dev_run=2", "--model.mixup_alpha=0.2", "--model.cutmix_alpha=1.0",
                 "--model.label_smoothing=0.1")  # fmt: skip
    logged = set(cli.trainer.callback_metrics)
    assert {"train/loss_step", "val/acc"} <= logged and not [name for name in logged if name.startswith("train/acc")]
    assert "train/acc" not in cli.model.logged_metrics()


class TrainingInputs(L.Callback):
    """The images each training epoch's steps fed the backbone (after mixing), in order."""

    def __init__(self) -> None:
        self.by_epoch: dict[int, list[torch.Tensor]] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        def keep(module, inputs) -> None:
            if module.training:
                self.by_epoch.setdefault(trainer.current_epoch, []).append(inputs[0].detach().clone())

        pl_module.backbone.register_forward_pre_hook(keep)


def trained_inputs(data: list[str], *options: str) -> dict[int, torch.Tensor]:
    """The images of two whole epochs{{ " (LitData's workers count an epoch cut short by
    trainer.limit_train_batches as they please)" if cookiecutter.streaming == "yes" }}."""
    inputs = TrainingInputs()
    cli = build([*ON_CPU, *data, *SMALL, "--trainer.max_epochs=2", *options])
    cli.trainer.callbacks.append(inputs)
    cli.trainer.fit(cli.model, cli.datamodule)
    return {epoch: torch.cat(batches) for epoch, batches in inputs.by_epoch.items()}


STRONG = ["--data.augment=trivialaugment", "--data.random_erasing=0.5", "--model.mixup_alpha=0.4",
          "--model.cutmix_alpha=1.0"]  # fmt: skip


@pytest.mark.parametrize("dataset", ["tiny_shapes"{{ ', "shards"' if cookiecutter.streaming == "yes" }}])
def test_the_first_epochs_train_as_basic_until_the_policy_and_mixing_start(in_project_copy, request, caplog, dataset):
    # Data workers that outlive the epochs, as users get them: they learn the epoch from the loader.
    data = [*on_data(request.getfixturevalue(dataset)), *FORMAT_OF[dataset], "--data.num_workers=2"]
    basic = trained_inputs(data, *logged_to("basic"))
    caplog.clear()
    delayed = trained_inputs(data, *logged_to("delayed"), *STRONG, "--data.basic_augment_epochs=1",
                             "--model.unmixed_epochs=1")  # fmt: skip
    assert "Until epoch 1 the training images get the basic augmentation, then trivialaugment and random erasing " \
           "0.5 too (data.basic_augment_epochs)." in caplog.text  # fmt: skip
    assert "Until epoch 1 the model trains on whole images, then on Mixup/CutMix blends (model.unmixed_epochs)." \
           in caplog.text  # fmt: skip
    strong = trained_inputs(data, *logged_to("strong"), *STRONG)
    assert torch.equal(delayed[0], basic[0]), "epoch 0 as the basic recipe's"
    assert torch.equal(delayed[1], strong[1]) and not torch.equal(strong[1], basic[1]), "epoch 1 as the strong one's"


def test_a_run_that_ends_before_the_policy_and_mixing_start_says_so(in_project_copy, tiny_shapes, caplog):
    fitted(tiny_shapes, "--trainer.fast_dev_run=1", *STRONG, "--data.basic_augment_epochs=3",
           "--model.unmixed_epochs=3")  # fmt: skip
    assert "(data.basic_augment_epochs); this run ends before, at epoch 0." in caplog.text
    assert "(model.unmixed_epochs); this run ends before, at epoch 0." in caplog.text
    caplog.clear()
    # 9 steps an epoch (72 images in batches of 8): max_steps ends this run in epoch 1, max_epochs later.
    fitted(tiny_shapes, "--trainer.max_epochs=5", "--trainer.max_steps=10", *STRONG,
           "--data.basic_augment_epochs=3", "--model.unmixed_epochs=2")  # fmt: skip
    assert "(data.basic_augment_epochs); this run ends before, at epoch 1." in caplog.text
    assert "(model.unmixed_epochs); this run ends before, at epoch 1." in caplog.text
    caplog.clear()
    fitted(tiny_shapes, "--trainer.fast_dev_run=1", "--data.basic_augment_epochs=3", "--model.unmixed_epochs=3")
    assert "Until epoch" not in caplog.text, "nothing waits for them: the recipe's delays with its policy turned off"


def test_a_run_resumed_where_the_policy_and_mixing_start_says_nothing_of_them(in_project_copy, tiny_shapes, caplog):
    # Stopped at epoch 0's end: with max_steps set, Lightning's epoch is still 0 as the resumed run starts epoch 1.
    options = [*STRONG, "--data.basic_augment_epochs=1", "--model.unmixed_epochs=1", "--trainer.max_epochs=2",
               "--trainer.max_steps=100", *logged_to("runs")]  # fmt: skip
    fitted(tiny_shapes, *options, f"--trainer.callbacks+={STOP_AFTER_FIRST_EPOCH}")
    (interrupted,) = Path("runs").glob("run/*/checkpoints/last.ckpt")
    caplog.clear()
    fitted(tiny_shapes, *options, ckpt_path=str(interrupted))
    assert "Until epoch" not in caplog.text


def test_a_negative_delay_is_refused():
    with pytest.raises(ConfigError, match="data.basic_augment_epochs must be 0 or more, got -1"):
        ImageDataModule(basic_augment_epochs=-1, augment="trivialaugment")
    with pytest.raises(ConfigError, match="model.unmixed_epochs must be 0 or more, got -1"):
        model_module.ImageClassifier(num_classes=2, unmixed_epochs=-1)


EMA = json.dumps({"class_path": "{{ cookiecutter.package_name }}.training.ema.ModelEMA", "init_args": {"decay": 0.9}})
STOP_AFTER_FIRST_EPOCH = json.dumps({"class_path": "helper_callbacks.StopAfterEpoch", "init_args": {"epoch": 0}})


@pytest.mark.parametrize("dataset", ["tiny_shapes"{{ ', "shards"' if cookiecutter.streaming == "yes" }}])
def test_resuming_with_ema_and_mixing_gives_the_uninterrupted_runs_weights(in_project_copy, request, caplog, dataset):
    # Resumed between epochs (test_exact_resume.py resumes mid-epoch), with a backbone with dropout,
    # into the epoch where the policy and mixing start.
    images = request.getfixturevalue(dataset)
    options = [*FORMAT_OF[dataset], "--trainer.max_epochs=2", "--model.backbone=mobilenet_v3_small",
               "--data.augment=trivialaugment", "--data.basic_augment_epochs=1", "--model.mixup_alpha=0.4",
               "--model.cutmix_alpha=1.0", "--model.unmixed_epochs=1", f"--trainer.callbacks+={EMA}"]  # fmt: skip
    whole = fitted(images, *options, *logged_to("whole"))
    fitted(images, *options, *logged_to("parts"), f"--trainer.callbacks+={STOP_AFTER_FIRST_EPOCH}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    assert torch.load(interrupted, weights_only=True)["epoch"] == 0
    caplog.clear()
    resumed = fitted(images, *options, *logged_to("parts"), ckpt_path=str(interrupted))
    assert "Until epoch" not in caplog.text, "the resumed run starts where the policy and mixing do"
    assert resumed.trainer.global_step == whole.trainer.global_step == 18  # 72 images in batches of 8, 2 epochs
    one, other = last_checkpoint("whole"), last_checkpoint("parts")
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert one[key].keys() == other[key].keys()
        assert all(torch.equal(one[key][name], other[key][name]) for name in one[key]), key
    assert one["averaging_state"]["n_averaged"] == 18
    averaged, trained = one["state_dict"], one["current_model_state"]
    assert any(not torch.equal(averaged[name], trained[name]) for name in averaged), "an average, not a copy"


def test_a_run_resumed_without_its_ema_goes_on_from_the_trained_weights(in_project_copy, tiny_shapes, caplog):
    # Its checkpoint's state_dict is the average: training went on from it, with the trained weights'
    # optimizer state, and the trained weights were lost.
    options = ["--trainer.max_epochs=2", *logged_to("runs")]
    fitted(tiny_shapes, *options, f"--trainer.callbacks+={EMA}", f"--trainer.callbacks+={STOP_AFTER_FIRST_EPOCH}")
    (interrupted,) = Path("runs").glob("run/*/checkpoints/last.ckpt")
    saved = torch.load(interrupted, weights_only=True)
    resumed = fitted(tiny_shapes, "--trainer.max_epochs=1", *logged_to("runs"), ckpt_path=str(interrupted))
    assert resumed.trainer.global_step == saved["global_step"], "restored, nothing trained"
    weights = resumed.model.state_dict()
    assert all(torch.equal(weights[name], value) for name, value in saved["current_model_state"].items())
    assert any(not torch.equal(weights[name], value) for name, value in saved["state_dict"].items())
    assert "training goes on from the trained weights, without the average" in caplog.text
    # Evaluated, the checkpoint is its average, as before.
    validated = build([*ON_CPU, *on_data(tiny_shapes), *SMALL, *logged_to("runs")])
    validated.trainer.validate(validated.model, validated.datamodule, ckpt_path=str(interrupted))
    weights = validated.model.state_dict()
    assert all(torch.equal(weights[name], value) for name, value in saved["state_dict"].items())


def test_validation_and_the_checkpoints_use_the_average(in_project_copy, tiny_shapes):
    cli = fitted(tiny_shapes, "--trainer.max_epochs=1", f"--trainer.callbacks+={EMA}", *logged_to("runs"),
                 "--trainer.limit_val_batches=1.0")  # fmt: skip
    saved = last_checkpoint("runs")
    # By hand: the checkpoint's weights (the average) on every validation image.
    model = type(cli.model)(num_classes=6, class_names=cli.model.hparams.class_names).eval()
    model.load_state_dict(saved["state_dict"])
    data = cli.datamodule
    with torch.no_grad():
        predicted = [model(data.preprocessing.normalize(image[None])).argmax().item() for image, _ in data.val_set]
    correct = [guess == label for guess, (_, label) in zip(predicted, data.val_set.samples, strict=True)]
    assert cli.trainer.callback_metrics["val/acc"].item() == pytest.approx(sum(correct) / len(correct), abs=1e-6)
    # After fit the module holds the average too, as the last validation{{ " and export see" if cookiecutter.inference == "yes" else " sees" }} it.
    assert all(torch.equal(value, saved["state_dict"][name]) for name, value in cli.model.state_dict().items())


def test_ema_is_refused_where_the_weights_are_sharded():
    trainer = SimpleNamespace(strategy=ModelParallelStrategy())
    with pytest.raises(ConfigError, match="ModelEMA averages a whole copy of the model on each process"):
        ModelEMA().setup(trainer, None, "fit")


def uneven_folder(root, counts: dict[str, int]):
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (16, 16), (i * 7 % 255, 40 * len(name), 90)).save(root / name / f"{i}.png")
    return root


@pytest.mark.parametrize("balanced", [False, True])
def test_the_imbalance_warning_is_said_until_a_remedy_it_names_is_on(tmp_path, balanced):
    # It was said again with the remedy on, as if the option had not taken.
    data = ImageDataModule(uneven_folder(tmp_path / "uneven", {"common": 40, "rare": 3}), balanced_sampling=balanced)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup("fit")
    said = [str(warning.message) for warning in caught if "Severe class imbalance" in str(warning.message)]
    assert said == ([] if balanced else [
        "Severe class imbalance: rare (2) against 32 training images for common. Accuracy will mostly reflect the "
        "common classes (watch val/f1); consider model.class_weights: balanced or data.balanced_sampling: true."
    ])  # fmt: skip


def test_balanced_class_weights_are_the_inverse_class_frequencies(in_project_copy, tmp_path):
    folder = uneven_folder(tmp_path / "uneven", {"common": 40, "middle": 12, "rare": 3})
    # With the EMA, which copies the model before the weights are known.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = ["--trainer.fast_dev_run=2", "--model.class_weights=balanced", f"--trainer.callbacks+={EMA}"]
        cli = fitted(folder, *options)
    assert not [warning for warning in caught if "Severe class imbalance" in str(warning.message)]  # the remedy is on
    counts = cli.datamodule.train_class_counts()
    assert counts == [32, 10, 2]  # 20% of each class held out for validation
    total = sum(counts)
    expected = [total / (3 * count) for count in counts]
    assert cli.model.loss_weights.tolist() == pytest.approx(expected)


def test_balanced_sampling_draws_each_class_alike_and_processes_share_the_draws(in_project_copy, tmp_path):
    labels = [0] * 300 + [1] * 60 + [2] * 15
    drawn = torch.tensor(ClassBalancedSampler(labels, seed=1).epoch_indices())
    assert len(drawn) == len(labels)
    shares = torch.bincount(torch.tensor(labels)[drawn], minlength=3) / len(drawn)
    assert torch.allclose(shares, torch.full((3,), 1 / 3), atol=0.06)
    # Two processes take alternate draws of one sequence: halves of an epoch, not two copies of one.
    ranks = [ClassBalancedSampler(labels, num_replicas=2, rank=rank, seed=1).epoch_indices() for rank in (0, 1)]
    assert [len(share) for share in ranks] == [188, 188] and ranks[0] != ranks[1]
    shares = torch.bincount(torch.tensor(labels)[ranks[0] + ranks[1]], minlength=3) / 376
    assert torch.allclose(shares, torch.full((3,), 1 / 3), atol=0.06)
    sampler = ClassBalancedSampler(labels, seed=1)
    sampler.set_epoch(1)
    assert sampler.epoch_indices() != drawn.tolist(), "each epoch draws anew"
    folder = uneven_folder(tmp_path / "uneven", {"common": 40, "rare": 10})
    cli = fitted(folder, "--trainer.fast_dev_run=2", "--data.balanced_sampling=true")
    assert isinstance(cli.trainer.train_dataloader.sampler, ClassBalancedSampler)


def test_stochastic_depth_sets_the_deepest_blocks_drop_probability():
    model = build_backbone("convnext_tiny", 5, pretrained=False, stochastic_depth=0.3)
    drops = [layer.p for layer in model.modules() if isinstance(layer, StochasticDepth)]
    assert drops[-1] == pytest.approx(0.3) and drops[0] == 0 and drops == sorted(drops)
    assert drops[9] == pytest.approx(0.3 * 9 / 17)  # torchvision's linear rule over the 18 blocks
    with pytest.raises(ConfigError, match="resnet18 has no stochastic depth"):
        build_backbone("resnet18", 5, pretrained=False, stochastic_depth=0.1)


def test_stochastic_depth_trains(in_project_copy, tiny_shapes):
    options = ["--trainer.fast_dev_run=1", "--model.backbone=efficientnet_b0", "--model.stochastic_depth=0.3"]
    cli = fitted(tiny_shapes, *options)
    assert max(layer.p for layer in cli.model.modules() if isinstance(layer, StochasticDepth)) == pytest.approx(0.3)


def test_a_frozen_backbone_stays_put_while_the_head_learns(in_project_copy, tiny_shapes):
    torch.manual_seed(0)
    cli = build([*ON_CPU, *on_data(tiny_shapes), *SMALL, "--trainer.max_epochs=2", *logged_to("runs"),
                 "--trainer.limit_train_batches=3", "--model.frozen_backbone_epochs=1",
                 f"--trainer.callbacks+={STOP_AFTER_FIRST_EPOCH}"])  # fmt: skip
    before = {name: value.clone() for name, value in cli.model.named_parameters()}
    cli.trainer.fit(cli.model, cli.datamodule)
    changed = {name for name, value in cli.model.named_parameters() if not torch.equal(value, before[name])}
    (head,) = head_names(cli.model.backbone, 6)
    assert changed == {f"backbone.{head}.weight", f"backbone.{head}.bias"}


def test_the_backbone_warms_up_again_after_a_freeze():
    schedule = partial(warmup_cosine, warmup_steps=10, total_steps=100)
    factors = [backbone_factor(step, schedule, scale=0.5, frozen_steps=20, warmup_steps=10) for step in range(32)]
    assert factors[:20] == [0.0] * 20
    assert factors[20:30] == pytest.approx([0.5 * (i + 1) / 10 * schedule(20 + i) for i in range(10)])
    assert factors[31] == pytest.approx(0.5 * schedule(31))


def test_a_backbone_frozen_for_the_whole_run_is_refused(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), "--trainer.max_epochs=2",
                      "--model.frozen_backbone_epochs=2")  # fmt: skip
    assert message == (
        "error: model.frozen_backbone_epochs (2) must be below trainer.max_epochs (2): the backbone would never train."
    )


def test_a_checkpoint_of_another_optimizer_layout_is_refused_in_one_line(monkeypatch, capsys, trained, tiny_shapes):
    (last,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    saved = torch.load(last, weights_only=True)
    earlier = json.loads(json.dumps(saved["optimizer_states"][0]["param_groups"]))
    saved["optimizer_states"][0]["param_groups"] = earlier[:2]  # as an earlier version saved them
    torch.save(saved, last)
    capsys.readouterr()  # the training's output
    # With the default logger: refused before it starts, so the line is the whole output (no W&B header).
    resume = ["fit", *ON_CPU, *on_data(tiny_shapes), "--trainer.max_epochs=2", f"--ckpt_path={last}"]
    message = refusal(monkeypatch, capsys, *resume)
    assert "The checkpoint's optimizer has 2 parameter groups and this model's 4: the trainable" in message

    # As many groups, of other sizes: a tensor frozen with requires_grad in model.py since (torch's traceback).
    saved["optimizer_states"][0]["param_groups"] = earlier
    torch.save(saved, last)
    build = model_module.build_backbone

    def with_its_stem_frozen(*args):
        backbone = build(*args)
        next(backbone.parameters()).requires_grad_(False)  # whatever the backbone, one of its decayed group's
        return backbone

    monkeypatch.setattr(model_module, "build_backbone", with_its_stem_frozen)
    message = refusal(monkeypatch, capsys, *resume)
    assert "The checkpoint's optimizer has parameter groups of [" in message and "model.py edited" in message


def test_a_checkpoint_of_another_optimizer_is_refused_in_one_line(monkeypatch, capsys, trained, tiny_shapes):
    # configure_optimizers edited to SGD: torch loaded AdamW's settings into its groups, and its first
    # step stopped with KeyError: 'momentum'.
    (last,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    capsys.readouterr()  # the training's output
    monkeypatch.setattr(torch.optim, "AdamW", lambda groups, lr, fused: torch.optim.SGD(groups, lr, momentum=0.9))
    with pytest.raises(SystemExit) as stopped:  # as the optimizer is made: after the logger's header
        run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), "--trainer.max_epochs=2", f"--ckpt_path={last}")
    assert "Traceback" not in str(capsys.readouterr())
    assert stopped.value.code == (
        "error: The checkpoint's optimizer is AdamW and this model's SGD (configure_optimizers in model.py edited): "
        "its state cannot carry over. Resume it with the code that saved it, or start a new run."
    )


def test_the_backbone_learning_rate_is_a_share_of_the_heads(in_project_copy, tiny_shapes):
    cli = fitted(tiny_shapes, "--trainer.fast_dev_run=2", "--model.backbone_lr_scale=0.1")
    # The factors of the scheduler's groups (head decayed and not, then the backbone's) at step 1.
    factors = [factor(1) for factor in cli.trainer.lr_scheduler_configs[0].scheduler.lr_lambdas]
    assert factors[0] == factors[1] > 0 and factors[2:] == pytest.approx([0.1 * factors[0]] * 2)


def test_a_data_module_alone_warns_of_no_imbalance_in_balanced_data(tiny_shapes, recwarn):
    ImageDataModule(tiny_shapes, num_workers=0).setup("fit")
    warned = [str(warning.message) for warning in recwarn]
    assert not [message for message in warned if "imbalance" in message or "hold none" in message]


@pytest.mark.parametrize(
    "split_by",
    ["a val/ folder without the class", "a val/ folder, its folder empty", "a split of a class of one image"],
)
def test_a_class_the_validation_images_lack_is_named(tmp_path, split_by):
    # val/acc, which picks the best checkpoint, and val/f1 would be silent about it. (An empty folder of
    # the class in val/ stopped the run, where a val/ without it warned.)
    counts = {"circle": 6, "square": 6, "star": 1 if split_by.startswith("a split") else 6}
    folder = uneven_folder(tmp_path / "data" / "train", counts).parent
    if split_by.startswith("a val/"):
        uneven_folder(folder / "val", {"circle": 2, "square": 2})
    if split_by.endswith("empty"):
        (folder / "val" / "star").mkdir()
    for stage in ("fit", "validate"):
        with pytest.warns(UserWarning, match="The validation images hold none of star: val/acc and the checkpoints"):
            ImageDataModule(folder, num_workers=0).setup(stage)
    data = ImageDataModule(folder, num_workers=0)
    data.trainer = SimpleNamespace(limit_val_batches=0)  # validation off: nothing to say of it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup("fit")
    assert not [warning for warning in caught if "hold none" in str(warning.message)]


def test_a_class_the_test_images_lack_is_named(tmp_path):
    # test/f1 averaged over the other classes without a word.
    folder = uneven_folder(tmp_path / "data" / "train", {"circle": 6, "square": 6, "star": 6}).parent
    uneven_folder(folder / "test", {"circle": 2, "square": 2})
    with pytest.warns(UserWarning, match="The test images hold none of star: test/acc says nothing of it"):
        ImageDataModule(folder, num_workers=0).setup("test")
