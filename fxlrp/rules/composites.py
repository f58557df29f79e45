"""Composites: which rule each operation of a model gets.

A composite looks at a :class:`Site` (the canonical operation of a node, the module it belongs
to, whether it is the first layer) and returns a rule, or None to leave the operation's default
(the proportional z-rule for sums, pools and scatter sums). :meth:`Composite.resolve` is the one
place a call's rule is chosen, for a captured graph's nodes and for code run eagerly alike.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from fxlrp.registry import Kind, Operation
from fxlrp.relevance.roles import ACTIVATION, ATTENTION, GATE
from fxlrp.relevance.terms import ZeroParams
from fxlrp.rules import (
    AlphaBeta,
    AttentionAsConstant,
    Epsilon,
    Flat,
    Gamma,
    Norm,
    Pass,
    Product,
    Rule,
    SoftmaxRule,
    Stabiliser,
    ZBox,
    ZPlus,
)
from fxlrp.rules.attention import GRAPH_SOFTMAX, PRODUCT_OPERATIONS


@dataclass(frozen=True)
class Site:
    """What a composite may know about one node of the graph."""

    node_name: str
    """The name of the graph node (or of the call, in code run eagerly)."""
    operation: str
    """Canonical operation, e.g. ``"conv"``, ``"linear"``, ``"add"``, ``"avg_pool"``."""
    weighted: bool
    """A layer with weights (linear, convolution, BatchNorm, matmul with a parameter)."""
    module_name: str | None
    """Qualified name of the module the node belongs to (its own for module calls)."""
    module_type: type[nn.Module] | None
    """The type of that module; None where the node belongs to none."""
    is_first_layer: bool
    """The first layer the input meets among the operations the composite counts as first layers
    (:meth:`Composite.counts_as_first_layer`; any weighted layer by default)."""
    is_module_call: bool = False
    """The node calls a module (``nn.AvgPool2d``) rather than a function (``x + y``)."""
    relevance_factors: int = 0
    """How many factors of a product (:attr:`fxlrp.registry.Operation.factors`: ``a`` and ``b``
    in ``a @ b``) carry relevance; 0 for other operations. Two or more make it a product of
    relevance-carrying tensors, whose rule is a :class:`~fxlrp.rules.Product` rule. Read from the
    graph at conversion (a tensor computed from any model input counts) and from the tensors in
    code run eagerly."""
    before_first_layer: bool = False
    """A sum that may add a constant (:data:`INPUT_OFFSETS`: the model's own normalisation of its
    raw input, ``(x - mean) / std``, ``2 * (x - 0.5)``) on the way from the model's inputs to the
    first layer: its relevance-carrying arguments come from the inputs through no layer the
    composite counts as a first layer. Looked for only where the composite gives such maps a rule
    of their own (:meth:`Composite.rules_input_maps`); False elsewhere."""


class Composite:
    """Assigns rules by qualified module name, first layer, module type and operation.

    Name and type rules apply to weighted layers and module calls; a functional sum such as a
    residual ``+`` inside a block is reached by ``operation_rules``. Precedence, first match wins:

    1. ``name_rules``: ``{glob pattern: rule}`` on the qualified module name (``"features.0"``,
       ``"layer*.conv1"``);
    2. ``first_layer``: the rule of the first weighted layer; under one that does not share by its
       input's values, a sum on the way from the inputs to it (``site.before_first_layer``: the
       model's own normalisation of its raw input) takes LRP-0 without its constant part;
    3. ``type_rules``: ``{module type or tuple of types: rule}``, subclasses included;
    4. ``operation_rules``: ``{canonical operation: rule}`` (``"add"``, ``"avg_pool"``, ...);
    5. ``layer_rule`` for every weighted layer (``Epsilon(1e-6)`` when None);
    6. the operation's own default (z-rule for sums); for a map of the raw input before the first
       layer (:data:`INPUT_TRANSFORMS`) under a first-layer rule that does not share by its
       input's values, LRP-0 without its constant part.

    ``first_layer_operations`` says which canonical operations can be the first layer (e.g.
    ``{"conv", "conv_transpose"}`` for a rule meant for pixels); None means any weighted layer.
    The first layer is every call of such an operation that the model's inputs meet: its
    relevance-carrying arguments come from the inputs through no other such call (the first in
    a chain, each call of a shared encoder on several inputs, layers side by side; not the later
    calls of a recurrent layer). A node that runs a module's own code (a part run eagerly, a PyG
    message-passing layer) and that the inputs meet holds it: it goes to the calls inside that
    the node's inputs meet.

    Parameters
    ----------
    layer_rule : Rule, optional
        The rule of every weighted layer no other entry reaches; ``Epsilon(1e-6)`` when None.
    name_rules : mapping of str to Rule, optional
        ``{glob pattern: rule}`` on the qualified module name.
    first_layer : Rule, optional
        The rule of the first layer; None gives it no rule of its own.
    type_rules : mapping or iterable of (type, Rule) pairs, optional
        ``{module type or tuple of types: rule}``, subclasses included; a sequence of pairs keeps
        its order.
    operation_rules : mapping of str to Rule, optional
        ``{canonical operation: rule}``.
    first_layer_operations : iterable of str, optional
        The canonical operations that can be the first layer; None means any weighted layer.
    """

    def __init__(
        self,
        layer_rule: Rule | None = None,
        *,
        name_rules: Mapping[str, Rule] | None = None,
        first_layer: Rule | None = None,
        type_rules: Mapping[Any, Rule] | Iterable[tuple[Any, Rule]] | None = None,
        operation_rules: Mapping[str, Rule] | None = None,
        first_layer_operations: Iterable[str] | None = None,
    ) -> None:
        # Every weighted layer needs a rule: without one, the default epsilon rule.
        self.layer_rule = Epsilon(1e-6) if layer_rule is None else layer_rule
        self.name_rules = dict(name_rules or {})
        self.first_layer = first_layer
        self.type_rules = list(type_rules.items() if isinstance(type_rules, Mapping) else type_rules or [])
        self.operation_rules = dict(operation_rules or {})
        self.first_layer_operations = None if first_layer_operations is None else frozenset(first_layer_operations)
        self._derived: dict[tuple[str, int], tuple[Rule, Rule]] = {}
        self._defaults: dict[str, Rule] = {}

    def counts_as_first_layer(self, operation: str, weighted: bool) -> bool:
        """Whether a node of this canonical operation can be the first layer.

        Parameters
        ----------
        operation : str
            The node's canonical operation.
        weighted : bool
            Whether the node is a layer with weights.

        Returns
        -------
        bool
            True if the operation is among ``first_layer_operations`` (any weighted layer when
            those are None).
        """
        if self.first_layer_operations is None:
            return weighted
        return operation in self.first_layer_operations

    def may_hold_first_layer(self, operation: Operation) -> bool:
        """Whether a call of ``operation`` the model's inputs meet is a first layer.

        An operation that runs a module's own code may hold first layers inside. The answer is
        the same in the captured graph and in code run eagerly.

        Parameters
        ----------
        operation : Operation
            The registry's entry of the called operation.

        Returns
        -------
        bool
            True if the call is, or may hold, a first layer.
        """
        propagation = operation.propagation
        return propagation.holds_layers or self.counts_as_first_layer(operation.name, propagation.weighted)

    def may_choose_first_layer(self) -> bool:
        """Whether the first layer can get a rule of its own.

        It can with a ``first_layer`` rule, or in a subclass that chooses on its own. Code run
        eagerly looks for first layers only then.

        Returns
        -------
        bool
            True if the first layer may get a rule other than the others'.
        """
        return self.first_layer is not None or self._chooses_on_its_own()

    def chooses_by_module(self) -> bool:
        """Whether the module a call belongs to can change its rule.

        It can with name or type rules, or in a subclass that chooses on its own. Code run
        eagerly follows module calls only then (a forward hook on every module call of the run
        costs Python at each).

        Returns
        -------
        bool
            True if rules may depend on the module a call belongs to.
        """
        return bool(self.name_rules or self.type_rules) or self._chooses_on_its_own()

    def _chooses_on_its_own(self) -> bool:
        own = type(self)
        return own.rule_for is not Composite.rule_for or own._chosen_rule is not Composite._chosen_rule

    def resolve(self, site: Site, operation: Operation) -> Rule | None:
        """The rule of one call of ``operation`` at ``site``.

        This is the one place a rule is chosen, for the captured graph and for code run eagerly
        alike. The rules returned are made once per composite, so calls share their caches.

        Parameters
        ----------
        site : Site
            What the composite may know about the call.
        operation : Operation
            The registry's entry of the called operation.

        Returns
        -------
        Rule or None
            None for operations that are not affine (their handling is fixed: identity,
            native); otherwise :meth:`rule_for` the site, else for an operation of
            :data:`INPUT_TRANSFORMS` under a first-layer rule that does not share by its input's
            values LRP-0 without the bias (:meth:`_input_transform_rule`), else the operation's
            own default (the z-rule for sums), else :attr:`layer_rule`. Where several factors of a product carry
            relevance (``site.relevance_factors > 1``: ``q @ k.T``, ``attention @ v``, a gating
            product), that rule as a :class:`~fxlrp.rules.Product` rule: an epsilon rule as the
            uniform epsilon rule with its epsilon, a rule with no meaning on a product (z+, ...)
            as ``Product()``, with a warning.
        """
        propagation = operation.propagation
        if propagation.kind is not Kind.AFFINE:
            return None
        rule = self.rule_for(site)
        if rule is None and site.operation in INPUT_TRANSFORMS:
            rule = self._input_transform_rule()
        if rule is None:
            if propagation.default_rule is None:
                rule = self.layer_rule
            else:
                rule = self._defaults.get(operation.name)
                if rule is None:
                    rule = self._defaults[operation.name] = propagation.default_rule()
        if site.relevance_factors > 1:
            return self._as_product(rule, site)
        return rule

    def rule_for(self, site: Site) -> Rule | None:
        """The composite's own choice for ``site``.

        Subclasses may override it to choose on their own.

        Parameters
        ----------
        site : Site
            What the composite may know about the call.

        Returns
        -------
        Rule or None
            The first match in the precedence of the class docstring; None if nothing matches.
        """
        rule = self._chosen_rule(site)
        if isinstance(rule, Product) and rule.epsilon is None:
            # a product rule that follows the layer rule's epsilon (fxlrp.rules.attention.cp_lrp())
            return self._derive("following", rule, rule.following, self.layer_rule)
        return rule

    def rules_input_maps(self) -> bool:
        """Whether maps of the raw input before the first layer get a rule of their own.

        They do under a first-layer rule that does not share by its input's values (flat, w^2,
        z^B): LRP-0 without the map's constant part, so that the first layer's rule reads the
        image it expects and relevance reaches the raw input by each value's share (a detector's
        transform, :data:`INPUT_TRANSFORMS`; a sum of :data:`INPUT_OFFSETS` the inputs meet before
        the first layer, ``site.before_first_layer``).

        Returns
        -------
        bool
            True if the composite's first-layer rule does not share by its input's values.
        """
        return self._input_transform_rule() is not None

    def _input_transform_rule(self) -> Rule | None:
        """LRP-0 without the bias where the first layer's rule does not share by its input's values.

        A rule such as flat, w^2 or z^B gives relevance to inputs whatever their values, so the
        z-rule of the map before it, ``R_x = x J^T (R_y / y)``, would divide by values of its
        input ``y`` near 0 (a normalised pixel near the mean). Without the map's constant part
        (``zero_params="bias"``) it is ``R_x = x J^T (R_y / (y - y_0))``, ``y_0`` the map of a
        zero input: relevance moves to the raw input in proportion to each value's share of
        ``J x``. Other first-layer rules, and none, leave the operation's default (the z-rule,
        with which LRP-0 is gradient x input).
        """
        first = self.first_layer
        if first is None or first.shares_by_input_values:
            return None
        return self._derive("input transform", first, Epsilon, 0.0, "bias")

    def _as_product(self, rule: Rule, site: Site) -> Product:
        """The :class:`~fxlrp.rules.Product` rule of a product of several relevance-carrying
        tensors at ``site`` that was given ``rule``.

        A :class:`~fxlrp.rules.Product` is used as it is; an :class:`~fxlrp.rules.Epsilon` (e.g. the
        layer rule that reaches ``matmul`` and ``einsum``) becomes the uniform epsilon rule with its
        epsilon; other rules (z+, alpha-beta, ...) have no meaning on a product of two variables,
        which then gets the default ``Product()``, with a warning.
        """
        if isinstance(rule, Product):
            return rule
        if isinstance(rule, Epsilon):
            return self._derive("product", rule, Product, rule.epsilon)
        warnings.warn(
            f"fxlrp: {rule!r} was chosen for a product of two relevance-carrying tensors ({site.operation!r}: an "
            "attention or gating product), where it has no meaning; the uniform product rule Product() is used "
            f"there instead. Give such products a rule of their own with operation_rules={{{site.operation!r}: "
            "Product(...)} to silence this.",
            stacklevel=2,
        )
        return self._derive("product", rule, Product)

    def _derive(self, kind: str, rule: Rule, make: Callable[..., Rule], *arguments: Any) -> Any:
        """``make(*arguments)``, made once per ``kind`` and ``rule`` (the entry keeps ``rule``, so
        its id stays valid)."""
        entry = self._derived.get((kind, id(rule)))
        if entry is None or entry[0] is not rule:
            entry = self._derived[(kind, id(rule))] = (rule, make(*arguments))
        return entry[1]

    def _chosen_rule(self, site: Site) -> Rule | None:
        by_module = site.weighted or site.is_module_call
        if by_module and site.module_name is not None:
            for pattern, rule in self.name_rules.items():
                if fnmatch.fnmatchcase(site.module_name, pattern):
                    return rule
        if site.is_first_layer and self.first_layer is not None:
            return self.first_layer
        if site.before_first_layer:
            input_map = self._input_transform_rule()
            if input_map is not None:
                return input_map
        if by_module and site.module_type is not None:
            for module_types, rule in self.type_rules:
                if issubclass(site.module_type, module_types):
                    return rule
        if site.operation in self.operation_rules:
            return self.operation_rules[site.operation]
        if site.weighted:
            return self.layer_rule
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layer_rule={self.layer_rule!r})"


CONVOLUTIONS = ("conv", "conv_transpose")
LINEAR_LAYERS = ("linear", *CONVOLUTIONS)
"""zennit's ``Linear`` type: dense and convolutional layers."""
INPUT_TRANSFORMS = ("image_transform",)
"""Operations that map the model's raw input to the image its first layer reads (a torchvision
detector's normalisation, resizing and batching, registered by
:mod:`fxlrp.integrations.torchvision`); see :meth:`Composite.resolve`."""
INPUT_OFFSETS = ("add", "sub")
"""Sums that may add a constant to the model's raw input before its first layer: a normalisation
written in the model's own code (torchvision's ``transform_input`` of Inception v3 and GoogLeNet,
``2 * (x - 0.5)`` in timm's Gemma 4 vision encoder); see :attr:`Site.before_first_layer`."""
SUMS = ("add", "sub", "sum", "mean", "avg_pool")
"""Parameterless sums; zennit's composites give its ``Sum`` and ``AvgPool`` modules ``Norm``."""


