"""An override of a key the config does not have: one line naming the closest key that exists.

Hydra itself refuses ``balance.kernal=x`` while composing (the schema makes the config strict,
:mod:`grab_exp.runner.config.schema`), but its hint is ``+balance.kernal=x``, which would add the
typo as a new key. :func:`unknown_key_error` returns ``<key>: no such key; did you mean
<closest>?`` instead (``difflib`` over every key of the composed config). A command whose keys
are all known without composing (the schema's, or a key of the option its group takes, read from
``conf/``) costs no composition of its own: Hydra composes the job's config, nothing else does.
"""

from __future__ import annotations

import difflib
import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode

from grab_exp.runner.config.schema import RANGES, RunConfig, register_schema
from grab_exp.runner.rundir.identity import CONF_DIR, conf_choices
from grab_exp.runner.rundir.resolvers import register_resolvers


def _overrides(argv: list[str]) -> list[Override]:
    """The command line's overrides (options such as ``-m`` or ``--cfg job`` left out)."""
    words = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        return OverridesParser.create().parse_overrides(words)
    except HydraException:
        return []  # Hydra reports a malformed override itself


def _one_job(override: Override) -> str:
    """The override with a sweep (``a,b``) replaced by its first value: one job's config."""
    if override.is_sweep_override():
        first = next(iter(override.sweep_string_iterator()))
        return f"{override.get_key_element()}={first}"
    return override.input_line


def _groups() -> set[str]:
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def compose_config(
    overrides: list[str], *, hydra: bool = False, config_dirs: Sequence[str] = ()
) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, as ``python -m grab_exp`` composes a job.

    Args:
        overrides: Hydra overrides of one job (``balance=mean``, ``batch_size=16``).
        hydra: also return the ``hydra`` node (launcher, sweeper, runtime choices).
        config_dirs: a user's config folders (``--config-dir``), searched before ours.
    """
    register_resolvers()
    register_schema()
    if config_dirs:
        paths = ",".join(f"file://{Path(d).resolve()}" for d in config_dirs)
        overrides = [*overrides, f"hydra.searchpath=[{paths}]"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=hydra)
    finally:
        GlobalHydra.instance().clear()


def config_dirs(argv: list[str]) -> list[str]:
    """The config folders a command line adds (``--config-dir DIR``, ``-cd DIR``)."""
    found = [a.split("=", 1)[1] for a in argv if a.startswith("--config-dir=")]
    pairs = itertools.pairwise(argv)
    return found + [value for flag, value in pairs if flag in ("--config-dir", "-cd")]


def dotted_keys(node: object, prefix: str = "") -> Iterator[str]:
    """Every key of a nested container as a dotted path (``_target_``-style keys left out)."""
    for key, value in node.items() if isinstance(node, dict) else ():
        if str(key).startswith("_"):
            continue
        path = f"{prefix}{key}"
        yield path
        yield from dotted_keys(value, path + ".")


def closest_key_line(key: str, cfg: DictConfig) -> str:
    """``<key>: no such key; did you mean <closest>?`` (or the keys of its parent node)."""
    keys = list(dotted_keys(OmegaConf.to_container(cfg, resolve=False)))
    parent = key.rpartition(".")[0]
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    others = [k for k in keys if not key.startswith(k + ".")]  # not the key's own parents
    for candidates in (siblings, others):
        if close := difflib.get_close_matches(key, candidates, n=1, cutoff=0.6):
            return f"{key}: no such key; did you mean {close[0]}?"
    return f"{key}: no such key; allowed: {', '.join(siblings)}"


#: the presets that choose other groups' options, in the order their choices apply
PRESETS = ("experiment", "arm", "row")


def chosen_options(choices: dict[str, str]) -> dict[str, str]:
    """Each group's option as Hydra's defaults pick it, read from ``conf/``: the root config's,
    then those of the presets picked (an experiment may pick an arm), then ``choices``, the
    command's own group choices, which win."""
    chosen = conf_choices("config")
    for preset in PRESETS:
        option = choices.get(preset, chosen.get(preset))
        if option is not None and (CONF_DIR / preset / f"{option}.yaml").is_file():
            chosen.update(conf_choices(f"{preset}/{option}"))
    return {**chosen, **choices}


