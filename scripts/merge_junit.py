"""``python scripts/merge_junit.py OUT.xml IN.xml...``: pytest's junit XML files as one.

Each input's ``<testsuite>`` elements go under one ``<testsuites>``; an unreadable input (a
check killed while writing it) becomes a ``<testsuite>`` with one error naming the file, so the
merged file always parses. Used by ``scripts/gpu_check.sh`` (its ``$OUT`` holds at most 8 files).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def suites(path: Path) -> list[ET.Element]:
    """The ``<testsuite>`` elements of one junit XML file (one error suite if it is damaged)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        suite = ET.Element("testsuite", name=path.stem, tests="1", errors="1")
        case = ET.SubElement(suite, "testcase", classname=path.stem, name="junit_xml")
        ET.SubElement(case, "error", message=f"{path.name} unreadable: {error}")
        return [suite]
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def main(out: str, *inputs: str) -> None:
    merged = ET.Element("testsuites")
    for path in inputs:
        if Path(path).is_file():  # an unmatched glob stays a literal pattern
            merged.extend(suites(Path(path)))
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
