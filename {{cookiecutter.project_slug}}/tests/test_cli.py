import ast
import csv
import inspect
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from conftest import ON_CPU, PROJECT_ROOT, command_env, on_data, refusal, run_cli, run_command, run_group
from packaging.specifiers import SpecifierSet
{%- if cookiecutter.logger == "tensorboard" %}
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
{%- endif %}

from {{ cookiecutter.package_name }} import cli
from {{ cookiecutter.package_name }}.cli import TOOLS
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.datasets.shapes import CLASSES
from {{ cookiecutter.package_name }}.model import ImageClassifier

# The tests run on CPU whatever hardware the project was generated for.


def test_fast_dev_run_through_the_command_line(monkeypatch, in_project_copy, tiny_shapes):
    run_cli(monkeypatch, "fit", "--trainer.fast_dev_run=true", *ON_CPU, *on_data(tiny_shapes))
    assert [path.name for path in in_project_copy.iterdir()] == ["configs"], "a smoke test writes nothing"


def test_the_progress_bar_switches_off(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # The recipe lists a RichProgressBar, which Lightning refuses beside enable_progress_bar=false.
    run_cli(monkeypatch, "fit", "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false", *ON_CPU,
            *on_data(tiny_shapes))  # fmt: skip
    assert "Epoch 0" not in capsys.readouterr().out  # what the progress bar would print
    assert not (in_project_copy / "runs").exists(), "fast_dev_run should write nothing"


def test_short_fit_writes_a_run_folder_that_reloads(monkeypatch, caplog, in_project_copy, tiny_shapes):
    run_cli(
        monkeypatch,
        "fit",
        *ON_CPU,
        *on_data(tiny_shapes),
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=2",
        "--model.backbone=resnet18",
    )
    (run,) = [p for p in (in_project_copy / "runs").glob("*/*") if (p / "checkpoints").is_dir()]
    assert f"Run folder: {run.relative_to(in_project_copy)} (config.yaml, checkpoints/)" in caplog.text
    checkpoints = run / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir())
    assert "last.ckpt" in names and "class_names.json" in names
    (best,) = [name for name in names if name.startswith("epoch000-acc")]
    assert best.endswith(".ckpt") and "/" not in best
    assert (run / "config.yaml").is_file()
    assert json.loads((checkpoints / "class_names.json").read_text()) == list(CLASSES)

    model = ImageClassifier.load_from_checkpoint(checkpoints / "last.ckpt", map_location="cpu").eval()
    assert model.hparams.class_names == list(CLASSES)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, len(CLASSES))
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["ImageDataModule"]["class_names"] == list(CLASSES)

    # The pictures of the last validation: a confusion matrix and each class's accuracy.
    reports = run / "reports"
    assert (reports / "confusion_matrix_val.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((reports / "per_class_accuracy_val.csv").open()))
    assert [row["class"] for row in rows] == list(CLASSES)
    assert sum(int(row["images"]) for row in rows) == 16  # two validation batches of 8
{%- if cookiecutter.logger == "tensorboard" %}
    (events,) = run.glob("events.out.tfevents.*")
    assert "val/confusion_matrix" in EventAccumulator(str(events)).Reload().Tags()["images"]
{%- elif cookiecutter.logger == "wandb" %}
    assert list(in_project_copy.glob("runs/wandb/offline-run-*/files/media/images/val/confusion_matrix_*.png"))
{%- endif %}


def test_last_checkpoint_follows_the_latest_epoch_even_without_improvement(monkeypatch, in_project_copy, tiny_shapes):
    # lr 0: accuracy never improves, so the best checkpoint stays at epoch 0 while training goes on.
    epochs = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), *epochs, "--model.lr=0")
    (last,) = (in_project_copy / "runs").glob("*/*/checkpoints/last.ckpt")
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (1, 4)


