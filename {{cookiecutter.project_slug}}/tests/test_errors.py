"""Every mistake in the options, the data or the files ends in one line, `error: <problem and fix>`."""

import errno
import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from conftest import ON_CPU, OTHER_BACKBONE, on_data, refusal, run_cli

from {{ cookiecutter.package_name }} import cli
from {{ cookiecutter.package_name }}.cli import condensed, main, refusal_inside
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import (
    TRACEBACK_VARIABLE,
    ConfigError,
    DataError,
    MissingError,
    other_process_gone,
    refused_by_file_system,
)
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.resume import check_checkpoint

MODEL_CHECKPIONT = "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpiont"  # a misspelt class
EARLY_STOPPING = "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping"
EMA = "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.ModelEMA"
PREDICTIONS = "--trainer.callbacks+={{ cookiecutter.package_name }}.training.predictions.PredictionsCSV"
PATIENSE = "error: --trainer.callbacks.patiense: EarlyStopping has no option 'patiense'"


def fit(data_dir, *args: str) -> list[str]:
    data = [f"--data.data_dir={data_dir}", "--data.synthetic=false", "--data.num_workers=0", "--data.batch_size=4"]
    return ["fit", *ON_CPU, "--trainer.fast_dev_run=true", *data, *args]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--data.image_size=-5"], "data.image_size must be 1 or more, got -5"),
        (["--data.batch_size=0"], "data.batch_size must be 1 or more, got 0"),
        (["--data.val_fraction=1.5"], "data.val_fraction must be above 0 and below 1"),
        (["--model.warmup_fraction=1"], "model.warmup_fraction must be 0 or more and below 1"),
        (["--model.backbone=resnet81"], "Unknown backbone 'resnet81'. Closest torchvision classification models: res"),
        # The data module looks the pretrained weights' preprocessing up first.
        (["--model.backbone=resnt18", "--model.pretrained=true"], "Unknown backbone 'resnt18'. Closest torchvision"),
        # By likeness, however far the name is from every model (not the first five alphabetically).
        (["--model.backbone=ResNet-50-ImageNet"], "Closest torchvision classification models: resnet50, "),
        (["--model.backbone=vit_b_16", "--data.image_size=64"], "vit_b_16 cannot take 64-pixel images"),
        (["--model.backbone=inception_v3", "--data.image_size=64"], "use --data.image_size 75."),
        (["--ckpt_path=last"], "--ckpt_path last: there is no */checkpoints/last.ckpt"),
        (["--data.data_dir=data/shpes", "--data.synthetic=true"], "Data folder data/shpes does not exist: fix"),
        (
            ["--ckpt_path=configs/default.yaml"],
            "configs/default.yaml is not a Lightning checkpoint, or is damaged: point --ckpt_path "
            "at a .ckpt file that training wrote (runs/<project>/<run>/checkpoints/).",
        ),
        (["--data.batch_size=many"], "error: --data.batch_size: many is not a whole number"),
        (["--trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches must be 1 or more, got 0"),
        (["--seed_everything=-1"], "seed_everything must be a whole number from 0 to 4294967295, or true or false"),
        # Lightning's would replace the model's optimizer setup whole, or be ignored.
        (["--optimizer=SGD"], "error: --optimizer and --lr_scheduler are not used: the model makes its own"),
        (["--lr_scheduler=StepLR", "--lr_scheduler.step_size=1"], "error: --optimizer and --lr_scheduler are not"),
        (["--lr_scheduler", "StepLR"], "error: --optimizer and --lr_scheduler are not"),  # not "step_size required"
        (["--optimizer.lr=0.1"], "error: --optimizer and --lr_scheduler are not"),
        # Lightning's own refusals, in one line.
        (["--trainer.max_epochs=-5"], "error: `max_epochs` must be a non-negative integer or -1. You passed in -5."),
        (["--trainer.strategy=nonsense"], "error: You selected an invalid strategy name: `strategy='nonsense'`"),
        (["--trainer.accelerator=hpu"], "error: You selected an invalid accelerator name: `accelerator='hpu'`"),
        (["--trainer.num_nodes=0"], "error: `num_nodes` must be a positive integer, but got 0."),
        (["--trainer.accelerator=tpu"], "error: Requirement 'torch_xla"),  # TPUs train through torch_xla
        (["--model.nonsense=1"], "unrecognized arguments: --model.nonsense=1. Did you mean"),
        (["--model.backbon=resnet18"], "unrecognized arguments: --model.backbon=resnet18. Did you mean model.backbone"),
        # A union's subtypes, said as the values it takes or the class likely meant, not type by type.
        (["--trainer.precision=17"], "error: --trainer.precision: 17 is none of 64, 32, 16, transformer-engine, "),
        (["--trainer.logger=TensorBoardLoger"], "error: --trainer.logger: no class 'TensorBoardLoger'. Did you mean "),
        (["--trainer.callbacks+=EarlyStoping"], "error: --trainer.callbacks: no class 'EarlyStoping'. Did you mean "),
        (["--data.num_workers=x"], "error: --data.num_workers: x is neither a whole number nor auto"),
        (["--data.augment=trivial"], "error: --data.augment: trivial is none of none, basic, "),
        (["--trainer.max_epochs=x"], "error: --trainer.max_epochs: x is neither a whole number nor null"),
        (["--trainer.gradient_clip_val=x"], "error: --trainer.gradient_clip_val: x is neither a number nor null"),
        (["--trainer.precision=a"], "error: --trainer.precision: a is none of 64, 32, 16, transformer-engine, "),
        # A logger's or a callback's option: the reason its class gives, not those of bool and None.
        (["--trainer.logger.save_dri=runs"], "Logger has no option 'save_dri'. Did you mean save_dir?"),
        ([EARLY_STOPPING, "--trainer.callbacks.patiense=3"], f"{PATIENSE}. Did you mean patience?"),
        ([EARLY_STOPPING, "--trainer.callbacks.patience=many"], "callbacks.patience: many is not a whole number"),
        # What a callback's own __init__ refuses (a typo in a config file's mode:), named by its class.
        (
            [EARLY_STOPPING, "--trainer.callbacks.monitor=val/acc", "--trainer.callbacks.mode=maxx"],
            "error: EarlyStopping: `mode` can be min, max, got maxx",
        ),
        ([EMA, "--trainer.callbacks.decay=1.5"], "error: ModelEMA decay must be above 0 and below 1, got 1.5"),
        # With other settings too (a recipe's and one added): Lightning takes one callback of each kind.
        ([EMA, EMA, "--trainer.callbacks.decay=0.99"], "error: --trainer.callbacks lists ModelEMA twice (each config "),
        (["--trainer.gradient_clip_val=-1"], "error: trainer.gradient_clip_val must be above 0, got -1 (null clips"),
        # An option before a config file that sets it too: replaced by the file's value, which trained 60 epochs.
        (
            ["--trainer.max_epochs", "1", "--config", "configs/recipe/scratch.yaml"],
            "error: --trainer.max_epochs comes before --config configs/recipe/scratch.yaml, which sets it too and so "
            "replaces it: put --config first, then the options that change it.",
        ),
        ([PREDICTIONS, "--trainer.callbacks.top_k=0"], "error: PredictionsCSV top_k must be 1 or more, got 0"),
        # The config's EarlyStopping is not the last callback: its options are the config's to set.
        (["--trainer.callbacks.patience=3"], "no option 'patience': --trainer.callbacks.<option> sets the last one"),
        (["--trainer.logger=lightning.pytorch.loggers.Nope"], "--trainer.logger: lightning.pytorch.loggers.Nope: "),
        ([MODEL_CHECKPIONT], "ModelCheckpiont'. Did you mean lightning.pytorch.callbacks.ModelCheckpoint?"),
        (["--trainer.callbacks=[]", "--trainer.callbacks.patience=3"], "no callback is listed to take it; add one"),
    ],
)
def test_bad_options_end_in_one_line(monkeypatch, capsys, in_project_copy, tiny_shapes, options, expected):
    assert expected in refusal(monkeypatch, capsys, *fit(tiny_shapes, *options))


