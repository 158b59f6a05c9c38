"""An override of a key the config does not have: one line naming the closest key that exists.

Hydra itself refuses ``balance.kernal=x`` while composing (the schema makes the config strict,
:mod:`grab_exp.runner.config.schema`), but its hint is ``+balance.kernal=x``, which would add the
typo as a new key. :func:`unknown_key_error` returns ``<key>: no such key; did you mean
<closest>?`` instead (``difflib`` over every key of the composed config). A command whose keys
are all known without composing (the schema's, or a key of some option of its group) costs no
composition of its own: Hydra composes the job's config, and nothing else does.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator
from dataclasses import fields

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from grab_exp.runner.config.schema import RunConfig, register_schema
from grab_exp.runner.rundir.identity import CONF_DIR
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


def compose_config(overrides: list[str], *, hydra: bool = False) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, as ``python -m grab_exp`` composes a job.

    Args:
        overrides: Hydra overrides of one job (``balance=mean``, ``batch_size=16``).
        hydra: also return the ``hydra`` node (launcher, sweeper, runtime choices).
    """
    register_resolvers()
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=hydra)
    finally:
        GlobalHydra.instance().clear()


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


@functools.cache
def known_keys() -> frozenset[str]:
    """Every key a job's config may have, known without composing: the schema's, and for each
    group node (``model``, ``balance``...) the keys of any of its options (shared files
    included)."""
    keys = set(dotted_keys(OmegaConf.to_container(OmegaConf.structured(RunConfig))))
    for group in (f.name for f in fields(RunConfig) if (CONF_DIR / f.name).is_dir()):
        for path in (CONF_DIR / group).glob("*.yaml"):
            option = OmegaConf.load(path)
            for entry in option.pop("defaults", []):
                if isinstance(entry, str) and entry.startswith("/"):
                    option.merge_with(OmegaConf.load(CONF_DIR / f"{entry[1:].split('@')[0]}.yaml"))
            keys.update(f"{group}.{key}" for key in dotted_keys(OmegaConf.to_container(option)))
    return frozenset(keys)


def unknown_key_error(argv: list[str]) -> str | None:
    """The one line for an override of a key that the composed config lacks, else ``None``.

    Composes only when the command sets a key that no option has (:func:`known_keys`); a key of
    another option than the chosen one is left to Hydra, as is any other problem.
    """
    overrides = _overrides(argv)
    plain = [o for o in overrides if o.type == OverrideType.CHANGE and o.package is None]
    groups = _groups()
    keys = {o.key_or_group for o in plain if o.key_or_group.split("/")[0] not in groups}
    if not {k for k in keys if k.split(".")[0] != "hydra"} - known_keys():
        return None
    jobs = [_one_job(o) for o in overrides if not o.key_or_group.startswith("hydra")]
    try:
        compose_config(jobs)
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
        return closest_key_line(key, compose_config(rest))
    except (HydraException, OmegaConfBaseException):
        return f"{key}: no such key"
