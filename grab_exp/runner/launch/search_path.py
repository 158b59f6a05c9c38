"""A user's config folders (``--config-dir``) and ours: theirs first, and the options they choose.

Hydra searches the folder of ``--config-dir`` after the application's own (``pkg://grab_exp.conf``),
so a user's ``model/lenet.yaml`` would lose to ours without a word. :func:`user_dirs_first` puts
each user folder before ours (Hydra's ``SearchPathPlugin``, ``hydra_plugins/grab_exp_plugins``):
the user's file of a name wins. :func:`unknown_option_error` refuses ``group=option`` for an
option that no folder holds, in one line with the options and the closest one, before Hydra's
block, and :func:`unparsable_yaml_error` a file of theirs that is not YAML
(:func:`grab_exp.runner.config.user_dirs.replaced_options` names the user files that
replace ours, for the job's line).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.override_parser.types import OverrideType

from grab_exp.conf import CONF_DIR
from grab_exp.runner.config.user_dirs import group_options
from grab_exp.runner.launch.override_keys import _overrides, config_dirs

#: our configs' places in Hydra's search path: the command's, and the key check's composition
OURS = ("pkg://grab_exp.conf", f"file://{CONF_DIR}", str(CONF_DIR))


def user_dirs_first(search_path: ConfigSearchPath, argv: list[str]) -> None:
    """Put the config folders of ``argv`` (``--config-dir``) before ours in ``search_path``
    (only for ``python -m grab_exp``, whose search path holds ours)."""
    ours = [element.path for element in search_path.get_path() if element.path in OURS]
    for folder in config_dirs(argv) if ours else ():
        path = f"file://{os.path.abspath(folder)}"
        search_path.prepend("command-line", path, anchor=SearchPathQuery(path=ours[0]))


def _option_line(group: str, value: str, options: list[str]) -> str:
    allowed = f"allowed: {', '.join(options)}"
    lowered = [o for o in options if o.lower() == value.lower()]
    close = lowered or difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    hint = f"did you mean {group}={close[0]}? " if close else ""
    return f"{group}={value}: no such option; {hint}{allowed}"


def _searched_folders(argv: list[str]) -> list[Path] | None:
    """The folders ``argv`` adds to the search path (``--config-dir``, and the ``file://``
    entries of a ``hydra.searchpath=[...]`` override); ``None`` if it adds one that is not a
    folder (``pkg://...``), whose options only Hydra can list."""
    folders = [Path(folder) for folder in config_dirs(argv)]
    for override in _overrides(argv):
        if override.key_or_group != "hydra.searchpath":
            continue
        entries = override.value()
        for entry in entries if isinstance(entries, list) else [entries]:
            if not str(entry).startswith("file://"):
                return None
            folders.append(Path(str(entry).removeprefix("file://")))
    return folders


def unknown_option_error(argv: list[str]) -> str | None:
    """One line for a ``group=option`` (or a sweep's ``group=a,b``) that names no option of
    the group in our folder or a folder ``argv`` adds (``--config-dir``, ``hydra.searchpath``);
    ``None`` when every one exists, or when ``argv`` adds a search path entry that is not a
    folder (Hydra then says it)."""
    folders = _searched_folders(argv)
    if folders is None:
        return None
    groups = {p.name for f in (CONF_DIR, *folders) if f.is_dir() for p in f.iterdir() if p.is_dir()}
    groups.discard("hydra")
    for override in _overrides(argv):
        group = override.key_or_group
        if override.type == OverrideType.DEL or group not in groups or override.package:
            continue
        values = (
            list(override.sweep_string_iterator())
            if override.is_sweep_override()
            else [override.value()]
        )
        options = group_options(group, folders)
        for value in values:
            if isinstance(value, str) and value not in options and value != "null":
                return _option_line(group, value, options)
    return None


def missing_config_dir_error(argv: list[str]) -> str | None:
    """One line for a ``--config-dir`` of ``argv`` that is not a folder (Hydra's is 3 lines)."""
    for folder in config_dirs(argv):
        if not Path(folder).is_dir():
            why = "is a file" if Path(folder).exists() else "no such folder"
            return (
                f"--config-dir {folder}: {why} ({Path(folder).absolute()}); allowed: a folder "
                "of config groups (relative to the folder the command runs in)"
            )
    return None


def unparsable_yaml_error(argv: list[str]) -> str | None:
    """One line for the first ``.yaml`` of a ``--config-dir`` of ``argv`` that is not YAML:
    the file, the line and the parser's problem (Hydra's is a traceback of ~90 lines)."""
    for folder in config_dirs(argv):
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                where = f", line {mark.line + 1}" if mark is not None else ""
                problem = getattr(error, "problem", None) or str(error).splitlines()[0]
                context, start = (
                    getattr(error, "context", None),
                    getattr(error, "context_mark", None),
                )
                if context and start is not None:
                    context = f"{context} from line {start.line + 1}"
                return f"{path}{where}: not YAML ({problem}{f', {context}' if context else ''})"
    return None
