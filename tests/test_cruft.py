"""Template updates with cruft: create, check, update, and linking a project made by cookiecutter."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import CAPABILITY_FILES, TEMPLATE, render, run_bounded

CRUFT = str(Path(sys.executable).parent / "cruft")
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}
# As a person runs it: no CI variable, no forced setup; stdin is not a terminal in any case.
ENV = {k: v for k, v in os.environ.items() if k not in ("CI", "LIGHTNING_TEMPLATE_SETUP")} | GIT_IDENTITY


def run(*command: str, cwd: Path, status: int = 0) -> str:
    result = run_bounded(command, 300, cwd=cwd, env=ENV, stdin=subprocess.DEVNULL)
    assert result.returncode == status, f"{command}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def commit_all(repo: Path, message: str) -> None:
    run("git", "add", "-A", cwd=repo)
    run("git", "commit", "-q", "-m", message, cwd=repo)


@pytest.fixture
def template_repo(tmp_path) -> Path:
    """This template's files, tracked and new, as the first commit of a repository cruft can clone."""
    repo = tmp_path / "template"
    copy_this_template(repo)
    run("git", "init", "-q", cwd=repo)
    commit_all(repo, "template")
    return repo


def copy_this_template(repo: Path) -> None:
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=TEMPLATE)
    for name in filter(None, listed.split("\0")):
        if (TEMPLATE / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TEMPLATE / name, repo / name)


def project_files(project: Path) -> dict[str, bytes]:
    skip = {".git", ".cruft.json"}
    return {str(path.relative_to(project)): path.read_bytes() for path in project.rglob("*")
            if path.is_file() and not skip & set(path.relative_to(project).parts)}  # fmt: skip


def test_update_brings_template_changes_and_keeps_the_users_work(tmp_path, template_repo):
    answers = {"logger": "csv", "setup_env": "uv", "smoke_test": "yes"}
    created = run(CRUFT, "create", "--no-input", str(template_repo), "--output-dir", str(tmp_path),
                  "--extra-context", json.dumps(answers), cwd=tmp_path)  # fmt: skip
    project = tmp_path / "image-classifier"
    assert "git add .cruft.json && git commit" in created
    staged = run("git", "status", "--porcelain", cwd=project).splitlines()
    assert "?? .cruft.json" in staged and "A  pyproject.toml" in staged
    commit_all(project, "New project")  # with the .cruft.json written after the hook
    run(CRUFT, "check", cwd=project)

    # The template raises the epochs; the user, meanwhile, changed the logging interval in the same file.
    template_config = template_repo / "{{cookiecutter.project_slug}}" / "configs" / "default.yaml"
    template_config.write_text(template_config.read_text().replace("max_epochs: 20", "max_epochs: 30", 1))
    (template_repo / "{{cookiecutter.project_slug}}" / "NOTICE.md").write_text("A file new in the template.\n")
    commit_all(template_repo, "More epochs; a notice")
    project_config = project / "configs" / "default.yaml"
    project_config.write_text(project_config.read_text().replace("log_every_n_steps: 10", "log_every_n_steps: 5", 1))
    commit_all(project, "Log more often")
    assert "out of date" in run(CRUFT, "check", cwd=project, status=1)

    updated = run(CRUFT, "update", "--skip-apply-ask", cwd=project)
    assert "Rendered into a temporary folder" in updated and "Next:" not in updated
    config = project_config.read_text()
    assert "max_epochs: 30" in config and "log_every_n_steps: 5" in config
    assert (project / "NOTICE.md").read_text() == "A file new in the template.\n"
    assert not (project / ".venv").exists() and not (project / "runs").exists(), "an update ran the setup"
    head = run("git", "rev-parse", "HEAD", cwd=template_repo).strip()
    assert json.loads((project / ".cruft.json").read_text())["commit"] == head
    commit_all(project, "Template update")
    run(CRUFT, "check", cwd=project)


def test_cruft_create_checks_the_hardware_answers_too(tmp_path, template_repo):
    # cruft gives the hooks no _repo_dir: the pre-generation hook finds the template another way.
    answers = {"accelerator": "cpu", "precision": "16-mixed"}
    refused = run(CRUFT, "create", "--no-input", str(template_repo), "--output-dir", str(tmp_path / "out"),
                  "--extra-context", json.dumps(answers), cwd=tmp_path, status=1)  # fmt: skip
    assert "error: precision 16-mixed is float16 autocast for GPUs" in refused, refused
    assert not (tmp_path / "out" / "image-classifier").exists()


def test_a_cookiecutter_project_keeps_its_answers_and_links_to_cruft(tmp_path, template_repo):
    answers = {"project_name": "Défect Spotter 2", "logger": "tensorboard", "strategy": "ddp", "precision": "32-true"}
    project = render(tmp_path, **answers)
    kept = json.loads((project / ".cookiecutter.json").read_text())
    assert {key: kept[key] for key in answers} == answers
    assert not any(key.startswith("_") for key in kept), "private variables are not answers"

    link = [
        CRUFT,
        "link",
        str(template_repo),
        "--no-input",
        "--extra-context",
        (project / ".cookiecutter.json").read_text(),
    ]
    run(*link, cwd=project)
    run(CRUFT, "diff", "--exit-code", cwd=project)  # the template, rendered with the kept answers, is this project