def test_checkpoint_on_data_with_other_classes_is_refused(monkeypatch, capsys, in_project_copy, tiny_shapes, tmp_path):
    one_batch = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
    run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), *one_batch, "--model.backbone=resnet18")
    (last,) = (in_project_copy / "runs").glob("*/*/checkpoints/last.ckpt")
    other = tmp_path / "other"
    for i, name in enumerate(["ant", "bee", "cat", "dog", "eel", "fox"]):
        source = tiny_shapes / "train" / CLASSES[i]
        (other / name).mkdir(parents=True)
        for image in list(source.iterdir())[:3]:
            (other / name / image.name).write_bytes(image.read_bytes())
    capsys.readouterr()  # the training's output
    message = refusal(monkeypatch, capsys, "validate", *ON_CPU, *on_data(other), f"--ckpt_path={last}")
    assert "trained on the classes" in message and message.endswith("fit --model.init_weights <checkpoint>.")

    # A new run on them from its weights, at learning rate 0: the backbone's as they were, a new head.
    new = [*ON_CPU, *on_data(other), "--model.backbone=resnet18", "--model.lr=0", f"--model.init_weights={last}",
           "--trainer.logger.save_dir=new"]  # fmt: skip
    run_cli(monkeypatch, "fit", *new, *one_batch)
    (started,) = (in_project_copy / "new").glob("*/*/checkpoints/last.ckpt")
    before, after = (torch.load(path, map_location="cpu", weights_only=True) for path in (last, started))
    for name in ("backbone.conv1.weight", "backbone.layer4.1.conv2.weight"):
        assert torch.equal(before["state_dict"][name], after["state_dict"][name]), name
    assert not torch.equal(before["state_dict"]["backbone.fc.weight"], after["state_dict"]["backbone.fc.weight"])
    assert after["hyper_parameters"]["init_weights"] is None, "the weights are in this checkpoint now"
    # Trained longer with the same command, the first checkpoint gone: the run's own weights are read.
    last.rename(tmp_path / "moved.ckpt")
    for epochs in (2, 3):  # and again: its first resume's config did not leave init_weights out
        run_cli(monkeypatch, "fit", *new, *one_batch[1:], f"--trainer.max_epochs={epochs}", "--ckpt_path=last")
        assert torch.load(started, map_location="cpu", weights_only=True)["epoch"] == epochs - 1
    last = tmp_path / "moved.ckpt"
    capsys.readouterr()  # the training's output
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(other), "--model.backbone=resnet34",
                      f"--model.init_weights={last}")  # fmt: skip
    assert message == (
        f"error: model.init_weights {last} holds a resnet18 backbone, not resnet34: set model.backbone resnet18, "
        "or leave init_weights out."
    )


def test_a_library_that_reading_the_config_imports_still_logs_to_the_terminal(in_project_copy):
    # doctor (and the commands that run fits of their own) read the configuration with its output
    # captured; DeepSpeed, imported then, kept that capture as its log's stream, and its lines during
    # training went nowhere.
    pytest.importorskip("deepspeed")
    code = ("import logging, sys; from {{ cookiecutter.package_name }}.cli import resolved_config; "
            "assert 'deepspeed' not in sys.modules, 'imported before: this test would show nothing'; "
            "resolved_config(['--config=configs/trainer/deepspeed_stage2.yaml']); "
            "assert 'deepspeed' in sys.modules; "
            "logging.getLogger('DeepSpeed').warning('a line after the config')")  # fmt: skip
    done = run_group([sys.executable, "-c", code], 300, cwd=in_project_copy, env=command_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "a line after the config" in done.stdout


def test_every_option_is_documented_in_help(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "fit", "--help")
    help_text = capsys.readouterr().out
    # Every argument of the model and the data module, but those the CLI links from the other.
    linked = {"model.num_classes", "model.class_names", "model.batch_size", "data.pretrained_backbone"}
    for section, cls in (("model", ImageClassifier), ("data", ImageDataModule)):
        for name in list(inspect.signature(cls.__init__).parameters)[1:]:
            if f"{section}.{name}" not in linked:
                assert f"--{section}.{name} " in help_text, f"--{section}.{name}"
    assert "Scale `lr` linearly" in help_text and "Mixup: blend pairs of training images" in help_text


def test_fit_away_from_the_project_names_the_default_configs_it_lacks_and_reads_the_rest(monkeypatch, capsys, tmp_path):
    (tmp_path / "configs").mkdir()
    default = (PROJECT_ROOT / "configs" / "default.yaml").read_text()
    (tmp_path / "configs" / "default.yaml").write_text(re.sub("^seed_everything: .*$", "seed_everything: 1234", default,
                                                              flags=re.MULTILINE))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "fit", "--print_config")
    printed = capsys.readouterr()
    trainer_preset = cli.DEFAULT_CONFIGS[0]
    assert printed.err.strip() == f"No {trainer_preset} in {tmp_path}: run from the project folder or pass --config."
    assert "seed_everything: 1234" in printed.out


