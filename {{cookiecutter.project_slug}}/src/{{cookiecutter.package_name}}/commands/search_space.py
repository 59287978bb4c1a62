"""A sweep's search space, read from YAML and checked against `fit`'s parser before any trial runs.

Each key is a `fit` option; each value a range or a list of choices:

    model.lr: {low: 1.0e-4, high: 1.0e-2, log: true}   # a float range, searched on a log scale
    data.batch_size: {low: 32, high: 128, step: 32}     # whole numbers in steps
    data.augment: [basic, trivialaugment]               # choices
"""

import contextlib
import difflib
from pathlib import Path

import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from ..cli import resolved_config
from ..errors import ConfigError, MissingError
from .experiment_runs import leaf_values, option

RANGE_KEYS = {"low", "high", "log", "step"}
FORMS = "a range {low: 0.001, high: 0.1, log: true} (step: for a grid) or a list of choices [basic, trivialaugment]"


def read_search_space(path: Path, cli_args: list[str], config: dict) -> dict[str, BaseDistribution]:
    """The distribution of each option in the file at `path`, every bound and choice of which `fit`
    accepts with the options `cli_args`, which resolve to `config` (cli.resolved_config)."""
    if not path.is_file():
        raise MissingError(f"No search space at {path}: write one (see configs/sweep.yaml).")
    try:
        space = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {getattr(error, 'problem', None) or error}") from None
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{path} must map fit options (model.lr, ...) each to {FORMS}")
    options = list(leaf_values(config))
    distributions = {}
    for key, values in space.items():
        if key not in options:
            close = difflib.get_close_matches(str(key), options, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else "`fit --print_config` lists them."
            raise ConfigError(f"{path}: {key} is no fit option (or a group of them): {hint}")
        distributions[key] = distribution(f"{path}: {key}", values)
    check_values(path, distributions, cli_args)
    return distributions


def distribution(where: str, values) -> BaseDistribution:
    if isinstance(values, list):
        if not values or not all(value is None or isinstance(value, (str, int, float, bool)) for value in values):
            raise ConfigError(f"{where}: a list of choices holds one or more plain values (text, numbers, true/false)")
        return CategoricalDistribution(values)
    if not isinstance(values, dict) or not {"low", "high"} <= values.keys() or values.keys() - RANGE_KEYS:
        raise ConfigError(f"{where}: {values!r} is no search range; write {FORMS}")
    low, high = number(where, values["low"]), number(where, values["high"])
    log, step = values.get("log", False), None if values.get("step") is None else number(where, values["step"])
    numbers = [value for value in (low, high, step) if value is not None]
    if not isinstance(log, bool):  # "no" would be taken as true
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high})")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}: step must be above 0, got {step} (leave it out for no grid)")
    if log and (low <= 0 or step is not None):
        raise ConfigError(f"{where}: a log range needs low above 0 and no step")
    if all(isinstance(value, int) for value in numbers):
        return IntDistribution(low, high, log=log, step=step or 1)
    return FloatDistribution(low, high, log=log, step=step)


def number(where: str, value) -> int | float:
    if isinstance(value, str):  # YAML reads 1e-4 (no dot) as text
        with contextlib.suppress(ValueError):
            return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: low, high and step must be numbers, got {value!r}")
    return value


def check_values(path: Path, distributions: dict[str, BaseDistribution], cli_args: list[str]) -> None:
    """Parse the configuration with the bounds and each choice of every option, as few times as the
    longest list of them: the parser names the option and the value it refuses."""
    candidates = {key: bounds(dist) for key, dist in distributions.items()}
    for round_ in range(max(len(values) for values in candidates.values())):
        trial = [option(key, values[round_ % len(values)]) for key, values in candidates.items()]
        try:
            resolved_config([*cli_args, *trial])
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None


def bounds(dist: BaseDistribution) -> list:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]