def test_capabilities_left_out_are_added_later_and_the_users_edits_stay(tmp_path, template_repo):
    answers = {"logger": "csv", **dict.fromkeys(CAPABILITY_FILES, "no")}
    run(CRUFT, "create", "--no-input", str(template_repo), "--output-dir", str(tmp_path),
        "--extra-context", json.dumps(answers), cwd=tmp_path)  # fmt: skip
    project = tmp_path / "image-classifier"
    commit_all(project, "New project")
    package = project / "src" / "image_classifier"
    model = package / "model.py"
    model.write_text(model.read_text().replace("lr: float = 2e-3,", "lr: float = 1e-3,", 1))
    commit_all(project, "A lower learning rate")
    assert not (package / "commands" / "serve.py").exists() and not (package / "commands" / "sweep.py").exists()

    added = dict.fromkeys(CAPABILITY_FILES, "yes")
    run(CRUFT, "update", "--skip-apply-ask", "--variables-to-update", json.dumps(added), cwd=project)
    brought = [project / name.format(package=package.name) for answer in added for name in CAPABILITY_FILES[answer]]
    for path in brought:
        assert path.is_file(), f"{path} did not come with its capability"
    assert not list(project.rglob("*.rej")), "a part of the update did not apply"
    for shared in ("backbone.py", "transforms.py"):  # the seams in files both sides have
        assert "from . import timm_backbones" in (package / shared).read_text(), shared
    assert os.access(project / "scripts" / "sweep.sbatch", os.X_OK)
    tools = (package / "cli.py").read_text()
    commands = ("classify", "export", "serve", "sweep", "shard", "tune", "benchmark")
    assert all(f'"{command}": "{command}",' in tools for command in commands)
    pyproject = (project / "pyproject.toml").read_text()
    assert all(name in pyproject for name in ("onnxruntime", "litserve", "optuna", "litdata"))
    readme = (project / "README.md").read_text()
    for command in (
        "| `export CHECKPOINT` |",
        "| `serve` |",
        "| `sweep SPACE` |",
        "| `shard IMAGES OUTPUT` |",
        "`tune lr`, `tune batch_size` |",
    ):
        assert command in readme, command
    assert 'format: Literal["folder", "streaming"]' in (package / "data.py").read_text()
    assert "lr: float = 1e-3," in model.read_text(), "the user's edit was lost"
    kept = json.loads((project / ".cruft.json").read_text())["context"]["cookiecutter"]
    assert {key: kept[key] for key in added} == added


def test_a_project_from_the_previous_template_commit_updates_to_this_template(tmp_path):
    # The previous commit's template, then this checkout's as the next commit (a user's project
    # made last week, updated today), as mila's ResearchTemplate tests every update.
    previous = subprocess.run(["git", "archive", "HEAD~1"], cwd=TEMPLATE, capture_output=True)
    if previous.returncode != 0:
        pytest.skip("a clone without the previous commit (shallow)")
    repo = tmp_path / "template"
    repo.mkdir()
    with tarfile.open(fileobj=io.BytesIO(previous.stdout)) as archive:
        archive.extractall(repo, filter="data")
    run("git", "init", "-q", cwd=repo)
    commit_all(repo, "previous")
    answers = {"logger": "csv", "serving": "yes", "experiments": "yes", "timm": "yes"}
    run(CRUFT, "create", "--no-input", str(repo), "--output-dir", str(tmp_path / "old"),
        "--extra-context", json.dumps(answers), cwd=tmp_path)  # fmt: skip
    project = tmp_path / "old" / "image-classifier"
    commit_all(project, "New project")
    model = project / "src" / "image_classifier" / "model.py"  # the file users edit most
    model.write_text(model.read_text().replace("lr: float = 2e-3,", "lr: float = 1e-3,", 1))
    commit_all(project, "A lower learning rate")
    run("git", "rm", "-q", "-r", ".", cwd=repo)
    copy_this_template(repo)
    commit_all(repo, "this template")

    run(CRUFT, "update", "--skip-apply-ask", cwd=project)
    assert not list(project.rglob("*.rej")), "a part of the update did not apply"
    run(CRUFT, "create", "--no-input", str(repo), "--output-dir", str(tmp_path / "new"),
        "--extra-context", json.dumps(answers), cwd=tmp_path)  # fmt: skip
    updated, fresh = project_files(project), project_files(tmp_path / "new" / "image-classifier")
    assert updated.keys() == fresh.keys()
    assert "lr: float = 1e-3," in model.read_text(), "the user's edit was lost"
    model.write_text(model.read_text().replace("lr: float = 1e-3,", "lr: float = 2e-3,", 1))
    updated = project_files(project)
    assert [name for name in fresh if updated[name] != fresh[name]] == [], "the update differs from a new project"