class ZennitComposite(Composite):
    """zennit's layer map, with the rules as data.

    ``Norm`` on sums and average pooling, ``Pass`` on BatchNorm that was not folded, ``Epsilon``
    on dense layers (and other weighted layers: matmul with a parameter), ``convolutions`` on
    convolutions and, optionally, ``first_layer`` on the first of ``first_layer_operations``.

    Activations need no entry: smooth ones pass relevance unchanged and piecewise-linear ones
    keep their native backward, which gives zennit's numbers because every rule above weights
    by the (zero) input where a ReLU is off.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``Norm`` on sums and average pooling.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon rule.
    convolutions : Rule
        The rule of convolutions.
    first_layer : Rule, optional
        The rule of the first layer.
    first_layer_operations : iterable of str, optional
        The canonical operations that can be the first layer.
    name_rules, type_rules, operation_rules : optional
        As in :class:`Composite`; they take precedence over the map.
    """

    def __init__(
        self,
        epsilon: Stabiliser = 1e-6,
        stabilizer: Stabiliser = 1e-6,
        zero_params: ZeroParams = None,
        *,
        convolutions: Rule,
        first_layer: Rule | None = None,
        first_layer_operations: Iterable[str] | None = None,
        name_rules: Mapping[str, Rule] | None = None,
        type_rules: Mapping[Any, Rule] | Iterable[tuple[Any, Rule]] | None = None,
        operation_rules: Mapping[str, Rule] | None = None,
    ) -> None:
        norm = Norm(stabilizer)
        operations: dict[str, Rule] = {name: norm for name in SUMS}
        operations["batch_norm"] = Pass()
        operations.update({name: convolutions for name in CONVOLUTIONS})
        operations.update(operation_rules or {})
        super().__init__(
            Epsilon(epsilon, zero_params), name_rules=name_rules, first_layer=first_layer, type_rules=type_rules,
            operation_rules=operations, first_layer_operations=first_layer_operations,
        )


