"""Every command, option and file the README and docs/ name exists."""

import re
import subprocess
import sys

import pytest
import yaml
from conftest import PROJECT_ROOT, command_env

from {{ cookiecutter.package_name }}.cli import SUBCOMMANDS, TOOLS, main

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
TEXT = {path.name: path.read_text() for path in DOCS}
COMMAND = re.compile(r"python -m {{ cookiecutter.package_name }} (\w+)((?: [^\s`#|]+)*)")
# The parser's own options, which no config holds.
PARSER_OPTIONS = {"config", "print_config", "help"}
{%- if cookiecutter.tuning == "yes" or cookiecutter.experiments == "yes" %}
# Files the commands write, which a new project lacks: configs/tuned.yaml, the measured or searched options.
WRITTEN = {"configs/tuned.yaml"}
{%- else %}
# Files the commands write, which a new project lacks.
WRITTEN: set[str] = set()
{%- endif %}


def named_commands() -> dict[str, set[str]]:
    """Each command the docs run, with the options they give it."""
    found: dict[str, set[str]] = {}
    for text in TEXT.values():
        for command, rest in COMMAND.findall(text):
            found.setdefault(command, set()).update(re.findall(r"--([\w.]+)", rest))
    return found


def option_exists(config: dict, dotted: str) -> bool:
    """Whether the resolved config holds `dotted` (a class's arguments may sit under init_args)."""
    node = config
    for key in dotted.split("."):
        if isinstance(node, dict) and key not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


@pytest.fixture(scope="module")
def resolved_config() -> dict:
    done = subprocess.run([sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--print_config"],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, env=command_env(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {"fit": yaml.safe_load(done.stdout)}


def test_every_command_the_docs_run_exists():
    commands = named_commands()
    assert {"fit", "doctor"{{ ", \"classify\", \"export\"" if cookiecutter.inference == "yes" }}} <= commands.keys()
    unknown = commands.keys() - {*SUBCOMMANDS, *TOOLS}
    assert not unknown, f"the docs run commands the project lacks: {unknown}"


def test_every_dotted_option_the_docs_name_is_in_the_config(resolved_config):
    config = resolved_config["fit"]
    dotted = {option for text in TEXT.values() for option in re.findall(r"--((?:trainer|model|data)\.[\w.]+)", text)}
    assert dotted, "the docs name no option"
    missing = sorted(option for option in dotted if not option_exists(config, option))
    assert not missing, f"options the docs name that fit does not have: {missing}"


@pytest.mark.parametrize("command", sorted(set(TOOLS) & set(named_commands())))
def test_every_option_the_docs_give_a_tool_is_in_its_help(monkeypatch, capsys, command):
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", command, "--help"])
    with pytest.raises(SystemExit):
        main()
    helped = capsys.readouterr().out
    given = {option for option in named_commands()[command] if "." not in option} - PARSER_OPTIONS
    missing = sorted(option for option in given if f"--{option}" not in helped)
    assert not missing, f"`{command}` has no option {missing}"


def test_every_file_the_docs_link_or_name_exists():
    for name, text in TEXT.items():
        folder = PROJECT_ROOT if name == "README.md" else PROJECT_ROOT / "docs"
        for link in re.findall(r"\]\(([\w./-]+\.md)\)", text):
            assert (folder / link).is_file(), f"{name} links to {link}, which does not exist"
        for path in set(re.findall(r"`((?:scripts|configs|src|tests)/[\w./-]+\.\w+)`", text)) - WRITTEN:
            assert (PROJECT_ROOT / path).exists(), f"{name} names {path}, which does not exist"


def test_the_readme_is_a_landing_page():
    assert len(TEXT["README.md"].splitlines()) <= 120, "move long sections to docs/"
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", TEXT["README.md"]))
    assert linked == {path.name for path in DOCS[1:]}, "the README links every page of docs/"
