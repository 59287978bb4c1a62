"""The pre-generation hook refuses bad answers with one line each, and writes nothing."""

import ast
import os
import subprocess
import sys

import pytest
from conftest import QUIET, TEMPLATE, hook_constant, is_valid, run_bounded, tomllib


def run_cookiecutter(output_dir, env=None, **answers: str) -> subprocess.CompletedProcess:
    args = [f"{key}={value}" for key, value in (QUIET | answers).items()]
    command = [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(output_dir), str(TEMPLATE), *args]
    return run_bounded(command, 120, env=env)


REFUSED = [
    ({"project_name": "2fast"}, "project_slug '2fast' is not a valid"),
    ({"package_name": "my-classifier"}, "package_name 'my-classifier' is not a valid"),
    ({"package_name": "class"}, "package_name 'class' is a Python keyword: pick another"),
    ({"package_name": "torch"}, "shadows the module of that name that the project, its tools or tests use"),
    ({"package_name": "wandb"}, "shadows the module of that name that the project, its tools or tests use"),
    ({"package_name": "test"}, "shadows the module of that name that the project, its tools or tests use"),
    ({"package_name": "json"}, "shadows the module of that name in the standard library"),
    ({"package_name": "fsspec"}, "shadows the module"),  # imported by Lightning: the project did not start
    ({"project_name": "Hyperspectral Crop Disease Classifier"}, "is 37 characters long, and the generated code"),
    ({"package_name": "torch_" + "a" * 30}, "(e.g. package_name=torch_aaaaaaaaaaaaaaaaaaaaaaaa)"),  # not torch itself
    ({"project_name": "!!!"}, "project_name '!!!' has no letters or digits to make a folder name from"),
    ({"backbone": "ResNet-18"}, "backbone 'ResNet-18' is not a torchvision classification model (nor timm/<model>)"),
    ({"backbone": "not_a_model"}, "backbone 'not_a_model' is not a torchvision classification model"),
    ({"backbone": "timm/not_a_model.x"}, "backbone 'timm/not_a_model.x' is not a timm model"),
    ({"backbone": "timm/resnet18", "timm": "no"}, "is a timm model, and timm is no: answer timm=yes"),
    (
        {"serving": "yes", "inference": "no"},
        "serving is yes and inference is no, but serve loads the model through classify's Predictor: answer "
        "inference=yes, or serving=no.",
    ),
    ({"python_version": "2.7"}, "python_version '2.7' is not one the project's dependencies (torch, lightning)"),
    ({"python_version": "3.9"}, "use one of 3.10, 3.11, 3.12, 3.13 (e.g. python_version=3.11)"),
    ({"image_size": "big"}, "image_size 'big'"),
    ({"image_size": "8"}, "image_size '8'"),
    ({"devices": "0"}, "devices '0'"),
    ({"devices": "two"}, "devices 'two'"),
    # Digits Python and YAML do not read as the number: a leading 0, or not ASCII; the hook itself failed on ².
    ({"image_size": "064"}, "image_size '064' is not a side in pixels"),
    ({"image_size": "\u0666\u0664"}, "is not a side in pixels"),
    ({"image_size": "\u00b2"}, "is not a side in pixels"),
    ({"devices": "\u00b2"}, "is neither a positive whole number nor auto"),
    ({"devices": "01"}, "devices '01' is neither"),
    # The project imported itself in place of the library.
    ({"package_name": "timm"}, "shadows the module of that name that the project, its tools or tests use"),
    ({"package_name": "matplotlib"}, "shadows the module of that name that the project, its tools or tests use"),
    ({"backbone": "vit_b_16"}, "vit_b_16 takes 224-pixel images only, and image_size is 64: answer image_size=224."),
    ({"backbone": "inception_v3"}, "inception_v3 takes images of 75 pixels or more, and image_size is 64"),
    (
        {"accelerator": "cpu", "strategy": "deepspeed"},
        "DeepSpeed runs on NVIDIA GPUs only, and accelerator is cpu: "
        "choose accelerator gpu or auto, or strategy auto or ddp.",
    ),
    ({"accelerator": "mps", "strategy": "ddp"}, "MPS backend trains on one device in one process: choose devices 1"),
    (
        {"accelerator": "cpu", "precision": "16-mixed"},
        "16-mixed is float16 autocast for GPUs; on the CPU it is slow "
        "emulation: choose precision bf16-mixed or 32-true.",
    ),
    (
        {"accelerator": "gpu", "strategy": "fsdp", "precision": "16-mixed"},
        "FSDP2 (configs/trainer/fsdp.yaml) has no "
        "float16 loss scaling for precision 16-mixed: choose precision bf16-mixed or 32-true, or strategy ddp.",
    ),
    ({"accelerator": "mps", "devices": "2"}, "MPS backend trains on one device in one process"),
    (
        {"accelerator": "cpu", "strategy": "ddp", "devices": "auto"},
        "data parallel on the CPU with devices auto starts one process (Lightning counts the CPU as one device): "
        "answer devices with the number of processes, such as 2, or strategy auto.",
    ),
]