def test_a_misspelt_option_is_not_taken_for_one_that_a_link_sets(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # model.batch_size is data.batch_size's, linked: given, it is refused.
    line = refusal(monkeypatch, capsys, *fit(tiny_shapes, "--data.batch_sise=3"))
    assert "Did you mean data.batch_size" in line and "model.batch_size" not in line


def test_a_wrong_value_in_a_config_file_names_the_file_not_an_option_never_given(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # It was said as `--data.batch_size: eight ...`, an option the command line did not give.
    (in_project_copy / "mine.yaml").write_text(f"data:\n  data_dir: {tiny_shapes}\n  batch_size: eight\n")
    command = ["fit", "--config=mine.yaml", *ON_CPU, "--trainer.fast_dev_run=true"]
    message = refusal(monkeypatch, capsys, *command)
    assert message == "error: mine.yaml: data.batch_size: eight is not a whole number", message
    (in_project_copy / "mine.yaml").write_text(f"data:\n  data_dir: {tiny_shapes}\n  batch_size: 8\n")
    message = refusal(monkeypatch, capsys, *command, "--data.batch_size=many")
    assert message == "error: --data.batch_size: many is not a whole number", message


def test_the_file_named_for_a_setting_is_the_last_given_that_sets_it_however_given(monkeypatch, tmp_path):
    for name in ("one.yaml", "two.yaml"):
        (tmp_path / name).write_text("model:\n  lr: 0.1\n")
    monkeypatch.setattr(cli, "STARTED_IN", [tmp_path])
    for given, last in ((["--config", "one.yaml", "--config=two.yaml"], "two.yaml"),
                        (["--config=one.yaml", "-c", "two.yaml"], "two.yaml"),
                        (["--config=two.yaml", "--config", "one.yaml"], "one.yaml")):  # fmt: skip
        monkeypatch.setattr(cli, "GIVEN", given)
        assert cli.config_setting("model.lr") == last, given


def test_an_error_raised_outside_jsonargparse_is_not_taken_for_a_class_it_made():
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("the data module's own") from None
    except ValueError as error:
        assert refusal_inside(error) is None


def test_a_trainer_option_of_lightning_1_is_told_what_replaced_it(monkeypatch, capsys, in_project_copy):
    # Closest by spelling, gpus was taken for plugins, and resume_from_checkpoint for enable_checkpointing.
    for given in ("--trainer.gpus=1", "--gpus=1"):  # Lightning 1's scripts took it without trainer.
        message = refusal(monkeypatch, capsys, "fit", given)
        assert message.endswith(": Lightning 2 replaced it with trainer.accelerator gpu and trainer.devices <count>")
    (in_project_copy / "old.yaml").write_text("trainer:\n  resume_from_checkpoint: runs/last.ckpt\n")
    message = refusal(monkeypatch, capsys, "fit", "--config=old.yaml")
    assert message.endswith("'trainer.resume_from_checkpoint': Lightning 2 replaced it with --ckpt_path <file> "
                            "(or auto, or last)"), message  # fmt: skip


def test_a_null_optimizer_as_a_runs_config_holds_it_is_no_refusal(monkeypatch, capsys, in_project_copy):
    for given in (["--optimizer=null"], ["--lr_scheduler", "null"]):
        with pytest.raises(SystemExit) as done:
            run_cli(monkeypatch, "fit", *given, "--print_config")
        assert done.value.code in (0, None) and "seed_everything:" in capsys.readouterr().out


@pytest.mark.parametrize("given", [["--config", "configs/trainer/cpu.yaml", "fit"], ["-c=configs/cpu.yaml", "test"],
                                   ["--config=configs/cpu.yaml", "doctor"]])  # fmt: skip
def test_a_config_before_the_command_is_told_to_go_after_it(monkeypatch, capsys, in_project_copy, given):
    # As LightningCLI's --help shows it: its parser there takes no fit options and named the file's first
    # (`trainer.accelerator is not accepted before subcommand 'fit'`), or ignored the file without a word.
    message = refusal(monkeypatch, capsys, *given)
    assert message.endswith(f"goes after the command, as in: python -m {cli.PACKAGE} {given[-1]} --config <file>")


@pytest.mark.parametrize(
    "given",
    [["--trainer", "configs/trainer/cpu.yaml"], ["--model=configs/recipe/scratch.yaml"],
     ["--trainer", "epochs.yaml", "--trainer", "configs/trainer/cpu.yaml"]],  # the one of two that is whole
)  # fmt: skip
def test_a_whole_config_given_to_one_group_is_told_to_go_to_config(monkeypatch, capsys, in_project_copy, given):
    # Lightning's docs give --trainer a file of the trainer's options alone; ours start with trainer:.
    # It was refused as the option trainer.trainer.accelerator, or offered the closest spellings of one.
    (in_project_copy / "epochs.yaml").write_text("max_epochs: 2\n")
    group, file = given[0].partition("=")[0].removeprefix("--"), given[-1].partition("=")[2] or given[-1]
    message = refusal(monkeypatch, capsys, "fit", *given)
    assert message == f"error: {file} is a whole config (it sets trainer:): give it as --config {file}, not --{group}"


def test_a_class_path_for_the_data_or_model_says_where_code_of_ones_own_goes(monkeypatch, capsys, in_project_copy):
    # It was offered the closest spellings (data.std, data.crop_ratio), as if class_path were a typo.
    (in_project_copy / "mine.yaml").write_text("data:\n  class_path: mine.CSVDataModule\n")
    message = refusal(monkeypatch, capsys, "fit", "--config=mine.yaml")
    assert message.endswith("'data.class_path': the commands build ImageDataModule themselves, so data: takes its "
                            "options alone, with no class_path or init_args. Code of your own goes in "
                            "src/{{ cookiecutter.package_name }}/data.py (README: Where to edit)"), message  # fmt: skip


def test_a_misspelt_option_in_a_config_file_is_named_once(monkeypatch, capsys, in_project_copy, tiny_shapes):
    (in_project_copy / "mine.yaml").write_text("model:\n  backbon: resnet18\n")
    message = refusal(monkeypatch, capsys, *fit(tiny_shapes, "--config=mine.yaml"))
    assert message.startswith("error: mine.yaml: ")  # the file to correct, among those read
    assert "does not accept option 'model.backbon'. Did you mean model.backbone or " in message


def test_a_class_that_fails_to_import_without_a_message_is_named():
    # jsonargparse's report of an ImportError raised bare: nothing under the class's line.
    union = 'Parser key "trainer.logger":\n  Does not validate against any of the Union subtypes\n  Errors:\n'
    problems = "    - Problem with given class_path 'mine.Logger':\n    - Expected a <class 'bool'>\n"
    message = condensed(union + problems + "  Given value: mine.Logger\n")
    assert message == "--trainer.logger: mine.Logger: cannot be imported"


def test_a_misspelt_option_of_a_callback_in_a_config_file_is_named_with_its_spelling(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    early_stopping = "class_path: lightning.pytorch.callbacks.EarlyStopping"
    options = "init_args: {monitor: val/acc, patiense: 3}"
    (in_project_copy / "mine.yaml").write_text(f"trainer:\n  callbacks:\n    - {early_stopping}\n      {options}\n")
    message = refusal(monkeypatch, capsys, *fit(tiny_shapes, "--config=mine.yaml"))
    stale = "mine.yaml: EarlyStopping takes no patiense (did you mean patience?)"
    assert message == f"error: {stale}: correct or delete them in the config"


@pytest.mark.parametrize("option", [["--config=mine.yaml"], ["-c", "mine.yaml"], ["--config=configs/mine.yaml"]])
def test_a_yaml_syntax_error_names_the_file_and_line(monkeypatch, capsys, in_project_copy, tiny_shapes, option):
    (in_project_copy / option[-1].split("=")[-1]).write_text("model:\n  backbone: resnet18\ndata: [1, 2\n")
    message = refusal(monkeypatch, capsys, *fit(tiny_shapes, *option))
    assert message.startswith(f"error: {option[-1].split('=')[-1]} line 4, column 1 is not valid YAML:"), message


@pytest.mark.parametrize(
    "text, said",
    [
        ("# my overrides\n# data:\n#   batch_size: 8\n", "mine.yaml holds no settings (it is empty or all comments): "
         "add some, or leave out --config mine.yaml"),
        ("", "mine.yaml holds no settings (it is empty or all comments): add some, or leave out --config mine.yaml"),
        ("- 8\n", "mine.yaml holds no settings (no `key: value` lines): add some, or leave out --config mine.yaml"),
        ("data:\n", "mine.yaml holds no settings (data: with nothing under it): add some, or leave out --config "
         "mine.yaml"),
    ],
)  # fmt: skip
def test_a_config_file_without_settings_is_named_with_the_fix(monkeypatch, capsys, in_project_copy, tiny_shapes, text,
                                                               said):  # fmt: skip
    # jsonargparse said "Unexpected config: " and the file's text, with neither the file's name nor a fix.
    # A run's config.yaml given before it, with its sections set to null, is not the one named.
    (in_project_copy / "mine.yaml").write_text(text)
    (in_project_copy / "run.yaml").write_text("optimizer: null\nlr_scheduler: null\nckpt_path: null\n")
    message = refusal(monkeypatch, capsys, *fit(tiny_shapes, "--config=run.yaml", "--config=mine.yaml"))
    assert message == f"error: {said}"


def test_an_emptied_default_config_is_named_with_the_fix_for_it(monkeypatch, capsys, in_project_copy, tiny_shapes):
    (in_project_copy / "configs" / "default.yaml").write_text("# all set aside\n")
    said = "configs/default.yaml holds no settings (it is empty or all comments): add some, or restore it (every "
    assert refusal(monkeypatch, capsys, *fit(tiny_shapes)) == f"error: {said}command reads it)"


@pytest.mark.parametrize(
    "command, word, said",
    [
        ("fit", "best", "--ckpt_path best is the best checkpoint of a fit earlier in the same process: pass auto ("),
        ("fit", "hpc", "--ckpt_path hpc is the checkpoint of Lightning's SLURM requeue, which this project does not "
         "use: pass auto ("),
        ("validate", "hpc", "--ckpt_path hpc is the checkpoint of Lightning's SLURM requeue, which this project does "
         "not use: pass best or nothing ("),
        ("test", "registry", "--ckpt_path registry: Lightning's model registry needs the litmodels package "
         "(pip install litmodels); else pass best or nothing ("),
        # Lightning takes registry words in any case
        ("fit", "REGISTRY:my-model", "--ckpt_path REGISTRY:my-model: Lightning's model registry needs the "
         "litmodels package (pip install litmodels); else pass auto ("),
    ],
)  # fmt: skip
def test_lightnings_own_ckpt_path_words_that_do_nothing_here_are_refused_in_one_line(
    monkeypatch, capsys, in_project_copy, tiny_shapes, command, word, said
):
    # --help offered them, and each ended in a traceback (registry after making a run folder).
    if word.lower().startswith("registry") and find_spec("litmodels"):
        pytest.skip("litmodels is installed: Lightning reads its registry")
    message = refusal(monkeypatch, capsys, command, *ON_CPU, *on_data(tiny_shapes), f"--ckpt_path={word}")
    assert message.startswith(f"error: {said}"), message
    assert not (in_project_copy / "runs").exists()
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, command, "--help")
    help_text = capsys.readouterr().out
    assert "hpc" not in help_text and ("auto (continue the newest run" in help_text) == (command == "fit")


def test_checkpoint_paths_are_checked_before_anything_reads_them(tmp_path):
    for remote in ("s3://bucket/run/last.ckpt", "r2://bucket/last.ckpt", "file:///runs/last.ckpt"):
        check_checkpoint(remote)  # remote: Lightning reads it through fsspec
    check_checkpoint("best")
    weights_only = tmp_path / "weights.pt"
    torch.save({"fc.weight": torch.zeros(2)}, weights_only)
    with pytest.raises(DataError, match="weights.pt is not a Lightning checkpoint"):
        check_checkpoint(str(weights_only))
    with pytest.raises(MissingError, match="no such file"):
        check_checkpoint(str(tmp_path / "best_model.ckpt"))
    # A run folder, or its checkpoints/, given for one of its checkpoints: the fix names one.
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(DataError, match=r"run is a folder, .* \(FSDP or DeepSpeed\): name a checkpoint file\.$"):
        check_checkpoint(str(tmp_path / "run"))
    for name in ("epoch=0-step=4.ckpt", "last.ckpt"):
        torch.save({"state_dict": {}}, tmp_path / "run" / "checkpoints" / name)
    for given in ("run", "run/checkpoints"):
        with pytest.raises(DataError, match=re.escape(f"in it, such as {tmp_path / 'run/checkpoints/last.ckpt'}.")):
            check_checkpoint(str(tmp_path / given))


@pytest.mark.parametrize(
    "layout", ["missing", "a file", "one class", "empty class", "one folder more", "one image a class", "empty val"]
)
def test_bad_data_folders_end_in_one_line(monkeypatch, capsys, in_project_copy, tiny_shapes, tmp_path, layout):
    data = tmp_path / "data"
    if layout == "one class":
        shutil.copytree(tiny_shapes / "train" / "circle", data / "circle")
    elif layout == "one folder more":  # unpacked from shapes.zip, beside what a Mac adds to a zip
        shutil.copytree(tiny_shapes, data / "shapes")
        (data / "__MACOSX" / "shapes").mkdir(parents=True)
    elif layout == "empty class":
        shutil.copytree(tiny_shapes / "train", data)
        shutil.rmtree(data / "circle")
        (data / "circle").mkdir()
    elif layout == "a file":  # an archive not unpacked yet
        data.write_bytes(b"PK\x05\x06" + bytes(18))
    elif layout == "one image a class":  # trained with no best checkpoint, said by Lightning's warnings alone
        for name in ("circle", "square"):
            (data / name).mkdir(parents=True)
            shutil.copy(next((tiny_shapes / "train" / name).iterdir()), data / name)
    elif layout == "empty val":
        shutil.copytree(tiny_shapes / "train", data / "train")
        (data / "val").mkdir()
    expected = {"missing": f"Data folder {data} does not exist.", "a file": f"Data folder {data} is a file.",
                "one class": "needs at least two: put each class's images in a folder of its own under it.",
                "empty class": "No images", "one folder more": f"{data} has 1 class folder(s) (shapes); a classifier "
                f"needs at least two: if the 3 folders in shapes are the classes or the splits, set data.data_dir to "
                f"{data / 'shapes'}.",
                "one image a class": f"No validation images: every class in {data} has one image, and a share is held "
                "out only of a class of two or more. Add images, or a val/ folder of them.",
                "empty val": f"{data / 'val'} holds no images: add each class's, or remove it to hold out a share of "
                "train/."}[layout]  # fmt: skip
    # Not a fast_dev_run, whose logger keeps nothing: the default logger's run must not have begun.
    line = refusal(monkeypatch, capsys, *fit(data), "--trainer.fast_dev_run=false")
    assert expected in line
    # data.synthetic draws only into data/shapes, and refuses any other folder: no fix for this one.
    assert "synthetic" not in line
    assert not (in_project_copy / "runs").exists()


def test_fewer_validation_images_than_processes_are_refused_before_the_run(
    monkeypatch, capsys, in_project_copy, tiny_shapes, tmp_path
):
    # A process with none failed an assertion of Lightning's sampler, in a traceback, after the run folder.
    data = tmp_path / "data"
    shutil.copytree(tiny_shapes / "train", data / "train")
    (data / "val" / "circle").mkdir(parents=True)
    shutil.copy(next((tiny_shapes / "val" / "circle").iterdir()), data / "val" / "circle")
    two = ["--trainer.fast_dev_run=false", "--trainer.devices=2", "--trainer.strategy=ddp"]
    assert refusal(monkeypatch, capsys, *fit(data, *two)) == (
        "error: 1 validation image(s) for 2 processes, each of which evaluates one or more: add images, or evaluate "
        "on 1 process(es) or fewer (--trainer.devices, --trainer.num_nodes)."
    )
    assert not (in_project_copy / "runs").exists()


def test_consolidate_names_a_missing_checkpoint_apart_from_a_file(monkeypatch, capsys, tmp_path):
    missing = refusal(monkeypatch, capsys, "consolidate", str(tmp_path / "last.ckpt"), str(tmp_path / "out.ckpt"))
    assert missing == f"error: {tmp_path / 'last.ckpt'}: no such folder. Give a sharded checkpoint's folder " + (
        "(.../last.ckpt)."
    )
    (tmp_path / "model.ckpt").write_bytes(b"")
    one_file = refusal(monkeypatch, capsys, "consolidate", str(tmp_path / "model.ckpt"), str(tmp_path / "out.ckpt"))
    assert one_file.endswith("model.ckpt is not a folder: only sharded checkpoints (folders) need consolidating.")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.ckpt"]
    (tmp_path / "sharded").mkdir()
    into_a_folder = refusal(monkeypatch, capsys, "consolidate", str(tmp_path / "sharded"), str(tmp_path))
    assert into_a_folder.endswith(f"OUTPUT {tmp_path} is a folder: name the checkpoint file to write.")


def test_predict_on_a_folder_without_classes_{{ "points_at_classify" if cookiecutter.inference == "yes" else "says_what_it_reads" }}(monkeypatch, capsys, trained, tiny_shapes):
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    loose = trained / "photos"
    loose.mkdir()
    for image in sorted((tiny_shapes / "test").rglob("*.png"))[:3]:
        shutil.copy(image, loose / image.name)
    capsys.readouterr()  # the training run's lines
    message = refusal(monkeypatch, capsys, "predict", *ON_CPU, *on_data(loose), f"--ckpt_path={checkpoint}")
{%- if cookiecutter.inference == "yes" %}
    assert f"{loose} has no class folders" in message and f"classify {loose} --checkpoint" in message
{%- else %}
    assert message.endswith(
        f"{loose} has no class folders, and predict runs a checkpoint over a dataset laid out in "
        "them (its test/ or validation images): put the images in one folder per class."
    )
{%- endif %}


def test_a_resume_of_another_backbone_is_refused_in_one_line(monkeypatch, capsys, trained, tiny_shapes):
    (config,) = trained.glob("runs/*/*/config.yaml")
    config.unlink()  # without it, the options a resume changes are not compared: the weights must be
    (checkpoint,) = trained.glob("runs/*/*/checkpoints/last.ckpt")
    backbone = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["backbone"]  # configs/ may set another
    other = OTHER_BACKBONE if backbone != OTHER_BACKBONE else "{{ cookiecutter.backbone }}"
    capsys.readouterr()  # the training run's lines
    options = [*ON_CPU, *on_data(tiny_shapes), "--ckpt_path=last", "--trainer.max_epochs=2"]
    message = refusal(monkeypatch, capsys, "fit", *options, f"--model.backbone={other}")
    assert f"weights ({backbone}) do not fit this model ({other})" in message, message


def test_the_traceback_is_there_when_asked_for(monkeypatch, in_project_copy, tiny_shapes):
    monkeypatch.setenv(TRACEBACK_VARIABLE, "1")
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *fit(tiny_shapes, "--data.batch_size=0")])
    with pytest.raises(ConfigError, match="data.batch_size must be 1 or more"):
        main()