@functools.cache
def _option_keys(group: str, option: str) -> frozenset[str]:
    """The dotted keys of ``conf/<group>/<option>.yaml``, shared files it includes at its own
    package (``/file@_here_``) merged; a key another include adds stays unknown (composed)."""
    node = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    for entry in node.pop("defaults", []):
        if isinstance(entry, str) and entry.startswith("/") and entry.endswith("@_here_"):
            node.merge_with(OmegaConf.load(CONF_DIR / f"{entry[1:].split('@')[0]}.yaml"))
    return frozenset(f"{group}.{key}" for key in dotted_keys(OmegaConf.to_container(node)))


def known_keys(choices: dict[str, str]) -> frozenset[str]:
    """The keys of the job's config known without composing it: the schema's, and those of the
    option each group node (``model``, ``balance``...) takes (:func:`chosen_options`). A key
    missing here is only composed for, never refused."""
    keys = set(dotted_keys(OmegaConf.to_container(OmegaConf.structured(RunConfig))))
    chosen = chosen_options(choices)
    for group in (f.name for f in fields(RunConfig) if f.name in chosen):
        if (CONF_DIR / group / f"{chosen[group]}.yaml").is_file():
            keys |= _option_keys(group, chosen[group])
    return frozenset(keys)


def unknown_key_error(argv: list[str]) -> str | None:
    """The one line for an override of a key that the composed config lacks, else ``None``.

    Composes only when the command sets a key that :func:`known_keys` does not know; any other
    problem is left to Hydra and the validation.
    """
    overrides = _overrides(argv)
    plain = [o for o in overrides if o.type == OverrideType.CHANGE and o.package is None]
    jobs = [_one_job(o) for o in overrides if not o.key_or_group.startswith("hydra")]
    dirs = config_dirs(argv)
    compose_job = functools.partial(compose_config, config_dirs=dirs)
    groups = _groups()
    choices = {
        o.key_or_group: _one_job(o).split("=", 1)[1] for o in plain if o.key_or_group in groups
    }
    keys = {o.key_or_group for o in plain if o.key_or_group.split("/")[0] not in groups}
    if not {k for k in keys if k.split(".")[0] != "hydra"} - known_keys(choices):
        return None
    try:
        compose_job(jobs)
        return None
    except HydraException as error:
        cause = error.__cause__
        if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not cause.full_key:
            return None
        key = cause.full_key
    except OmegaConfBaseException:
        return None
    rest = [j for j in jobs if j.split("=", 1)[0] != key]
    try:
        return closest_key_line(key, compose_job(rest))
    except (HydraException, OmegaConfBaseException):
        return f"{key}: no such key"


#: the schema's kind of value, by its node's type, for a key without a range
KINDS = ((BooleanNode, "true or false"), (IntegerNode, "an integer"), (FloatNode, "a number"))


def _allowed(key: str, schema: DictConfig) -> str:
    """What ``key`` of the schema takes: ``an integer >= 1`` for a key with a range."""
    if key in RANGES:
        kind, comparison, bound = RANGES[key]
        return f"{kind} {comparison} {bound:g}"
    parent, _, leaf = key.rpartition(".")
    node = (OmegaConf.select(schema, parent) if parent else schema)._get_node(leaf)
    return next((kind for cls, kind in KINDS if isinstance(node, cls)), "a value of its type")


def wrong_type_error(argv: list[str]) -> str | None:
    """``<key>: got <value>; allowed: <kind>`` for an override whose value the typed schema
    (:class:`~grab_exp.runner.config.schema.RunConfig`) cannot take (``epochs=abc``), else
    ``None``: Hydra's own refusal is a block of five lines."""
    schema, groups = OmegaConf.structured(RunConfig), _groups()
    for override in _overrides(argv):
        if override.type != OverrideType.CHANGE or override.package is not None:
            continue
        key = override.key_or_group
        node = OmegaConf.select(schema, key, default=_MISSING)
        if node is _MISSING or OmegaConf.is_config(node) or key in groups:
            continue  # not a value of the schema (a group's option, its key, hydra.*)
        if not override.is_sweep_override():
            values = [override.value()]
        elif override.is_discrete_sweep():
            values = list(override.sweep_iterator())
        else:
            continue
        for value in values:
            try:
                OmegaConf.update(schema.copy(), key, value, merge=True)
            except OmegaConfBaseException:
                return f"{key}: got {value!r}; allowed: {_allowed(key, schema)}"
    return None


_MISSING = object()
