"""Per-layer rules, like opacus's ``grad_sample`` registry: per layer type, the closed form of
one example's gradient from the layer's input ``a`` and output gradient ``g`` (batch first); a
layer without a rule gets the per-layer fallback. Adding a layer type::

    @register_rule(nn.MyLayer)
    class MyLayerRule(LayerRule):
        def per_sample(self, layer, a, g, out=(None, None)): ...  # [(B, *p.shape) per param]

one tensor per parameter of ``layer.named_parameters(recurse=False)``, frozen ones included."""

from grab_exp.per_sample.rules import conv2d, embedding, layer_norm, linear  # noqa: F401
from grab_exp.per_sample.rules.base import RULES, LayerRule, Outs, register_rule, rule_for

__all__ = ["RULES", "LayerRule", "Outs", "register_rule", "rule_for"]
