"""Relevance Functions: autograd Functions whose forward is the original operation and whose
backward propagates relevance instead of gradient.

This package is plain tensor math. It imports nothing from capture, rewrite or the explainer.
"""

from fxlrp.relevance.layer import AffineLayer
from fxlrp.relevance.passthrough import apply_pass
from fxlrp.relevance.rule_function import apply_rule
from fxlrp.relevance.stabilise import divide_dropping_zeros

__all__ = ["AffineLayer", "apply_rule", "apply_pass", "divide_dropping_zeros"]
