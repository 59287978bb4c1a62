"""A trained model ready to predict: a checkpoint, or its ONNX export, with the preprocessing it was
trained with. `classify`{% if cookiecutter.serving == "yes" %} and `serve` both predict through a Predictor, so a served answer is the one
`classify` writes for the same image{% else %} predicts through a Predictor; an app that serves the model can too{% endif %}."""

import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..data import checkpoint_preprocessing
from ..datasets.images import read_rgb, rgb_from_pil
from ..errors import ConfigError, DataError, MissingError
from ..model import ImageClassifier, load_trained
from ..training.resume import refuse_sharded, saved_checkpoint
from ..transforms import Preprocessing

# The ONNX metadata key of the preprocessing settings, as Preprocessing.as_dict gives them.
ONNX_PREPROCESSING_KEY = "preprocessing_settings"


class ServedClassifier(nn.Module):
    """uint8 images in, class probabilities out: what a server or an app calls, and what is exported."""

    def __init__(self, model: ImageClassifier, preprocessing: Preprocessing) -> None:
        super().__init__()
        self.model = model
        self.preprocessing = preprocessing

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.preprocessing.normalize(images)).softmax(-1)


def check_device(name: str) -> None:
    """Refuse a device this machine lacks, in one line, before a model is read onto it."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"--device {name}: {error}") from None
    gpus = torch.cuda.device_count()  # counted without starting CUDA, which forked servers must not inherit
    if device.type == "cuda" and (device.index or 0) >= gpus:
        raise ConfigError(f"--device {name}: this machine has {gpus} CUDA GPU(s). Use --device cpu.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name}: this machine has no Apple GPU (MPS). Use --device cpu.")


def is_onnx(model: Path) -> bool:
    """Whether `model` is an ONNX export (`export` names it so), else a checkpoint."""
    return model.suffix.lower() == ".onnx"


def onnx_session(model: Path, device: str = "cpu"):
    if find_spec("onnxruntime") is None:
        raise ConfigError(f'{model} needs onnxruntime to run: pip install -e ".[export]"')
    import onnxruntime

    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise ConfigError("This onnxruntime cannot use CUDA: pip install onnxruntime-gpu, or run on the CPU.")
        index = int(device.partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    try:
        return onnxruntime.InferenceSession(str(model), providers=providers)
    except Exception as error:  # onnxruntime's own error classes, one per kind of damage
        raise DataError(f"{model} is not an ONNX model onnxruntime can run ({str(error).splitlines()[0]}).") from None


class Predictor:
    """Image files or their bytes in, class probabilities out. Built without the weights, which are
    cheap to describe and costly to hold: `load` reads them, where the predicting happens."""

    def __init__(self, model: str | Path) -> None:
        model = Path(model)
        refuse_sharded(model)
        if not model.is_file():
            raise MissingError(f"{model} is not a file: pass a checkpoint (.ckpt) or an ONNX export (.onnx).")
        self.model = model
        self.is_onnx = is_onnx(model)
        if self.is_onnx:
            # The session is only read here: onnxruntime's threads must not be alive when a process forks.
            metadata = onnx_session(model).get_modelmeta().custom_metadata_map
            if ONNX_PREPROCESSING_KEY not in metadata:
                raise ConfigError(f"{model} does not record its preprocessing: export it again with `export`.")
            self.preprocessing = Preprocessing.from_dict(json.loads(metadata[ONNX_PREPROCESSING_KEY]))
            self.class_names = json.loads(metadata["class_names"])
        else:
            saved = saved_checkpoint(model)
            # Prepared as in training, whatever the configuration says now: the checkpoint records how.
            self.preprocessing = checkpoint_preprocessing(saved)
            hyper_parameters = saved.get("hyper_parameters", {})
            self.class_names = ImageClassifier.names_of(hyper_parameters)
        self.transform = self.preprocessing.eval_transform()
        self._run = None

    def load(self, device: str = "cpu") -> "Predictor":
        if self.is_onnx:
            session = onnx_session(self.model, device)
            self._run = lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])
        else:
            model = load_trained(self.model, device)
            served = ServedClassifier(model.eval(), self.preprocessing)
            self._run = lambda images: served(images.to(device)).float().cpu()
        return self

    def prepare(self, image: str | Path | bytes | Image.Image | torch.Tensor) -> torch.Tensor:
        """An image as validation prepares it: uint8, 3 x S x S. From a file, its bytes, a PIL image, or
        a tensor of 3 x H x W (channels first, RGB, uint8 or uint16), as `read_rgb` gives."""
        if isinstance(image, Image.Image):
            image = rgb_from_pil(image)
        elif not isinstance(image, torch.Tensor):
            image = read_rgb(str(image) if isinstance(image, Path) else image)
        if image.dtype not in (torch.uint8, torch.uint16) or image.ndim != 3 or image.shape[0] != 3:
            raise ConfigError(
                f"Predictor.prepare takes a uint8 tensor of 3 x H x W, as read_rgb gives, not {image.dtype} of "
                f"{' x '.join(map(str, image.shape))}: give the file, or a PIL image, instead."
            )
        return self.transform(image)

    def __call__(self, images: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Class probabilities (float32, on the CPU) of prepared images, N x 3 x S x S."""
        if self._run is None:
            raise RuntimeError("Predictor.load() reads the weights before the first prediction.")
        with torch.inference_mode():
            return self._run(torch.as_tensor(images))
