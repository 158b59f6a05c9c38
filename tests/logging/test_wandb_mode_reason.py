"""The offline line says why W&B is offline: the mode set, WANDB_MODE, or no API key."""

from __future__ import annotations

import pytest

from grab_exp.logging.wandb_mode import mode_reason, resolve_mode


@pytest.mark.parametrize(
    ("mode", "env", "resolved", "reason"),
    [
        ("offline", None, "offline", "logger.wandb.mode=offline"),
        ("auto", "offline", "offline", "WANDB_MODE=offline"),
        ("auto", None, "offline", "logger.wandb.mode=auto and no W&B API key configured"),
    ],
)
def test_the_reason_matches_how_the_mode_resolved(
    mode, env, resolved, reason, monkeypatch, tmp_path
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    assert resolve_mode(mode) == resolved
    assert mode_reason(mode) == reason