class EpsilonPlus(ZennitComposite):
    """zennit's ``EpsilonPlus``.

    :class:`~fxlrp.rules.ZPlus` on convolutions, :class:`~fxlrp.rules.Epsilon` on dense layers,
    :class:`~fxlrp.rules.Norm` on sums and average pooling.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``ZPlus`` and ``Norm``.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon and z+ rules.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules``, ``first_layer``,
        ``first_layer_operations`` (see :class:`ZennitComposite`).
    """

    def __init__(self, epsilon: Stabiliser = 1e-6, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None,
                 **overrides: Any) -> None:
        super().__init__(epsilon, stabilizer, zero_params, convolutions=ZPlus(stabilizer, zero_params), **overrides)


class EpsilonPlusFlat(ZennitComposite):
    """zennit's ``EpsilonPlusFlat``.

    :class:`EpsilonPlus` with :class:`~fxlrp.rules.Flat` on the first dense or convolutional
    layer.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``ZPlus``, ``Flat`` and ``Norm``.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon, z+ and flat rules.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules`` (see :class:`ZennitComposite`).
    """

    def __init__(self, epsilon: Stabiliser = 1e-6, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None,
                 **overrides: Any) -> None:
        super().__init__(epsilon, stabilizer, zero_params, convolutions=ZPlus(stabilizer, zero_params),
                         first_layer=Flat(stabilizer, zero_params), first_layer_operations=LINEAR_LAYERS, **overrides)