def test_runs_that_cannot_be_written_are_refused_in_one_line(monkeypatch, capsys, in_project_copy, tiny_shapes):
    (in_project_copy / "taken").write_text("a file where the runs folder would go")
    message = refusal(monkeypatch, capsys, *fit(tiny_shapes, "--trainer.logger.save_dir=taken/runs"))
    assert message.startswith(
        f"error: Cannot write the runs into taken/runs ({in_project_copy / 'taken'} is not a folder)"
    )
    assert "point --trainer.logger.save_dir at a folder you can write" in message


def test_a_file_systems_refusal_is_told_with_the_file_and_its_fix_and_no_other_error_is():
    refused = PermissionError(errno.EACCES, "Permission denied", "runs/shapes/version_3/checkpoints/last.ckpt")
    assert refused_by_file_system(refused) == (
        "Permission denied: runs/shapes/version_3/checkpoints/last.ckpt (use a path this user may write and read)"
    )
    assert refused_by_file_system(OSError(errno.EIO, "Input/output error")) is None
    assert refused_by_file_system(RuntimeError("No space left on device")) is None


def test_default_root_dir_holds_the_runs(monkeypatch, in_project_copy, tiny_shapes):
    args = fit(tiny_shapes, "--trainer.default_root_dir=elsewhere")
    args.remove("--trainer.fast_dev_run=true")  # which writes no files
    run_cli(monkeypatch, *args, "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=1")  # fmt: skip
    assert list(in_project_copy.glob("elsewhere/runs/*/*/checkpoints/last.ckpt")) and not Path("runs").exists()


