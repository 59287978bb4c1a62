"""Backbones from timm's model zoo, named `timm/<model>` or `timm/<model>.<pretrained tag>` (the
`timm` extra: pip install -e ".[timm]"). timm sizes the head, drops blocks and knows the
preprocessing of its weights itself."""

import sys
from urllib.parse import urlparse

from torch import nn

from .errors import ConfigError, MissingError, closest
from .hardware.network import reachable

PREFIX = "timm/"


def is_timm(name: str) -> bool:
    return name.startswith(PREFIX)


def _timm():
    try:
        import timm
    except ImportError:
        raise ConfigError('timm backbones need the timm package: pip install -e ".[timm]"') from None
    return timm


def check_name(name: str) -> None:
    """Fail at once on a model (or pretrained tag) timm does not know, listing the closest it does."""
    timm = _timm()
    model = name.removeprefix(PREFIX)
    known = models_like(timm, model)
    if model not in known:
        close = closest(model, known)
        raise ConfigError(
            f"Unknown timm model {model!r}. Closest: {', '.join(PREFIX + match for match in close)}. "
            f"List them with: python -c 'import timm; print(timm.list_models(pretrained=True))'"
        )


def models_like(timm, model: str) -> list[str]:
    """timm's model names, with their pretrained tags where `model` has one."""
    return timm.list_models(pretrained=True) if "." in model else timm.list_models()


def knows(model: str) -> bool:
    """Whether timm is installed and knows `model`, named without the prefix."""
    try:
        import timm
    except ImportError:
        return False
    return model in models_like(timm, model)


def build(name: str, num_classes: int, pretrained: bool, stochastic_depth: float | None) -> nn.Module:
    timm = _timm()
    check_name(name)
    model = name.removeprefix(PREFIX)
    options = {} if stochastic_depth is None else {"drop_path_rate": stochastic_depth}
    if pretrained:
        _offline_unless_reachable()
    try:
        return timm.create_model(model, pretrained=pretrained, num_classes=num_classes, **options)
    except TypeError as error:
        if "drop_path_rate" not in str(error):
            raise
        raise ConfigError(f"{name} has no stochastic depth: leave model.stochastic_depth unset.") from None
    except OSError as error:  # the Hugging Face Hub out of reach, and the weights not in its cache
        reason = str(error).splitlines()[0]
        raise MissingError(
            f"Could not download the pretrained {name} weights ({reason}). {_fetch_by_hand(model)}"
        ) from error


def _fetch_by_hand(model: str) -> str:
    from huggingface_hub.constants import HF_HUB_CACHE

    return (
        f"On a machine with internet run python -c \"import timm; timm.create_model('{model}', pretrained=True)\" "
        f"and copy its Hugging Face cache into {HF_HUB_CACHE} (HF_HOME moves it), or train from scratch with "
        "--model.pretrained=false."
    )


def pretrained_weights_missing(name: str) -> str | None:
    """Why a timm model's pretrained weights cannot be had, in the Hugging Face cache or from the Hub;
    None if they can (or timm fetches them from elsewhere, which fit tells)."""
    import huggingface_hub.constants
    from huggingface_hub import try_to_load_from_cache

    check_name(name)
    model = name.removeprefix(PREFIX)
    config = _timm().models.get_pretrained_cfg(model)
    repo = getattr(config, "hf_hub_id", None)
    files = ("model.safetensors", "pytorch_model.bin", getattr(config, "hf_hub_filename", None))
    if not repo or any(isinstance(try_to_load_from_cache(repo, file), str) for file in files if file):
        return None
    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"
    if reachable(host):
        return None
    return f"The pretrained {name} weights are not in the cache and {host} cannot be reached. {_fetch_by_hand(model)}"


def _offline_unless_reachable() -> None:
    """Out of reach, the Hub is not asked: the cache answers at once, where the Hub client would
    retry for about 45 s before looking there."""
    import huggingface_hub.constants

    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"  # HF_ENDPOINT: a mirror
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not reachable(host):
        huggingface_hub.constants.HF_HUB_OFFLINE = True
        print(f"{host} cannot be reached: pretrained weights come from the local cache only.", file=sys.stderr)


def weights_preprocessing(name: str) -> dict:
    """The crop ratio, interpolation, mean and std of the weights' own evaluation (timm's config;
    its squash and border crop modes are taken as centre crops)."""
    config = _timm().models.get_pretrained_cfg(name.removeprefix(PREFIX))
    if config.crop_pct > 1:
        raise ConfigError(
            f"{name}'s weights evaluate with crop_pct {config.crop_pct}, a crop larger than the resized image, "
            "which this project does not do: set data.crop_ratio (1.0 keeps the whole image)."
        )
    return {
        "crop_ratio": config.crop_pct,
        "interpolation": config.interpolation if config.interpolation in ("bilinear", "bicubic") else "bilinear",
        "mean": tuple(config.mean),
        "std": tuple(config.std),
    }
