"""Registry of per-layer rules: per-sample gradients from a layer's input and output gradient.

Like opacus's ``grad_sample`` registry: a rule knows, for one layer type, the closed form of the
gradient of one example's loss with respect to the layer's own parameters, given the layer's
input ``a`` and the gradient ``g`` at its output (both batch first). The hook path
(:mod:`grab_exp.per_sample.hooks`) looks rules up with :func:`rule_for`; a trainable layer
without one gets the per-layer ``torch.func`` fallback (:mod:`grab_exp.per_sample.fallback`).

Adding a layer type::

    @register_rule(nn.MyLayer)
    class MyLayerRule(LayerRule):
        def per_sample(self, layer, a, g, out=(None, None)): ...  # [(B, *p.shape) per param]

It returns one tensor per parameter of ``layer.named_parameters(recurse=False)``, in that
order (frozen ones included).
"""

from grab_exp.per_sample.rules import conv2d, embedding, layer_norm, linear  # noqa: F401
from grab_exp.per_sample.rules.base import RULES, LayerRule, Outs, register_rule, rule_for

__all__ = ["RULES", "LayerRule", "Outs", "register_rule", "rule_for"]
