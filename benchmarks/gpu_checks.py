"""What benchmarks/gpu_validation.py runs inside a rendered project's processes, with the project's
src/ and this folder on PYTHONPATH: a callback that records a training run, the model alone on
synthetic batches (the figure published anchors are measured on), a checkpoint's predictions
against its ONNX export and against itself on the CPU, images to train on, and `fit` options parsed.

    python gpu_checks.py model-alone --backbone resnet50 --image-size 224 --batch-size 256 [--device cuda]
    python gpu_checks.py predictions CHECKPOINT ONNX IMAGE_FOLDER [--device cuda]
    python gpu_checks.py images FOLDER [--per-class 100] [--copies 1] [--size 64] [--suffix png|jpg]
    python gpu_checks.py parse '{"run": ["--config=configs/trainer/fsdp1.yaml", ...], ...}'

model-alone, predictions and parse print their figures (parse: each run's refusal, or null) as one JSON line.
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
import torchvision


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RunRecord(L.Callback):
    """At the end of a one-epoch run, write its figures to `path` as JSON: the time per step after
    `warmup` steps and images/s, peak GPU memory, the last training loss, the validation metrics, the
    precision and strategy that ran, and the checkpoints written (a folder for a sharded one)."""

    def __init__(self, path: str, warmup: int = 5) -> None:
        self.path, self.warmup = Path(path), warmup
        self.started = self.elapsed = 0.0
        self.images = self.timed_steps = 0
        self.loss: torch.Tensor | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            synchronize(trainer.strategy.root_device)
            self.started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()
        if batch_idx >= self.warmup:
            self.images += len(batch[1])
            self.timed_steps += 1
        if batch_idx == trainer.num_training_batches - 1 and self.started:
            synchronize(trainer.strategy.root_device)
            self.elapsed = time.perf_counter() - self.started

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        device = trainer.strategy.root_device
        record = {
            "steps": trainer.global_step,
            "ms/step": 1000 * self.elapsed / self.timed_steps if self.elapsed else None,
            "images/s": self.images / self.elapsed if self.elapsed else None,
            "peak GiB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "loss": float(self.loss) if self.loss is not None else None,
            "precision": trainer.precision,
            "strategy": type(trainer.strategy).__name__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        }
        record |= {name: float(value) for name, value in trainer.callback_metrics.items() if name.startswith("val/")}
        for callback in trainer.checkpoint_callbacks:
            saved = Path(callback.best_model_path or callback.last_model_path or "")
            kind = "best" if callback.monitor else "last"
            record[f"{kind} checkpoint"] = (
                ("folder" if saved.is_dir() else "file") if saved.name and saved.exists() else "missing"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record))


def model_alone(
    backbone: str, image_size: int, batch_size: int, steps: int, warmup: int, device: torch.device, bf16: bool
) -> dict:
    """Training images/s of a torchvision model on one random batch kept on the device: AdamW,
    channels_last, bf16 autocast, as timm's and NVIDIA's published figures are measured."""
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.get_model(backbone, weights=None, num_classes=1000).to(device)
    model = model.to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(batch_size, 3, image_size, image_size, device=device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch_size,), device=device)
    started = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    elapsed = time.perf_counter() - started
    return {"images/s": batch_size * steps / elapsed, "ms/step": 1000 * elapsed / steps}


def predictions(checkpoint: Path, onnx: Path, folder: Path, device: str, limit: int = 256) -> dict:
    """The checkpoint's probabilities on `device` against its ONNX export (on `device` where
    onnxruntime has CUDA) and against the checkpoint on the CPU, on up to `limit` images of `folder`
    spread over its classes."""
    import onnxruntime
    from image_classifier.commands.predictor import Predictor

    paths = sorted(path for path in folder.rglob("*") if path.suffix.lower() in {".png", ".jpg", ".jpeg"})
    paths = paths[:: max(1, len(paths) // limit)][:limit]
    on_cpu = Predictor(checkpoint).load("cpu")
    images = torch.stack([on_cpu.prepare(str(path)) for path in paths])
    onnx_device = device if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu"
    expected = Predictor(checkpoint).load(device)(images)
    exported = Predictor(onnx).load(onnx_device)(images)
    cpu = on_cpu(images)
    return {
        "images": len(paths),
        f"max diff onnx({onnx_device})-pytorch({device})": (exported - expected).abs().max().item(),
        "top-1 agree onnx": (exported.argmax(1) == expected.argmax(1)).float().mean().item(),
        f"max diff pytorch({device})-pytorch(cpu)": (expected - cpu).abs().max().item(),
        f"top-1 agree {device}/cpu": (expected.argmax(1) == cpu.argmax(1)).float().mean().item(),
    }


def draw_images(folder: Path, per_class: int, copies: int, size: int, suffix: str) -> None:
    """The built-in shapes drawn at `size` px into train/ and val/ class folders, as PNG or as JPEG of
    quality 90 (as photo datasets are kept), each training image linked `copies` times: enough
    images for long runs, for the cost of drawing a few."""
    from image_classifier.datasets.shapes import draw_shapes_dataset
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        drawn = draw_shapes_dataset(Path(tmp) / "drawn", {"train": per_class, "val": max(2, per_class // 20)}, size)
        staging = Path(tmp) / "staging"
        for image in drawn.rglob("*.png"):
            target = staging / image.relative_to(drawn).with_suffix(f".{suffix}")
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.open(image).convert("RGB").save(target, quality=90)
            for copy in range(1, copies if target.parts[-3] == "train" else 1):
                os.link(target, target.with_name(f"{target.stem}-{copy}{target.suffix}"))
        shutil.move(staging, folder)


def parse(runs: dict[str, list[str]]) -> dict[str, str | None]:
    """Each run's `fit` options parsed as `fit` parses them: None, or the parser's one-line refusal."""
    from image_classifier.cli import resolved_config
    from image_classifier.errors import ConfigError

    refusals = {}
    for name, args in runs.items():
        try:
            resolved_config(args)
            refusals[name] = None
        except ConfigError as error:
            refusals[name] = str(error)
    return refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    alone = commands.add_parser("model-alone")
    alone.add_argument("--backbone", default="resnet50")
    alone.add_argument("--image-size", type=int, default=224)
    alone.add_argument("--batch-size", type=int, default=256)
    alone.add_argument("--steps", type=int, default=50)
    alone.add_argument("--warmup", type=int, default=10)
    alone.add_argument("--device", default="cuda")
    alone.add_argument("--precision", choices=["bf16-mixed", "32-true"], default="bf16-mixed")
    compared = commands.add_parser("predictions")
    compared.add_argument("checkpoint", type=Path)
    compared.add_argument("onnx", type=Path)
    compared.add_argument("folder", type=Path)
    compared.add_argument("--device", default="cuda")
    parsed = commands.add_parser("parse")
    parsed.add_argument("runs", type=json.loads, help='{"name": ["--option=value", ...], ...}')
    drawn = commands.add_parser("images")
    drawn.add_argument("folder", type=Path)
    drawn.add_argument("--per-class", type=int, default=100)
    drawn.add_argument("--copies", type=int, default=1)
    drawn.add_argument("--size", type=int, default=64)
    drawn.add_argument("--suffix", choices=["png", "jpg"], default="png")
    options = parser.parse_args()
    if options.command == "images":
        draw_images(options.folder, options.per_class, options.copies, options.size, options.suffix)
        return
    if options.command == "parse":
        print(json.dumps(parse(options.runs)))
        return
    if options.command == "model-alone":
        bf16 = options.precision == "bf16-mixed"
        figures = model_alone(options.backbone, options.image_size, options.batch_size, options.steps,
                              options.warmup, torch.device(options.device), bf16)  # fmt: skip
    else:
        figures = predictions(options.checkpoint, options.onnx, options.folder, options.device)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
