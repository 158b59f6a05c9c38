"""The options of a config group across our folder and a user's, and the user's files that
replace ours (``--config-dir``; their folders come first in the search path:
:mod:`grab_exp.runner.launch.search_path`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from grab_exp.conf import CONF_DIR


def group_options(group: str, folders: Iterable[Path]) -> list[str]:
    """The options of ``group``: the ``.yaml`` files of ``conf/<group>`` and of each folder's."""
    found = {p.stem for f in (CONF_DIR, *folders) for p in (f / group).glob("*.yaml")}
    return sorted(found)


def replaced_options(choices: Mapping[str, str | None], sources: Iterable[Mapping]) -> list[str]:
    """The user's files among the job's ``choices`` that replace ours of the same name
    (``<folder>/<group>/<option>.yaml``), from Hydra's ``runtime.config_sources``."""
    folders = [
        Path(s["path"])
        for s in sources
        if s["provider"] == "command-line" and s["schema"] == "file"
    ]
    replaced = []
    for group, option in choices.items():
        if option is None or group.startswith("hydra") or "/" in str(option):
            continue
        if not (CONF_DIR / group / f"{option}.yaml").is_file():
            continue
        for folder in folders:
            if (folder / group / f"{option}.yaml").is_file():
                replaced.append(str(folder / group / f"{option}.yaml"))
                break
    return list(dict.fromkeys(replaced))