class EpsilonAlpha2Beta1(ZennitComposite):
    """zennit's ``EpsilonAlpha2Beta1``.

    :class:`~fxlrp.rules.AlphaBeta` (2, 1) on convolutions, :class:`~fxlrp.rules.Epsilon` on
    dense layers, :class:`~fxlrp.rules.Norm` on sums and average pooling.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``AlphaBeta`` and ``Norm``.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon and alpha-beta rules.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules``, ``first_layer``,
        ``first_layer_operations`` (see :class:`ZennitComposite`).
    """

    def __init__(self, epsilon: Stabiliser = 1e-6, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None,
                 **overrides: Any) -> None:
        super().__init__(epsilon, stabilizer, zero_params, convolutions=AlphaBeta(2.0, 1.0, stabilizer, zero_params),
                         **overrides)


class EpsilonAlpha2Beta1Flat(ZennitComposite):
    """zennit's ``EpsilonAlpha2Beta1Flat``.

    :class:`EpsilonAlpha2Beta1` with :class:`~fxlrp.rules.Flat` on the first dense or
    convolutional layer.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``AlphaBeta``, ``Flat`` and ``Norm``.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon, alpha-beta and flat rules.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules`` (see :class:`ZennitComposite`).
    """

    def __init__(self, epsilon: Stabiliser = 1e-6, stabilizer: Stabiliser = 1e-6, zero_params: ZeroParams = None,
                 **overrides: Any) -> None:
        super().__init__(epsilon, stabilizer, zero_params, convolutions=AlphaBeta(2.0, 1.0, stabilizer, zero_params),
                         first_layer=Flat(stabilizer, zero_params), first_layer_operations=LINEAR_LAYERS, **overrides)


