"""Any torchvision classification model by name, with its head sized for our classes."""

import difflib
import os
from pathlib import Path

import torch
import torchvision
from torch import nn


def classification_models() -> list[str]:
    return torchvision.models.list_models(module=torchvision.models)


def check_backbone_name(name: str) -> None:
    """Fail at once on a name torchvision does not know, listing the closest ones it does."""
    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5) or known[:5]
        raise ValueError(
            f"Unknown backbone {name!r}. Closest torchvision classification models: {', '.join(close)}. "
            "List them all with: python -c 'import torchvision.models as m; print(m.list_models(module=m))'"
        )


def build_backbone(name: str, num_classes: int, pretrained: bool) -> nn.Module:
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
        target = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
        raise RuntimeError(
            f"Could not download the pretrained {name} weights ({error}). Download {weights.url} on a "
            f"machine with internet and put it at {target} (TORCH_HOME moves that folder), "
            "or train from scratch with --model.pretrained=false."
        ) from error
    if has_aux:
        model.aux_logits = False
        for aux in ("aux1", "aux2", "AuxLogits"):
            if hasattr(model, aux):
                setattr(model, aux, None)
    _replace_head(model, len(weights.meta["categories"]), num_classes)
    return model


def _replace_head(model: nn.Module, pretrained_classes: int, num_classes: int) -> None:
    """Swap the last layer that outputs `pretrained_classes` for a fresh one with `num_classes` outputs."""
    for path, layer in reversed(list(model.named_modules())):
        if isinstance(layer, nn.Linear) and layer.out_features == pretrained_classes:
            new = nn.Linear(layer.in_features, num_classes)
        elif isinstance(layer, nn.Conv2d) and layer.out_channels == pretrained_classes:  # SqueezeNet
            new = nn.Conv2d(layer.in_channels, num_classes, layer.kernel_size)
        else:
            continue
        parent, _, attribute = path.rpartition(".")
        setattr(model.get_submodule(parent), attribute, new)
        return
    raise ValueError(f"found no {pretrained_classes}-way classification layer to replace in {type(model).__name__}")
