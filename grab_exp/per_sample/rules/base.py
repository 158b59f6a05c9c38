"""The rule registry: :class:`LayerRule`, :data:`RULES`, :func:`register_rule`, :func:`rule_for`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.utils import parametrize

__all__ = ["RULES", "LayerRule", "Outs", "register_rule", "rule_for"]

#: Optional tensors to write the per-sample gradients into, one per parameter (or ``None``).
Outs = Sequence[torch.Tensor | None]


class LayerRule:
    """Per-sample gradients of one layer type's own parameters (``param.grad`` is autograd's).

    Attributes:
        has_factors: :meth:`factors` can return a factor form (else it returns ``None``).
    """

    has_factors = False

    def supports(self, layer: nn.Module) -> bool:
        """Whether the rule's closed form holds for this layer's configuration."""
        return True

    def per_sample(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
    ) -> list[torch.Tensor]:
        """Per-sample gradients ``[(B, *p.shape)]``.

        Args:
            layer: The layer.
            a: Its input ``# (B, ...)``.
            g: The gradient of the SUM of per-example losses at its output ``# (B, ...)``.
            out: Optional tensors ``# (B, *p.shape)`` to write the results into.
        """
        raise NotImplementedError

    def factors(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> list | None:
        """Per-sample gradients with the weight as factors, or ``None`` (materialize instead).

        Same arguments as :meth:`per_sample`; the result's blocks are ``(B, *p.shape)`` tensors
        or :class:`~grab_exp.grads.linear.LinearFactors`.
        """
        return None


#: the parameters a rule's layer has (a layer with others is not the one the rule knows)
PLAIN_PARAMETERS = ("weight", "bias")

#: Layer type -> its rule. Subclasses of a registered type use its rule too.
RULES: dict[type[nn.Module], LayerRule] = {}


def register_rule(*layer_types: type[nn.Module]) -> Callable[[type[LayerRule]], type[LayerRule]]:
    """Class decorator: register an instance of the decorated rule for ``layer_types``."""

    def decorator(cls: type[LayerRule]) -> type[LayerRule]:
        rule = cls()
        for layer_type in layer_types:
            RULES[layer_type] = rule
        return cls

    return decorator


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule of ``module``'s type (or nearest registered base class); ``None`` if none applies.

    ``None`` too when the rule does not support this configuration (e.g. a grouped Conv2d), and
    when the module is not the plain layer the rule knows: a subclass that overrides ``forward``
    or adds parameters (a LoRA layer), a layer whose weight a forward pre-hook computes (the older
    ``weight_norm``, ``prune``) or a parametrization. Such a layer gets the per-layer fallback.
    """
    for cls in type(module).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            own = {n for n, _ in module.named_parameters(recurse=False)}
            pre_hooks = [h for h in module._forward_pre_hooks.values() if not is_ours(h)]
            plain = (
                type(module).forward is cls.forward
                and "forward" not in vars(module)  # a forward replaced on the instance
                and own <= set(PLAIN_PARAMETERS)
                and (not pre_hooks or isinstance(module, LazyModuleMixin))
                and not parametrize.is_parametrized(module)
            )
            return rule if plain and rule.supports(module) else None
    return None


#: the attribute that marks the hook path's own hooks on a module
OURS = "_grab_exp_per_sample"


def is_ours(hook: Any) -> bool:
    """Whether ``hook`` is one of the hook path's own (of any per-sample instance)."""
    return getattr(hook, OURS, False)
