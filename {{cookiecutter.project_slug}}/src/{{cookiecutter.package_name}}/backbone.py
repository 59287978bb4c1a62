"""Any torchvision classification model by name{{ " (or timm's, named timm/...)" if cookiecutter.timm == "yes" }}, with its head sized for our classes."""

import os
from pathlib import Path
from urllib.parse import urlparse

import torch
import torchvision
from torch import nn
from torchvision.ops import StochasticDepth

{% if cookiecutter.timm == "yes" -%}
from . import timm_backbones
{% endif -%}
from .errors import ConfigError, MissingError, closest
from .hardware.network import reachable
from .training.resume import check_checkpoint, refuse_sharded


def classification_models() -> list[str]:
    return torchvision.models.list_models(module=torchvision.models)


def check_backbone_name(name: str) -> None:
    """Fail at once on a name torchvision{{ " (or timm)" if cookiecutter.timm == "yes" }} does not know, listing the closest ones it does."""
{%- if cookiecutter.timm == "yes" %}
    if timm_backbones.is_timm(name):
        timm_backbones.check_name(name)
        return
{%- endif %}
    known = classification_models()
{%- if cookiecutter.timm == "yes" %}
    if name not in known and timm_backbones.knows(name):
        raise ConfigError(
            f"Unknown backbone {name!r}: timm's models are named with its prefix: {timm_backbones.PREFIX}{name}"
        )
{%- endif %}
    if name not in known:
        close = closest(name, known)
        raise ConfigError(
            f"Unknown backbone {name!r}. Closest torchvision classification models: {', '.join(close)}. "
            "List them all with: python -c 'import torchvision.models as m; print(m.list_models(module=m))'"
        )


# Image sides to offer when a backbone refuses the one configured: common ones, and the inputs of
# models with a fixed size (ViTs at 224, 384 and 518; Inception from 75 up).
SIDES = (32, 64, 75, 96, 112, 128, 160, 192, 224, 256, 299, 320, 384, 448, 512, 518)


def check_image_size(model: nn.Module, name: str, size: int) -> None:
    """Refuse an image size the backbone cannot take, naming the nearest one it can: one forward of
    one blank image, before any data is loaded (the run would otherwise fail after loading it,
    deep inside the model: a ViT takes one size only, Inception 75 px or more, MaxViT multiples of 32)."""
    refusal = _refusal(model, size)
    if refusal is None:
        return
    larger = [side for side in SIDES if side > size]
    smaller = [side for side in reversed(SIDES) if side < size]
    works = next((side for side in [*larger, *smaller] if _refusal(model, side) is None), None)
    fix = f"use --data.image_size {works}" if works else "use another --data.image_size or --model.backbone"
    raise ConfigError(f"{name} cannot take {size}-pixel images ({refusal}): {fix}.")


def _refusal(model: nn.Module, size: int) -> str | None:
    """Why `model` fails on one blank size x size image, or None when it does not."""
    modes = {module: module.training for module in model.modules()}  # a user's frozen layers stay in eval
    parameter = next(model.parameters())
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 3, size, size, device=parameter.device, dtype=parameter.dtype))
    except torch.OutOfMemoryError:
        raise  # not a matter of size: the run would fail the same way
    except (RuntimeError, ValueError, AssertionError) as error:  # what layers raise for a shape they cannot take
        return (str(error).splitlines() or [type(error).__name__])[0][:200]
    finally:
        for module, training in modes.items():
            module.training = training
    return None


def build_backbone(
    name: str, num_classes: int, pretrained: bool, stochastic_depth: float | None = None, small_image_stem: bool = False
) -> nn.Module:
    model = _build_any(name, num_classes, pretrained, stochastic_depth)
    if small_image_stem:
        keep_resolution_through_stem(model, name)
    return model