@pytest.mark.parametrize(("answers", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_bad_answer_is_refused_and_nothing_is_written(tmp_path, answers, message):
    result = run_cookiecutter(tmp_path, **answers)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert any(message in error for error in errors), result.stderr
    assert list(tmp_path.iterdir()) == [], "a refused answer must write nothing"


def test_every_refused_combination_is_outside_the_test_matrix():
    for answers, _ in REFUSED:
        if {"accelerator", "strategy", "precision"} & answers.keys():
            assert not is_valid({"accelerator": "auto", "strategy": "auto", "precision": "bf16-mixed"} | answers)


def test_value_outside_a_choice_list_is_refused(tmp_path):
    result = run_cookiecutter(tmp_path, logger="mlflow")
    assert result.returncode != 0 and list(tmp_path.iterdir()) == []


def test_a_timm_backbone_is_looked_up_in_timm(tmp_path):
    result = run_cookiecutter(tmp_path, backbone="timm/test_convnext.r160_in1k")
    assert result.returncode == 0, result.stderr
    model = (tmp_path / "image-classifier/src/image_classifier/model.py").read_text()
    assert 'backbone: str = "timm/test_convnext.r160_in1k"' in model


def test_a_timm_model_made_for_another_image_size_renders_with_a_note(tmp_path):
    # Rendered without a word, then refused by fit; timm's flag alone does not refuse (crossvit_9_240 takes 224).
    result = run_cookiecutter(tmp_path, backbone="timm/vit_tiny_patch16_224")
    assert result.returncode == 0, result.stderr
    assert "note: timm/vit_tiny_patch16_224 was made for 224-pixel images, and image_size is 64: fit" in result.stdout
    assert "note: timm/" not in run_cookiecutter(tmp_path / "224", backbone="timm/vit_tiny_patch16_224",
                                                 image_size="224").stdout  # fmt: skip


def test_good_answers_render(tmp_path):
    result = run_cookiecutter(tmp_path, project_name="Leaf Disease", accelerator="gpu", devices="8", strategy="ddp")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "leaf-disease/src/leaf_disease/cli.py").is_file()


def test_the_hooks_backbone_list_is_torchvisions():
    torchvision = pytest.importorskip("torchvision")
    assert hook_constant("TORCHVISION_CLASSIFIERS") == set(torchvision.models.list_models(module=torchvision.models)), (
        "update TORCHVISION_CLASSIFIERS in hooks/pre_gen_project.py to this torchvision's list_models()"
    )


def test_the_hooks_image_sides_are_those_torchvisions_models_take():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")

    def takes(name: str, side: int) -> bool:
        model = torchvision.models.get_model(name, weights=None, num_classes=2).eval()
        try:
            with torch.no_grad():
                model(torch.zeros(1, 3, side, side))
        except (RuntimeError, ValueError, AssertionError):
            return False
        return True

    names = sorted(hook_constant("TORCHVISION_CLASSIFIERS"))
    for prefix, side in hook_constant("ONE_SIDE").items():
        name = next(name for name in names if name.startswith(prefix))
        assert takes(name, side) and not takes(name, side - 32) and not takes(name, side + 32), name
    for prefix, side in hook_constant("SMALLEST_SIDE").items():
        name = next(name for name in names if name.startswith(prefix))
        assert takes(name, side) and not takes(name, side - 1), name


def test_every_library_a_render_imports_is_a_refused_package_name(full_project):
    # A package named timm or matplotlib imported itself in place of the library.
    local = {path.stem for path in full_project.glob("tests/*.py")} | {path.name for path in full_project.glob("src/*")}
    imported = set()
    for path in full_project.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.partition(".")[0])
    # And what those import in turn: a package named fsspec or tqdm broke Lightning's own imports.
    package = next(path.name for path in full_project.glob("src/*"))
    every_module = (
        "import importlib, pkgutil, sys, wandb, torch.utils.tensorboard\n"
        f"import {package}\n"
        f"for module in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(module.name)\n"
        "print(' '.join(sorted({name.partition('.')[0] for name in sys.modules})))"
    )
    result = run_bounded(
        [sys.executable, "-c", every_module], 300, cwd=full_project, env=os.environ | {"PYTHONPATH": "src"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    imported |= {name for name in result.stdout.split() if not name.startswith("_") and name != "cython_runtime"}
    libraries = imported - local - set(sys.stdlib_module_names)
    assert libraries - hook_constant("TAKEN_NAMES") == set(), "add them to TAKEN_NAMES in hooks/pre_gen_project.py"


def test_a_package_named_as_a_folder_that_git_ignores_stays_in_git(tmp_path):
    # `data` (the name a project called Data gets) matched .gitignore's data/: no module was committed.
    result = run_cookiecutter(tmp_path, project_name="Data")
    assert result.returncode == 0, result.stderr
    project = tmp_path / "data"
    ignored = ["git", "check-ignore", "--no-index", "-q"]
    assert subprocess.run([*ignored, "src/data/__init__.py"], cwd=project).returncode == 1
    assert subprocess.run([*ignored, "data/shapes/train/a.png"], cwd=project).returncode == 0


FAKE_TORCHVISION_MODELS = {
    "newer": "def list_models(module):\n    return ['resnet18', 'brand_new_net']\n",
    "broken": "raise ImportError('no torch here')\n",
}


@pytest.mark.parametrize(("torchvision", "backbone", "accepted"), [
    ("newer", "brand_new_net", True),  # a model our list does not know yet, in the torchvision at hand
    ("newer", "not_a_model", False),
    ("broken", "resnet18", True),  # no usable torchvision: the list decides
    ("broken", "brand_new_net", False),
])  # fmt: skip
def test_a_backbone_our_list_lacks_is_looked_up_in_torchvision(tmp_path, torchvision, backbone, accepted):
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "models.py").write_text(FAKE_TORCHVISION_MODELS[torchvision])
    out = tmp_path / "out"
    result = run_cookiecutter(out, env=os.environ | {"PYTHONPATH": str(fake.parent)}, backbone=backbone)
    assert (result.returncode == 0) is accepted, result.stderr
    assert (out / "image-classifier/configs/default.yaml").is_file() is accepted


def test_answers_with_quotes_and_backslashes_reach_the_project_intact(tmp_path):
    # The hooks read the answers as JSON in a raw string; the project quotes them for TOML and Python.
    description = "Triple \"\"\" and single ''' quotes, a back\\slash and a trailing one\\"
    author = 'Ann "the Annotator" O\\Brien'
    result = run_cookiecutter(tmp_path, project_name='Say "Hi" \\ there', description=description, author_name=author)
    assert result.returncode == 0, result.stderr
    project = tmp_path / "say-hi-there"
    metadata = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert metadata["description"] == description and metadata["authors"] == [{"name": author}]
    assert ast.get_docstring(ast.parse((project / "src/say_hi_there/__init__.py").read_text())) == description


def test_a_template_given_by_a_relative_path_still_checks_the_hardware(tmp_path):
    # cookiecutter's _repo_dir is then relative to where it started, not to the hook's folder.
    args = ["accelerator=cpu", "precision=16-mixed", *(f"{key}={value}" for key, value in QUIET.items())]
    command = [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(tmp_path), TEMPLATE.name, *args]
    result = run_bounded(command, 120, cwd=TEMPLATE.parent, env=os.environ | {"PWD": str(TEMPLATE.parent)})
    assert result.returncode != 0 and "16-mixed is float16 autocast for GPUs" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_post_generation_hook_stays_short():
    # Its work beyond removing files is the project's own (scripts/make_env.py), which users rerun.
    assert len((TEMPLATE / "hooks" / "post_gen_project.py").read_text().splitlines()) <= 120
