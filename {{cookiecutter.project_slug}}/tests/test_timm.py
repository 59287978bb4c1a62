"""timm backbones (the `timm` extra): built by name, trained, checkpointed, {{ "exported, " if cookiecutter.inference == "yes" }}sharded by block."""

import re
import sys

import huggingface_hub.constants
import pytest
import torch
from conftest import ON_CPU, on_data, refusal
from timm.layers import DropPath

from {{ cookiecutter.package_name }} import timm_backbones
from {{ cookiecutter.package_name }}.backbone import build_backbone, head_names
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.hardware.sharding import backbone_blocks
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.transforms import resolve_preprocessing

# timm's own tiny test models: real architectures, a few thousand parameters.
SMALL = "timm/test_convnext.r160_in1k"


def test_a_timm_backbone_trains_{{ "reloads_and_exports(monkeypatch, capsys," if cookiecutter.inference == "yes" else "and_reloads(monkeypatch," }} in_project_copy, tiny_shapes):
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *ON_CPU, *on_data(tiny_shapes),
                                      f"--model.backbone={SMALL}", "--data.image_size=32", "--trainer.max_epochs=1",
                                      "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])  # fmt: skip
    main()
    (checkpoint,) = in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    assert type(model.backbone).__module__.startswith("timm.models") and model.hparams.backbone == SMALL
{%- if cookiecutter.inference == "yes" %}
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "export", str(checkpoint), "--format=onnx",
                                      f"--images={tiny_shapes / 'test'}"])  # fmt: skip
    with pytest.raises(SystemExit) as done:
        main()
    printed = capsys.readouterr().out
    assert done.value.code == 0, printed
    assert float(printed.split("Largest difference from PyTorch on 8 real images: ")[1].split()[0]) < 1e-4
{%- endif %}


def test_an_unknown_timm_name_gets_the_closest_ones(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), "--model.backbone=timm/convnxt_tiny")
    assert message.startswith("error: Unknown timm model 'convnxt_tiny'. Closest: timm/convnext_tiny")


@pytest.mark.parametrize("name", ["convnext_atto", "resnet18.a1_in1k"])
def test_a_timm_name_without_its_prefix_is_told_the_prefix(monkeypatch, capsys, in_project_copy, tiny_shapes, name):
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), f"--model.backbone={name}")
    assert message == f"error: Unknown backbone {name!r}: timm's models are named with its prefix: timm/{name}"


def test_pretrained_weights_out_of_reach_fail_in_one_line_naming_the_cache(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(timm_backbones, "reachable", lambda host: False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(Exception) as raised:
        build_backbone("timm/resnet10t.c3_in1k", 6, pretrained=True)
    message = str(raised.value)
    assert message.startswith("Could not download the pretrained timm/resnet10t.c3_in1k weights")
    assert str(tmp_path / "hub") in message and "--model.pretrained=false" in message
    assert "cannot be reached" in capsys.readouterr().err


def test_pretrained_weights_neither_cached_nor_within_reach_are_found_before_fit(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(timm_backbones, "reachable", lambda host: False)
    missing = timm_backbones.pretrained_weights_missing(SMALL)
    assert missing.startswith(f"The pretrained {SMALL} weights are not in the cache and huggingface.co cannot be")
    assert f"copy its Hugging Face cache into {tmp_path}" in missing
    monkeypatch.setattr(timm_backbones, "reachable", lambda host: True)
    assert timm_backbones.pretrained_weights_missing(SMALL) is None


def test_pretrained_preprocessing_comes_from_timms_config():
    vit = resolve_preprocessing(224, "timm/vit_small_patch16_224.augreg_in21k_ft_in1k")
    assert (vit.mean, vit.std, vit.interpolation, vit.resize_size) == ((0.5,) * 3, (0.5,) * 3, "bicubic", 249)
    convnext = resolve_preprocessing(224, "timm/convnext_tiny.fb_in1k")
    assert (convnext.interpolation, convnext.resize_size) == ("bicubic", 256)  # crop_pct 0.875


def numbered_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """timm's own account of a model's blocks: the modules its group matcher numbers one by one."""
    matcher = model.group_matcher(coarse=False)["blocks"]
    patterns = [matcher] if isinstance(matcher, str) else [pattern for pattern, order in matcher if order is None]
    return [module for name, module in model.named_modules() if any(re.fullmatch(p[1:], name) for p in patterns)]


@pytest.mark.parametrize("name", ["test_convnext.r160_in1k", "test_vit.r160_in1k", "test_efficientnet.r160_in1k",
                                  "resnet10t.c3_in1k"])  # fmt: skip
def test_fsdp_shards_timm_backbones_block_by_block(name):
    model = build_backbone(f"timm/{name}", 6, pretrained=False)
    expected, found = numbered_blocks(model), backbone_blocks(model)
    assert expected and all(any(block is module for block in found) for module in expected)
    assert model not in found


def test_stochastic_depth_is_timms_drop_path_rate():
    model = build_backbone("timm/resnet10t.c3_in1k", 6, pretrained=False, stochastic_depth=0.2)
    assert max(layer.drop_prob for layer in model.modules() if isinstance(layer, DropPath)) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="timm/vgg11 has no stochastic depth"):
        build_backbone("timm/vgg11", 6, pretrained=False, stochastic_depth=0.1)


def test_the_head_is_timms_classifier_both_of_them_where_there_are_two():
    assert head_names(build_backbone(SMALL, 6, pretrained=False), 6) == ["head.fc"]
    # A distilled DeiT has a second head, which must learn (and be frozen) as the first does.
    model = ImageClassifier(num_classes=6, backbone="timm/deit_tiny_distilled_patch16_224.fb_in1k")
    assert head_names(model.backbone, 6) == ["head", "head_dist"]
    head, head_no_decay = model.parameter_groups()[:2]
    assert (head["name"], head_no_decay["name"]) == ("head", "head_no_decay")
    assert {p.shape for p in head["params"]} == {(6, 192)} and len(head["params"]) == 2