class EpsilonGammaBox(ZennitComposite):
    """zennit's ``EpsilonGammaBox``.

    :class:`~fxlrp.rules.ZBox` (``low``, ``high``) on the first convolution,
    :class:`~fxlrp.rules.Gamma` on the other convolutions, :class:`~fxlrp.rules.Epsilon` on
    dense layers, :class:`~fxlrp.rules.Norm` on sums and average pooling.

    Parameters
    ----------
    low, high : float or Tensor
        The bounds of the input (numbers or per-channel tensors ``(1, C, 1, 1)``).
    epsilon : float or callable, default 1e-6
        The stabiliser of the epsilon rule on dense layers.
    gamma : float, default 0.25
        The ``gamma`` of the gamma rule on convolutions.
    stabilizer : float or callable, default 1e-6
        The stabiliser of ``ZBox``, ``Gamma`` and ``Norm``.
    zero_params : str or sequence of str, optional
        zennit's ``zero_params`` of the epsilon, gamma and z^B rules.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules`` (see :class:`ZennitComposite`).
    """

    def __init__(
        self,
        low: float | Tensor,
        high: float | Tensor,
        epsilon: Stabiliser = 1e-6,
        gamma: float = 0.25,
        stabilizer: Stabiliser = 1e-6,
        zero_params: ZeroParams = None,
        **overrides: Any,
    ) -> None:
        self.low, self.high, self.gamma = low, high, gamma
        super().__init__(epsilon, stabilizer, zero_params, convolutions=Gamma(gamma, stabilizer, zero_params),
                         first_layer=ZBox(low, high, stabilizer, zero_params), first_layer_operations=CONVOLUTIONS,
                         **overrides)


