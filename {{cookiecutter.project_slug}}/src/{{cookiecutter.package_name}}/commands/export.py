"""`python -m {{ cookiecutter.package_name }} export CHECKPOINT --format onnx|pt2`: a model to serve without this code.

The exported model takes a batch of uint8 RGB images, N x 3 x S x S (S: the training image size,
printed), resized and cropped as its metadata says, and returns class probabilities; scaling and
normalisation are inside. `pt2` is a torch.export
program (torch.export.load); `onnx` needs `pip install onnx onnxscript` (the `export` extra).
Both are checked against the PyTorch model on real images, and the largest difference printed;
ONNX through onnxruntime when it is installed. An ONNX file is one file holding its weights (up to
ONNX's 2 GB), and its metadata names the classes and the preprocessing.
"""

import json
from importlib.util import find_spec
from pathlib import Path

import torch

from ..data import checkpoint_preprocessing
from ..datasets.images import labelled_image
from ..errors import PACKAGE, CommandParser, ConfigError, DataError, MissingError, check_output_file
from ..model import ImageClassifier, load_trained
from ..training.resume import check_checkpoint, refuse_sharded, saved_checkpoint
from ..transforms import Preprocessing
from .classify import image_files
from .predictor import ONNX_PREPROCESSING_KEY, ServedClassifier

# Exported and PyTorch probabilities may differ by float rounding, never by more than this.
TOLERANCE = 1e-4
# A protobuf file holds at most 2 GB: larger weights go to a .data file beside the .onnx.
ONNX_SINGLE_FILE_BYTES = 1_800_000_000
FORMATS = ["onnx", "pt2"]


def sample_images(sources: list[Path], preprocessing: Preprocessing, count: int = 8) -> torch.Tensor:
    """Up to `count` real images spread over the sources (a data folder's classes, not its first class's
    first images), resized and cropped as for evaluation, as one uint8 batch; unreadable files are
    skipped with a warning, as in training."""
    transform = preprocessing.eval_transform()
    images = []
    files = image_files(sources)  # at least one: it refuses a folder without images
    for path in dict.fromkeys([*files[:: max(1, len(files) // count)], *files]):
        sample = labelled_image(str(path), 0, str(path), transform, skip_unreadable=True)
        if sample is not None:
            images.append(sample[0])
        if len(images) == count:
            break
    if not images:
        raise DataError(f"None of {', '.join(map(str, sources))} is a readable image: pass --images with some.")
    return torch.stack(images)


def export_metadata(model: ImageClassifier, preprocessing: Preprocessing) -> dict[str, str]:
    """What a server needs besides the graph: the classes, and the preprocessing of its input (ONNX's
    metadata, a .pt2's extra files)."""
    side = preprocessing.image_size
    return {
        "class_names": json.dumps(model.label_names()),
        "image_size": str(side),
        "input": f"uint8 RGB images, N x 3 x {side} x {side}; scaling and normalisation are inside the model",
        "preprocessing": preprocessing.describe(),
        ONNX_PREPROCESSING_KEY: json.dumps(preprocessing.as_dict()),
        "normalisation": json.dumps({"mean": list(preprocessing.mean), "std": list(preprocessing.std)}),
        "output": "class probabilities, in the order of class_names",
    }


def export(served: ServedClassifier, images: torch.Tensor, form: str, output: Path, metadata: dict) -> torch.Tensor:
    """Write the exported model to `output` and return its probabilities for `images`."""
    batch = torch.export.Dim("batch", min=1)
    # Traced on one image, the batch would be fixed at 1 (torch.export specialises sizes 0 and 1).
    example = images if len(images) > 1 else images.repeat(2, 1, 1, 1)
    if form == "pt2":
        program = torch.export.export(served, (example,), dynamic_shapes={"images": {0: batch}})
        torch.export.save(program, output, extra_files=metadata)
        return torch.export.load(output).module()(images)
    program = torch.onnx.export(
        served, (example,), dynamo=True, input_names=["images"], output_names=["probabilities"],
        dynamic_shapes={"images": {0: batch}},
    )  # fmt: skip
    program.model.metadata_props.update(metadata)
    size = sum(t.numel() * t.element_size() for t in [*served.parameters(), *served.buffers()])
    program.save(str(output), external_data=size > ONNX_SINGLE_FILE_BYTES)
    if size > ONNX_SINGLE_FILE_BYTES:
        print(f"The weights ({size / 1e9:.1f} GB) are in {output}.data beside it: ONNX files hold at most 2 GB.")
    if find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a single-file checkpoint")
    parser.add_argument("--format", choices=FORMATS, help="default: --output's suffix, else onnx")
    parser.add_argument("--output", type=Path, help="default: the checkpoint's name with .onnx or .pt2")
    parser.add_argument("--images", type=Path, nargs="+", help="images to check the export on (default: the data)")
    options = parser.parse_args(args)
    suffix = options.output.suffix.lower().removeprefix(".") if options.output else None
    form = options.format or (suffix if suffix in FORMATS else "onnx")
    if form == "onnx" and (find_spec("onnx") is None or find_spec("onnxscript") is None):
        raise MissingError('ONNX export needs the onnx and onnxscript packages: pip install -e ".[export]"')
    check_checkpoint(str(options.checkpoint), "CHECKPOINT")  # a folder passes only if it holds shards
    if not options.checkpoint.exists():  # one of fit's words (last, best), which name no file here
        raise MissingError(f"CHECKPOINT {options.checkpoint}: no such file; export takes a checkpoint's path.")
    refuse_sharded(options.checkpoint)
    output = options.output or options.checkpoint.with_suffix(f".{form}")
    check_output_file(output, "--output" if options.output else "The default --output", "file")
    if output.suffix.lower() != f".{form}":  # the Predictor tells an ONNX file by its suffix
        chooses = "" if options.format else " (its suffix, .onnx or .pt2, chooses the format)"
        named = output.with_suffix(f".{form}")
        raise ConfigError(f"--output {output} does not end in .{form}: name it {named}{chooses}.")
    if output.exists() and output.resolve() == options.checkpoint.resolve():
        raise ConfigError(f"--output {output} is the checkpoint to export: name another file.")

    model = load_trained(options.checkpoint, "cpu").eval()
    saved = saved_checkpoint(options.checkpoint)
    preprocessing = checkpoint_preprocessing(saved)
    sources = options.images or [Path(saved.get("datamodule_hyper_parameters", {}).get("data_dir", "data"))]
    side = preprocessing.image_size
    try:
        images = sample_images(sources, preprocessing)
    except FileNotFoundError as error:
        fix = "point --images at image files or folders" if options.images else "pass --images"
        raise MissingError(f"Nothing to check the export on ({error}): {fix}.") from error
    served = ServedClassifier(model, preprocessing).eval()
    output.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        expected = served(images)
        exported = export(served, images, form, output, export_metadata(model, preprocessing))
    print(f"Wrote {output}: uint8 images N x 3 x {side} x {side} in, {expected.shape[1]} class probabilities out.")
    if exported is None:
        print("Not run: onnxruntime is not installed (pip install onnxruntime), so no comparison was made.")
        return 0
    difference = (exported - expected).abs().max().item()
    print(f"Largest difference from PyTorch on {len(images)} real image{'s' * (len(images) > 1)}: {difference:.2e}")
    if difference > TOLERANCE:
        print(f"That exceeds {TOLERANCE:g}: do not serve this export.")
        return 1
    return 0