def _build_any(name: str, num_classes: int, pretrained: bool, stochastic_depth: float | None) -> nn.Module:
{%- if cookiecutter.timm == "yes" %}
    if timm_backbones.is_timm(name):
        return timm_backbones.build(name, num_classes, pretrained, stochastic_depth)
{%- endif %}
    model = _build(name, num_classes, pretrained)
    if stochastic_depth is not None:
        set_stochastic_depth(model, name, stochastic_depth)
    return model


def keep_resolution_through_stem(model: nn.Module, name: str) -> None:
    """A ResNet stem of stride 1 without its max-pool. The convolution keeps its weights (a 7 x 7
    kernel at stride 1 sees what it saw at stride 2), so pretrained ones still apply."""
    convolution, pool = getattr(model, "conv1", None), getattr(model, "maxpool", None)
    if not (isinstance(convolution, nn.Conv2d) and isinstance(pool, nn.MaxPool2d)):
        raise ConfigError(
            f"model.small_image_stem works with ResNet stems (resnet*, resnext*, wide_resnet*{{ ", timm/resnet*" if cookiecutter.timm == "yes" }}): {name} "
            "has no single convolution followed by a max-pool. Set it to false."
        )
    convolution.stride = (1, 1)
    model.maxpool = nn.Identity()


BUILT_WITH = "backbone_built_with"  # the checkpoint's key of built_with


def _build(name: str, num_classes: int, pretrained: bool) -> nn.Module:
    check_backbone_name(name)
    # Auxiliary heads only add a second output to handle; they are off in every backbone we build.
    has_aux = name in ("googlenet", "inception_v3")
    if not pretrained:
        extra = {"aux_logits": False} if has_aux else {}
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)

    weights = torchvision.models.get_model_weights(name).DEFAULT
    try:
        model = torchvision.models.get_model(name, weights=weights)  # their weights include the aux heads
    except OSError as error:  # URLError, timeouts and refused connections are all OSErrors
        raise MissingError(
            f"Could not download the pretrained {name} weights ({error}). {_fetch_by_hand(weights)}"
        ) from error
    if has_aux:
        model.aux_logits = False
        for aux in ("aux1", "aux2", "AuxLogits"):
            if hasattr(model, aux):
                setattr(model, aux, None)
    path, layer = _last_layer_with_outputs(model, len(weights.meta["categories"]))
    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, num_classes)
    else:  # SqueezeNet's head is a 1x1 convolution
        new = nn.Conv2d(layer.in_channels, num_classes, layer.kernel_size)
    parent, _, attribute = path.rpartition(".")
    setattr(model.get_submodule(parent), attribute, new)
    return model


def _weights_file(weights: torchvision.models.WeightsEnum) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)


def _fetch_by_hand(weights: torchvision.models.WeightsEnum) -> str:
    return (
        f"Download {weights.url} on a machine with internet and put it at {_weights_file(weights)} (TORCH_HOME "
        "moves that folder), or train from scratch with --model.pretrained=false."
    )


def pretrained_weights_missing(name: str) -> str | None:
    """Why a backbone's pretrained weights cannot be had, in the cache or from the network; None if they can."""
{%- if cookiecutter.timm == "yes" %}
    if timm_backbones.is_timm(name):
        return timm_backbones.pretrained_weights_missing(name)
{%- endif %}
    check_backbone_name(name)
    weights = torchvision.models.get_model_weights(name).DEFAULT
    host = urlparse(weights.url).hostname or weights.url
    if _weights_file(weights).exists() or reachable(host):
        return None
    return f"The pretrained {name} weights are not in the cache and {host} cannot be reached. {_fetch_by_hand(weights)}"


def built_with(model: nn.Module) -> dict:
    """What torchvision sets as it builds a backbone with ImageNet weights that no state_dict holds: googlenet's
    and inception_v3's transform_input, an affine map of the input their weights were trained behind. Kept in
    the checkpoint: a model rebuilt from it (without the download) would see other inputs than it trained on."""
    return {"transform_input": model.transform_input} if hasattr(model, "transform_input") else {}


