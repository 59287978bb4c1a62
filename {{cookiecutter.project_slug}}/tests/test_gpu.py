"""On an NVIDIA GPU (`pytest -m gpu`; skipped without CUDA): every trainer preset trains on one GPU,
both mixed precisions run, sharded checkpoints resume and consolidate, and batches reach the GPU
from pinned memory without blocking the host."""

import json
import sys
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import command_env, run_group
from test_distributed import CSV_LOGGER, TIMEOUT, data, fit, record, seen
from test_exact_resume import plain_images, seen_images
from test_exact_resume import record as record_images

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ONE_EPOCH = ["--trainer.devices=1", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
             "--trainer.limit_val_batches=1", *CSV_LOGGER]  # fmt: skip
STRATEGIES = {
    "gpu": "SingleDeviceStrategy",
    "auto": "SingleDeviceStrategy",
    "ddp": "DDPStrategy",  # one process: the same code path as eight, with a process group of one
    "fsdp": "FSDP2Strategy",
    "fsdp1": "FSDPStrategy",
    "deepspeed_stage2": "DeepSpeedStrategy",
    "deepspeed_stage3_offload": "DeepSpeedStrategy",
}
# The sharded engines write a checkpoint as a folder of shards.
SHARDED = {"fsdp", "fsdp1", "deepspeed_stage2", "deepspeed_stage3_offload"}


def needs_what_it_runs(preset: str) -> None:
    if preset.startswith("deepspeed"):
        pytest.importorskip("deepspeed")


def last_checkpoint(project: Path) -> Path:
    (last,) = (project / "runs" / "dist").glob("*/checkpoints/last.ckpt")
    return last


@pytest.mark.parametrize(
    ("preset", "precision"),
    [*((preset, None) for preset in STRATEGIES), ("gpu", "bf16-mixed"), ("gpu", "16-mixed"), ("gpu", "32-true")],
)
def test_preset_trains_on_the_gpu_and_checkpoints(in_project_copy, tiny_shapes, preset, precision):
    needs_what_it_runs(preset)
    ranks = in_project_copy / "ranks"
    options = [f"--trainer.precision={precision}"] if precision else []
    fit(in_project_copy, f"--config=configs/trainer/{preset}.yaml", *ONE_EPOCH, *options, *data(tiny_shapes),
        record(ranks))  # fmt: skip
    (run,) = seen(ranks)
    assert run["device"].startswith("cuda") and run["world_size"] == 1
    assert run["strategy"] == STRATEGIES[preset]
    if precision:
        assert run["precision"] == precision
    if run["precision"] == "16-mixed":  # float16 needs its loss scaled, or small gradients vanish
        assert run["loss_scaler"]
    assert all(torch.isfinite(torch.tensor(value)) for value in run["val"].values()), run["val"]
    assert last_checkpoint(in_project_copy).is_dir() == (preset in SHARDED)