def test_misspelt_monitored_metric_stops_before_training(monkeypatch, capsys, in_project_copy, tiny_shapes):
    misspelt = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val/accuracy"]
    message = refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), *misspelt)
    assert re.search(r"EarlyStopping monitors 'val/accuracy', which is never logged.*'val/acc'", message)


@pytest.mark.parametrize("where", ["command line", "config file"])
def test_misspelt_option_names_the_closest_one(monkeypatch, capsys, in_project_copy, where):
    (in_project_copy / "typo.yaml").write_text("model:\n  backbnoe: resnet18\n")
    typo = "--model.backbnoe=resnet18" if where == "command line" else "--config=typo.yaml"
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "fit", typo)
    assert "Did you mean model.backbone" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "module", "name"),
    [("plugins", "checkpoint_io", "AtomicCheckpointIO"), ("logger", "csv_logging", "ResumableCSVLogger")],
)
def test_a_class_path_from_the_flat_package_names_where_the_class_is_now(
    monkeypatch, capsys, in_project_copy, option, module, name
):
    # A run's config.yaml from before the package was laid out by concern names its classes at the top.
    old, new = (f"{{ cookiecutter.package_name }}.{folder}{module}.{name}" for folder in ("", "training."))
    entry = f"- class_path: {old}" if option == "plugins" else f"class_path: {old}"
    (in_project_copy / "old.yaml").write_text(f"trainer:\n  {option}:\n    {entry}\n")
    message = refusal(monkeypatch, capsys, "fit", "--config=old.yaml", "--trainer.fast_dev_run=true")
    assert message == f"error: {old} is now {new}: change the config"


def test_a_run_config_from_the_flat_package_names_each_path_that_moved(monkeypatch, capsys, in_project_copy):
    package = "{{ cookiecutter.package_name }}"
    (in_project_copy / "old.yaml").write_text(
        f"trainer:\n  callbacks:\n    - class_path: {package}.callbacks.StopOnNonFiniteLoss\n"
        f"    - class_path: {package}.ema.ModelEMA\n# auto_wrap_policy: {package}.sharding.wrap_blocks\n"
    )
    message = refusal(monkeypatch, capsys, "fit", "--config=old.yaml", "--trainer.fast_dev_run=true")
    assert message == (
        f"error: {package}.callbacks.StopOnNonFiniteLoss is now {package}.training.callbacks.StopOnNonFiniteLoss; "
        f"{package}.ema.ModelEMA is now {package}.training.ema.ModelEMA; "
        f"{package}.sharding.wrap_blocks is now {package}.hardware.sharding.wrap_blocks: change the config"
    )


