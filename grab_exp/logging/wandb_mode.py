"""W&B mode resolution: ``auto`` picks online or offline from the configured credentials."""

from __future__ import annotations

import os

from grab_exp.validation import check_choice

MODES = ("auto", "online", "offline", "disabled")
DEFAULT_BASE_URL_ENV = "WANDB_BASE_URL"


def api_key_configured() -> bool:
    """Whether a W&B API key is configured: ``WANDB_API_KEY``, or a netrc entry for the host.

    The netrc lookup uses W&B's own reader (``wandb.sdk.lib.wbauth.read_netrc_auth``, which
    honours ``NETRC`` and ``WANDB_BASE_URL``); any problem there counts as "no key".
    """
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import wandb
        from wandb.sdk.lib import wbauth

        host = os.environ.get(DEFAULT_BASE_URL_ENV) or wandb.Settings().base_url
        return bool(wbauth.read_netrc_auth(host=host))
    except Exception:
        return False


def resolve_mode(mode: str) -> str:
    """Validate ``mode`` and turn ``auto`` into ``online``/``offline``/``disabled``.

    ``auto`` follows ``WANDB_MODE`` when it is set to online, offline or disabled; otherwise it
    is ``online`` when an API key is configured (:func:`api_key_configured`) and ``offline``
    when not.

    Raises:
        ValueError: ``mode`` is not auto, online, offline or disabled (the message names
            ``logger.wandb.mode``).
    """
    check_choice("logger.wandb.mode", mode, MODES)
    if mode != "auto":
        return mode
    env_mode = os.environ.get("WANDB_MODE", "")
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    return "online" if api_key_configured() else "offline"


def mode_reason(mode: str) -> str:
    """Why ``mode`` resolves as it does, in words (for the log line of an offline run)."""
    if mode != "auto":
        return f"logger.wandb.mode={mode}"
    env_mode = os.environ.get("WANDB_MODE", "")
    if env_mode in ("online", "offline", "disabled"):
        return f"WANDB_MODE={env_mode}"
    return "logger.wandb.mode=auto and no W&B API key configured"