class AttnLRP(Composite):
    r"""AttnLRP (Achtibat et al., ICML 2024) with LXT's definitions, for transformers.

    - layers with weights (linear projections, the LM head): :class:`~fxlrp.rules.Epsilon`;
    - softmax: :class:`~fxlrp.rules.attention.SoftmaxRule`, ``R_x = x (R - s \sum R)``;
    - products of relevance-carrying tensors (``q k^T``, attention weights times values, the
      gating product ``act(x W_g) * (x W_u)`` of SwiGLU/GeGLU): the uniform rule, each factor
      ``R / 2`` (:class:`~fxlrp.rules.attention.Product`); a sigmoid gate (squeeze-excitation)
      stays a gate;
    - LayerNorm and RMSNorm: the identity rule on ``sigma`` (the z-rule on the affine map that
      remains); smooth activations: the identity rule; sums and residual additions: the z-rule.

    Usable on any transformer fxlrp converts: Hugging Face's, torchvision's ViT and Swin.

    Parameters
    ----------
    epsilon : float or callable, default 1e-6
        The epsilon of the layers' and the products' epsilon rules. ``epsilon=0.0`` is LXT's
        efficient mode, whose Gradient x Input framework has no stabiliser.
    **overrides
        ``name_rules``, ``type_rules``, ``operation_rules`` (see :class:`Composite`), taking
        precedence.
    """

    constants: tuple[str, ...] = (GATE,)
    """Roles of factors that are constants in products (:class:`~fxlrp.rules.Product`): gates."""

    def __init__(self, epsilon: Stabiliser = 1e-6, **overrides: Any) -> None:
        self.epsilon = epsilon
        operations: dict[str, Rule] = {name: Product(epsilon, constants=self.constants) for name in PRODUCT_OPERATIONS}
        operations["softmax"] = SoftmaxRule()
        if ATTENTION in self.constants:  # graph attention's weights (GAT) too
            operations[GRAPH_SOFTMAX] = AttentionAsConstant()
        operations.update(overrides.pop("operation_rules", None) or {})
        super().__init__(Epsilon(epsilon), operation_rules=operations, **overrides)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon!r})"


class CPLRP(AttnLRP):
    r"""CP-LRP (Ali et al., ICML 2022) with LXT's definitions.

    :class:`AttnLRP`, except that attention weights and the gating factor of SwiGLU/GeGLU are
    constants, so the values (and the gated signal ``x W_u``) take all of the product's relevance
    and none enters the softmax or the gate. Graph attention (GAT's softmax over edges) is a
    constant too. It takes :class:`AttnLRP`'s parameters.
    """

    constants = (GATE, ATTENTION, ACTIVATION)


def default_composite() -> Composite:
    """Epsilon(1e-6) on every weighted layer; the z-rule for sums, pools and scatter sums.

    Returns
    -------
    Composite
        A fresh composite with that layer rule.
    """
    return Composite(layer_rule=Epsilon(1e-6))


def as_composite(composite: Composite | Rule | None) -> Composite:
    """The composite that ``composite`` stands for.

    Parameters
    ----------
    composite : Composite, Rule or None
        A composite; a single rule (that rule on every weighted layer); or None (the default,
        :func:`default_composite`).

    Returns
    -------
    Composite
        The composite itself, or the one made from the rule or the default.

    Raises
    ------
    TypeError
        If ``composite`` is none of these.
    """
    if composite is None:
        return default_composite()
    if isinstance(composite, Rule):
        return Composite(layer_rule=composite)
    if isinstance(composite, Composite):
        return composite
    raise TypeError(
        f"composite must be None, a rule (e.g. fxlrp.rules.Epsilon(0.0)) or a Composite, "
        f"not {type(composite).__name__}"
    )