def build_as(model: nn.Module, built: dict) -> None:
    """Set on `model` what built_with kept of the backbone as it trained."""
    for name, value in built.items():
        setattr(model, name, value)


def load_trained_weights(
    model: nn.Module, name: str, checkpoint: str, num_classes: int, class_names: list[str] | None
) -> None:
    """Start a backbone from a checkpoint's, as `pretrained` starts it from ImageNet's: its head too where
    the checkpoint was trained on these classes (or as many, where the names are not known), else a new one."""
    if not Path(checkpoint).exists():
        raise MissingError(f"model.init_weights {checkpoint}: no such file.")
    check_checkpoint(checkpoint, "model.init_weights")
    refuse_sharded(Path(checkpoint))
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    trained = saved.get("hyper_parameters", {})
    if trained.get("backbone") != name:
        raise ConfigError(
            f"model.init_weights {checkpoint} holds a {trained.get('backbone')} backbone, not {name}: set "
            f"model.backbone {trained.get('backbone')}, or leave init_weights out."
        )
    weights = {key.removeprefix("backbone."): value for key, value in saved["state_dict"].items()
               if key.startswith("backbone.")}  # fmt: skip
    build_as(model, saved.get(BUILT_WITH, {}))
    same_classes = trained.get("num_classes") == num_classes and (
        trained.get("class_names") == class_names or None in (trained.get("class_names"), class_names)
    )
    heads = () if same_classes else tuple(f"{head}." for head in head_names(model, num_classes))
    kept = {key: value for key, value in weights.items() if not key.startswith(heads)}
    try:
        missing, unexpected = model.load_state_dict(kept, strict=False)
        misfits = [key for key in missing if not key.startswith(heads)] + unexpected
    except RuntimeError as error:  # a tensor of another shape
        misfits = [str(error).splitlines()[1].strip().rstrip(".")]
    if misfits:  # the model's code changed since it was trained
        raise ConfigError(
            f"model.init_weights {checkpoint} does not fit the {name} this code builds ({misfits[0]}): use the "
            "code it was trained with, or leave init_weights out."
        )


def set_stochastic_depth(model: nn.Module, name: str, probability: float) -> None:
    """Make `probability` the drop probability of the deepest residual block; torchvision's models
    drop shallower blocks less, in proportion to their depth, and that proportion stays."""
    layers = [module for module in model.modules() if isinstance(module, StochasticDepth)]
    if not layers:
        raise ConfigError(
            f"{name} has no stochastic depth: leave model.stochastic_depth unset, or use a backbone that has "
            "it (convnext_*, efficientnet_*, swin_*, maxvit_t)."
        )
    deepest = max(layer.p for layer in layers)
    for index, layer in enumerate(layers):
        # Built with 0, every layer has p 0: then the depth order is the layers' order.
        share = layer.p / deepest if deepest > 0 else (index + 1) / len(layers)
        layer.p = probability * share


def head_names(model: nn.Module, num_classes: int) -> list[str]:
{%- if cookiecutter.timm == "yes" %}
    """The names of the classification head(s): those timm's config names (some models have two),
    else the last layer that outputs `num_classes` values."""
    named = getattr(model, "pretrained_cfg", {}).get("classifier")
    if named:
        return [named] if isinstance(named, str) else list(named)
{%- else %}
    """The name of the classification head: the last layer that outputs `num_classes` values."""
{%- endif %}
    try:
        return [_last_layer_with_outputs(model, num_classes)[0]]
    except ValueError as error:
        raise ConfigError(f"{error}: the backbone's head cannot be told from the rest.") from None


def _last_layer_with_outputs(model: nn.Module, outputs: int) -> tuple[str, nn.Module]:
    for path, layer in reversed(list(model.named_modules())):
        if (isinstance(layer, nn.Linear) and layer.out_features == outputs) or (
            isinstance(layer, nn.Conv2d) and layer.out_channels == outputs
        ):
            return path, layer
    raise ValueError(f"found no {outputs}-way classification layer in {type(model).__name__}")