def test_a_config_an_evaluation_saved_is_named_as_another_commands_for_fit(monkeypatch, capsys, in_project_copy):
    (in_project_copy / "config_validate.yaml").write_text("verbose: true\ntrainer:\n  max_epochs: 3\n")
    message = refusal(monkeypatch, capsys, "fit", "--config=config_validate.yaml", "--trainer.fast_dev_run=true")
    assert "does not accept option 'verbose': it is another command's; fit takes the run's config.yaml" in message
    assert "Did you mean verbose" not in message, message
    (in_project_copy / "typo.yaml").write_text("seed_everythin: 3\n")
    message = refusal(monkeypatch, capsys, "fit", "--config=typo.yaml", "--trainer.fast_dev_run=true")
    assert message.endswith("does not accept option 'seed_everythin'. Did you mean seed_everything?"), message


def test_a_mistyped_or_missing_command_lists_every_command_and_help_names_the_tools(monkeypatch, capsys):
    commands = ", ".join([*cli.SUBCOMMANDS, *cli.TOOLS])
    message = refusal(monkeypatch, capsys, "fitt")
    assert message == f"error: 'fitt' is no command; the commands are {commands}. Did you mean fit?"
    assert refusal(monkeypatch, capsys, "repor").startswith("error: 'repor' is no command; the commands are fit, ")
    assert refusal(monkeypatch, capsys) == f"error: no command given; the commands are {commands}"
    with pytest.raises(SystemExit) as ended:
        run_cli(monkeypatch, "--help")
    assert ended.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"usage: python -m {cli.PACKAGE} " in printed
    assert f"each with its own --help: {', '.join(cli.TOOLS)}." in printed
    assert all(f"{command} {said}" in printed for command, said in cli.COMMAND_HELP.items())  # not cut mid-sentence
    assert "--config" not in printed, "it goes after the command"
    for tool in cli.TOOLS:  # a usage line a user can copy and run
        run_command(monkeypatch, tool, "--help")
        assert capsys.readouterr().out.startswith(f"usage: python -m {cli.PACKAGE} {tool} "), tool


def test_fit_loads_no_other_commands_code_nor_wandb():
    # Each tool is imported by its own command only: `fit` pays for none of them. W&B's library
    # (0.7 s on 2 cores) loads when a run logs, not to parse the config.
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "{{ cookiecutter.package_name }}", "fit", "--help"],
                          capture_output=True, text=True, env=command_env(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(re.findall(r"\|\s+{{ cookiecutter.package_name }}\.([\w.]+)\s*$", done.stderr, re.MULTILINE))
    tools = {f"commands.{module.partition(':')[0]}" for module in TOOLS.values()}
    assert {"cli", "training.callbacks"} <= imported and "commands" not in imported, imported & tools
    assert not re.search(r"\|\s+wandb\s*$", done.stderr, re.MULTILINE), "wandb imported to parse"


# Started in every process on its PYTHONPATH: an exit hook, a thread that works once the program has
# ended, and a file written but never closed.
AT_EXIT = """
import atexit, os, threading
folder = os.environ["EXIT_MARKS"]
mark = lambda name: open(os.path.join(folder, name), "w").close()
atexit.register(mark, "hook")
threading.Thread(target=lambda: (threading.main_thread().join(), mark("thread"))).start()
unclosed = open(os.path.join(folder, "unclosed"), "w")
unclosed.write("written")
"""


@pytest.mark.parametrize(
    ("args", "status", "last_line"),
    [
        (["fit", "--help"], 0, "stdout"),
        (["fit", "--data.batch_size=0"], 1, "error: data.batch_size must be 1 or more, got 0"),
        (["fitt"], 2, "error: 'fitt' is no command"),
    ],
)
def test_a_command_ends_without_pythons_teardown_but_with_all_that_comes_before_it(tmp_path, args, status, last_line):
    # __main__ ends the process before Python frees its modules (a second, with torch): the exit status,
    # every line printed (into a pipe, which holds them in a buffer), the threads and exit hooks stay.
    (tmp_path / "sitecustomize.py").write_text(AT_EXIT)
    env = command_env(EXIT_MARKS=str(tmp_path))
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-m", "{{ cookiecutter.package_name }}", *args], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == status, done.stderr[-3000:]
    if last_line == "stdout":  # --help: the whole of it, to its last line
        with_help = subprocess.run([sys.executable, "-c", "from {{ cookiecutter.package_name }}.cli import main; main()",
                                    *args], capture_output=True, text=True, env=command_env(), timeout=300)  # fmt: skip
        assert done.stdout == with_help.stdout and len(done.stdout.splitlines()) > 100
    else:
        assert done.stderr.splitlines()[-1].startswith(last_line), done.stderr[-3000:]
    assert (tmp_path / "hook").is_file() and (tmp_path / "thread").is_file()
    assert (tmp_path / "unclosed").read_text() == "written"


def test_a_python_without_the_projects_packages_is_one_error_line(tmp_path):
    # python3 where .venv is not activated (or `make doctor` of a project set up with another Python) ended
    # in ModuleNotFoundError's traceback.
    (tmp_path / "lightning.py").write_text("raise ModuleNotFoundError('No module named lightning', name='lightning')")
    env = command_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-m", "{{ cookiecutter.package_name }}", "doctor"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (f"error: {sys.executable} has no module lightning, which this project needs: run it with "
                           "its environment's Python (.venv/bin/python, which `make install` makes), or install the "
                           "project into this one.\n")  # fmt: skip
    # Imported by code, the package raises as any module does.
    imported = subprocess.run([sys.executable, "-c", "import {{ cookiecutter.package_name }}"], capture_output=True,
                              text=True, env=env, timeout=300)  # fmt: skip
    assert imported.returncode == 1 and imported.stderr.endswith("ModuleNotFoundError: No module named lightning\n")