GLOO = "[/pytorch/third_party/gloo/gloo/transport/tcp/{}] "


@pytest.mark.parametrize(
    ("world", "said", "told"),
    [
        (2, GLOO.format("pair.cc:561") + "Connection closed by peer [127.0.0.1]:1462. This is typically caused by "
         "a remote worker crashing.", "process 1 of 2 stopped: another process of this run ended first"),
        (2, GLOO.format("pair.cc:589") + "Read error [127.0.0.1]:35170: Connection reset by peer",
         "process 1 of 2 stopped: another process of this run ended first"),
        (2, GLOO.format("unbound_buffer.cc:78") + "Timed out waiting 5000ms for recv operation to complete",
         "process 1 of 2 stopped: another process of this run did not reach the same step within the timeout"),
        (1, GLOO.format("pair.cc:561") + "Connection closed by peer [127.0.0.1]:1462.", None),  # no other process
        (2, "my own check: Timed out waiting for the labels file", None),  # the user's, told as it is
        # A data worker's error, which torch raises again with the worker's traceback in the message.
        (2, "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
         + GLOO.format("pair.cc:561") + "Connection closed by peer", None),
    ],
)  # fmt: skip
def test_only_a_collectives_error_over_a_lost_process_is_told_as_one(monkeypatch, world, said, told):
    import torch.distributed as dist

    for name, value in {"is_initialized": True, "get_world_size": world, "get_rank": 1}.items():
        monkeypatch.setattr(dist, name, lambda value=value: value)
    line = other_process_gone(RuntimeError(said))
    assert (line or "").startswith(told or "") and (line is None) is (told is None), line


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ImageDataModule(augment="randaugmnt"),
            "data.augment must be one of none, basic, trivialaugment, randaugment, autoaugment, got 'randaugmnt' "
            "(did you mean randaugment?)",
        ),
        (
            lambda: ImageDataModule(num_workers="atuo"),
            "data.num_workers must be one of auto, got 'atuo' (did you mean auto?)",
        ),
        (
            lambda: ImageClassifier(num_classes=6, compile_mode="fast"),
            "model.compile_mode must be one of off, default, reduce-overhead, max-autotune, got 'fast'",
        ),
        (lambda: ImageClassifier(num_classes=0), "model.num_classes must be 2 or more"),
    ],
    ids=["augment", "workers", "compile", "classes"],
)
def test_options_given_from_python_are_refused_as_the_command_line_refuses_them(build, message):
    # From Python, augment="foo" trained with the basic augmentation, and num_classes=0 built a model.
    with pytest.raises(ConfigError) as refused:
        build()
    assert str(refused.value).startswith(message)
