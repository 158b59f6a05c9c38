"""The rule registry: :class:`LayerRule`, :data:`RULES`, :func:`register_rule`, :func:`rule_for`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["RULES", "LayerRule", "Outs", "register_rule", "rule_for"]

#: Optional tensors to write the per-sample gradients into, one per parameter (or ``None``).
Outs = Sequence[torch.Tensor | None]


class LayerRule:
    """Per-sample gradients of one layer type's own parameters (maybe as :meth:`factors`)."""

    has_factors = False
    #: ``(layer, a, g, coef (B,), acc)``: ``acc (*weight.shape) += sum_i coef_i`` of the weight's
    #: rows from ``a`` and ``g``, for rules whose rows are mostly zeros (else ``None``)
    weighted_sum: Callable | None = None
    #: ``(layer, keep) -> undo | None``: the layer's recorded calls computed with its weight
    #: copied per example (``keep(w)``, ``w (B * O, ...)``), for autograd's one backward to give
    #: the weight's rows, where that pays (``undo()`` puts its forward back)
    copy_weight: Callable | None = None

    def supports(self, layer: nn.Module) -> bool:
        return True

    def per_sample(
        self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
    ) -> list[torch.Tensor]:
        """Per-sample gradients ``[(B, *p.shape)]`` from the layer's input ``a (B, ...)`` and the
        gradient ``g (B, ...)`` of the SUM of per-example losses at its output; written into
        ``out``'s tensors where given."""
        raise NotImplementedError

    def factors(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> list | None:
        """:meth:`per_sample` with the weight as :class:`~grab_exp.grads.linear.LinearFactors`,
        or ``None`` (materialize instead)."""
        return None


#: Layer type -> its rule. Subclasses of a registered type use its rule too.
RULES: dict[type[nn.Module], LayerRule] = {}


def register_rule(*layer_types: type[nn.Module]) -> Callable[[type[LayerRule]], type[LayerRule]]:
    def decorator(cls: type[LayerRule]) -> type[LayerRule]:
        RULES.update(dict.fromkeys(layer_types, cls()))
        return cls

    return decorator


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule of ``module``'s type (or nearest registered base class); ``None`` where none
    applies: an unsupported configuration (a grouped Conv2d), or not the plain layer it knows (a
    forward overridden; parameters besides its weight and bias, as LoRA's, the older
    ``weight_norm``'s or ``prune``'s; a weight or bias that is a buffer). A forward pre-hook that
    changes the input is followed: the rule reads what the forward got."""
    for cls in type(module).__mro__:
        if (rule := RULES.get(cls)) is not None:
            own = {n for n, _ in module.named_parameters(recurse=False)}
            plain = (
                type(module).forward is cls.forward
                and "forward" not in vars(module)  # a forward replaced on the instance
                and own == {n for n in ("weight", "bias") if getattr(module, n, None) is not None}
                and not parametrize.is_parametrized(module)
            )
            return rule if plain and rule.supports(module) else None
    return None


#: the ids of the hook path's own hooks' handles on the modules (of any per-sample instance):
#: the keys of a module's hook registries (a registry holding these alone is left as is)
OWN_IDS: set[int] = set()