def test_the_package_imports_form_no_cycle():
    # Imports inside functions count: they must not be a way around a cycle.
    package = Path(cli.__file__).parent
    modules = {".".join(path.relative_to(package).with_suffix("").parts): path for path in package.rglob("*.py")}
    imports = {}
    for name, path in modules.items():
        here = name.split(".")[:-1]  # the package the module is in
        imports[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [node.module])])
                # from .training import sigterm names a module; from .errors import PACKAGE, a module's name
                named = {f"{base}.{alias.name}".lstrip(".") for alias in node.names} & modules.keys()
                package_init = ".".join(filter(None, [base, "__init__"]))  # from . import ImageClassifier
                imports[name] |= named or {base if base in modules else package_init}

    def reaches(start: str, path: tuple[str, ...]) -> None:
        for target in imports.get(start, ()):
            assert target not in path, f"import cycle: {' -> '.join([*path, target])}"
            reaches(target, (*path, target))

    assert imports["commands.doctor"] >= {"cli", "hardware.checks", "commands.smoke_test"}  # resolved at any depth
    for module in imports:
        reaches(module, (module,))


def test_the_installed_lightning_is_one_the_project_is_bound_to():
    # pyproject.toml bounds lightning to the releases these tests ran on (private names, subclassed
    # loggers): a test run on another release must widen the bound on purpose.
    bound = re.search(r'"lightning([^"]+)"', (Path(cli.__file__).parents[2] / "pyproject.toml").read_text()).group(1)
    assert version("lightning") in SpecifierSet(bound), f"lightning {version('lightning')} is outside {bound}"


def test_a_callback_whose_option_defaults_to_an_enum_member_is_written_as_its_value(in_project_copy):
    # Lightning's Timer defaults `interval` to Interval.step, which YAML cannot represent.
    config = cli.resolved_config(["--trainer.callbacks+=Timer", "--trainer.callbacks.duration=00:00:10:00"])
    (timer,) = (callback for callback in config["trainer"]["callbacks"] if callback["class_path"].endswith("Timer"))
    assert timer["init_args"]["interval"] == "step"