@pytest.mark.parametrize("preset", ["fsdp", "deepspeed_stage2"])
def test_a_sharded_checkpoint_resumes_and_consolidates_into_the_trained_weights(in_project_copy, tiny_shapes, preset):
    needs_what_it_runs(preset)
    # float32 (with TF32, as configured), so the reloaded model's logits can be held close to the run's.
    common = [f"--config=configs/trainer/{preset}.yaml", *ONE_EPOCH, "--trainer.precision=32-true", *data(tiny_shapes)]
    fit(in_project_copy, *common)
    ranks = in_project_copy / "ranks"
    outputs = {"class_path": "helper_callbacks.RecordOutputs", "init_args": {"folder": str(ranks)}}
    fit(in_project_copy, *common, "--trainer.max_epochs=2", "--ckpt_path=last", record(ranks),
        f"--trainer.callbacks+={json.dumps(outputs)}")  # fmt: skip
    (resumed,) = seen(ranks)
    assert resumed["start_step"] == 2, "the second run went on from the first one's last step"

    single_file = in_project_copy / "model.ckpt"
    fit(in_project_copy, str(last_checkpoint(in_project_copy)), str(single_file), command="consolidate")
    assert torch.load(single_file, map_location="cpu", weights_only=False)["global_step"] == 4
    model = ImageClassifier.load_from_checkpoint(single_file, map_location="cuda").eval()
    # The run's last validation (one batch) ran on the weights the consolidated file holds.
    validated = torch.load(ranks / "outputs0.pt")["val"]
    datamodule = ImageDataModule(tiny_shapes, num_workers=0, batch_size=len(validated["labels"][0]))
    datamodule.setup("validate")
    images, labels = next(iter(datamodule.val_dataloader()))
    images, labels = datamodule.on_after_batch_transfer((images.cuda(), labels.cuda()), 0)
    assert torch.equal(labels.cpu(), validated["labels"][0])
    with torch.no_grad():
        logits = model(images).double().cpu()
        untrained = ImageClassifier(**model.hparams).cuda().eval()(images).double().cpu()
    assert torch.allclose(logits, validated["logits"][0], atol=1e-2)
    assert not torch.allclose(untrained, validated["logits"][0], atol=1e-2), "the check could not tell"


@pytest.mark.parametrize("preset", ["fsdp", "deepspeed_stage2"])
def test_a_sharded_run_resumed_mid_epoch_trains_on_the_images_it_had_not_seen(in_project_copy, tiny_shapes, preset):
    # FSDP and DeepSpeed read a checkpoint after their setup, by when the learning-rate schedule has
    # made the training loader: the data module must place that loader in the epoch (test_distributed
    # checks FSDP2 in CPU processes; DeepSpeed runs on GPUs only). 18 steps of 4 images, stopped at 10.
    needs_what_it_runs(preset)
    common = [f"--config=configs/trainer/{preset}.yaml", "--trainer.devices=1", "--trainer.max_epochs=1",
              "--trainer.limit_val_batches=1", "--trainer.precision=32-true", *CSV_LOGGER, *data(tiny_shapes),
              *plain_images()]  # fmt: skip
    trained = {name: [*common, record_images(in_project_copy / name)] for name in ("whole", "parts")}
    fit(in_project_copy, *trained["whole"])
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 10}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *trained["parts"],
               f"--trainer.callbacks+={sigterm}"]  # fmt: skip
    stopped = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    assert stopped.returncode == 143, stopped.stderr[-4000:]
    fit(in_project_copy, *trained["parts"], "--ckpt_path=auto")
    whole, parts = (seen_images(in_project_copy / name / "trained0.jsonl") for name in ("whole", "parts"))
    assert len(whole) == 72 and parts == whole, "the resumed epoch trained again on images it had seen"


def test_batches_reach_the_gpu_from_pinned_memory_without_blocking(tiny_shapes):
    trainer = L.Trainer(accelerator="gpu", devices=1, logger=False, enable_checkpointing=False)
    datamodule = ImageDataModule(tiny_shapes, num_workers=2, batch_size=8)
    datamodule.trainer = trainer
    datamodule.setup("fit")
    images, labels = next(iter(datamodule.train_dataloader()))
    # uint8 in page-locked memory: a quarter of float32's bytes, copied by DMA while the host goes on.
    assert images.dtype == torch.uint8 and images.is_pinned() and labels.is_pinned()

    copies = []
    original = torch.Tensor.to

    def watched(tensor, *args, **kwargs):
        copies.append((tensor.is_pinned(), kwargs.get("non_blocking", False)))
        return original(tensor, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "to", watched):
        on_gpu = trainer.strategy.batch_to_device((images, labels))
    assert copies == [(True, True), (True, True)], "each tensor copied from pinned memory without blocking"
    torch.cuda.synchronize()
    assert torch.equal(on_gpu[0].cpu(), images) and torch.equal(on_gpu[1].cpu(), labels)
    normalized, _ = datamodule.on_after_batch_transfer(on_gpu, 0)
    assert normalized.is_cuda and normalized.dtype == torch.float32
