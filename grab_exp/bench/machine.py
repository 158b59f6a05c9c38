"""A description of the machine a benchmark ran on, and the benchmarks' JSON files."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_machine(device: torch.device) -> dict:
    """CPU, core count, torch threads and version, the GPU name when on CUDA, and the load.

    ``load_avg_1m`` (the 1-minute load average when the benchmark started, where the platform
    has one) shows whether other work shared the machine: near 0 on an idle one.
    """
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return info


def write_report(path: str | Path, report: dict) -> None:
    """Write a benchmark's report as indented JSON, creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
