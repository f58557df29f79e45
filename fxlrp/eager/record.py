"""Record a run of a module into a torch.fx graph: capture by running, for one input signature.

torch.fx traces symbolically, so code that reads a tensor's shape in Python (Hugging Face's
``(*input_shape, -1, head_dim)``, mask construction) cannot be traced, and such a module runs
eagerly under :class:`~fxlrp.eager.interpret.RelevanceMode`, paying Python at every torch call of
every explanation. Running the module once on real tensors under :class:`Recorder` - a
``TorchFunctionMode`` that writes every torch call into a graph - gives the graph of that run:
shapes are concrete, so shape logic runs as Python and leaves only its results in the graph.

The graph holds for every input of the same *signature* - the tensors' shapes, dtypes, devices,
strides and whether they require gradients, and every other argument's value - as long as the
run never let a tensor's *values* decide anything. So a recording is abandoned
(:class:`RecordingFailed`, and the module keeps running eagerly) when the code reads the values
of a tensor computed from the inputs (``bool``, ``item``, ``tolist``, a comparison in an ``if``),
calls an operation whose output shape depends on values (``nonzero``, a boolean mask index), a
random one, an operation torch.fx would not hold (a custom ``torch.autograd.Function``, a
``torch.ops`` extension op), meets a tensor it cannot trace to the inputs, the module's parameters
and buffers or a tensor attribute of its modules, or returns an object it cannot rebuild. Values
read from tensors that do not depend on the inputs (a causal mask made by ``arange``) are
constants of the signature and are kept as Python.

Leaf modules (those fxlrp explains as a whole, and torch.nn's own) are recorded as ``call_module``
nodes, other modules' operations with their ``nn_module_stack``, as torch.fx records them, so the
graph goes through the same pipeline as a traced one (canonicalise, rules, rewrite).
"""

from __future__ import annotations

import copy
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, fx, nn
from torch.overrides import TorchFunctionMode

from fxlrp.capture import GRADIENTS_OFF, as_python_number
from fxlrp.capture.interception import CHECKPOINT, checkpointed_call, intercepted_applications, intercepted_calls
from fxlrp.capture.module_state import MODEL_WRITES
from fxlrp.capture.source import innermost_user_frame
from fxlrp.graph.canonicalise import may_write
from fxlrp.registry.spellings import AUGMENTED_ASSIGNMENTS, OPERATORS, tensor_method_name, tensor_property_name


class RecordingFailed(Exception):
    """The run cannot be replayed as a graph for other inputs of its signature (why: the message)."""


METADATA = frozenset({
    "shape", "size", "dim", "ndim", "ndimension", "dtype", "device", "layout", "stride", "storage_offset",
    "is_contiguous", "numel", "nelement", "element_size", "is_floating_point", "is_complex", "is_signed",
    "requires_grad", "is_leaf", "grad_fn", "is_cuda", "is_cpu", "is_mps", "is_xpu", "is_meta", "is_sparse",
    "is_quantized", "is_nested", "is_inference", "get_device", "__len__", "__hash__", "_is_view", "names",
    "__torch_function__",
})
"""Reads of what a tensor is, not of its values: functions of the signature."""

RANDOM = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "random_", "exponential_", "geometric_",
    "cauchy_", "log_normal_", "poisson", "rrelu", "rrelu_", "feature_alpha_dropout",
})
"""Operations whose results differ from run to run. (Not dropout: the registry's dropout is the
identity at explanation time, in a rewritten graph as in the relevance mode.)"""

VALUE_SHAPED = frozenset({
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "repeat_interleave",
    "masked_scatter", "histc", "histogram", "bucketize", "searchsorted",
})
"""Operations whose output shape (or, for the last ones, whose meaning in shape code) depends on
values: later Python reads that shape."""


def _deciding_shape(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The arguments of a :data:`VALUE_SHAPED` call whose values decide its output's shape:
    ``repeat_interleave``'s ``repeats`` (GPT-J repeats its rotary sines by the int 2, a shape of
    the signature; a tensor of counts makes one of the run's values), all of them otherwise."""
    if name == "repeat_interleave":
        return kwargs.get("repeats", args[1] if len(args) > 1 else args[:1])
    return args, kwargs


def _name(function: Any) -> str | None:
    """The name of a torch function or Tensor method, or of the property a getter reads."""
    name = getattr(function, "__name__", None)
    if name == "__get__":
        return tensor_property_name(function)
    return tensor_method_name(function) or name


def _is_method(function: Any, name: str | None) -> bool:
    return name is not None and tensor_method_name(function) == name


def _is_property(function: Any) -> bool:
    return getattr(function, "__name__", None) == "__get__"


def _joined(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


class Recorder(TorchFunctionMode):
    """Writes every torch call of one run into ``graph`` (see the module's docstring).

    Parameters
    ----------
    root : nn.Module
        The recorded module.
    prefix : str
        Its qualified name in the model.
    is_leaf_module : callable
        ``is_leaf_module(module, name)``: whether a module's call is one node.
    """

    def __init__(self, root: nn.Module, prefix: str, is_leaf_module: Callable[[nn.Module, str], bool]) -> None:
        super().__init__()
        self.root = root
        self.prefix = prefix
        self.graph = fx.Graph()
        self.is_leaf_module = is_leaf_module
        self.module_names = {id(module): _joined(prefix, name)
                             for name, module in root.named_modules(remove_duplicate=False)}
        self.attributes: dict[int, str] | None = None
        self.constants: dict[str, Tensor] = {}
        self.values: dict[int, tuple[weakref.ref[Tensor], fx.Node]] = {}
        """Tensors of the run by id, held weakly, and their nodes. An entry whose tensor is gone
        names nothing (a later tensor may get its id): the run frees what it no longer uses as it
        would unrecorded, instead of keeping every value of the forward alive at once."""
        self.variable: set[fx.Node] = set()
        """Nodes whose values may differ between runs of one signature: computed from the inputs
        or from the module's parameters, buffers and tensor attributes (values that may be
        changed in place). Python may read only values computed from constants and shapes."""
        self.written: set[int] = set()
        """Storages (by address) such values were written into: every tensor on them - the
        written one, its base, its other views - holds values of the run."""
        self.written_tensors: list[Tensor] = []
        """The tensors written into, kept alive: no other tensor takes their storages' addresses."""
        self.module_stack: dict[str, tuple[str, type]] = {}
        self.paused = False
        self.thread = threading.get_ident()
        self.gradients = torch.is_grad_enabled()
        """Whether the recorded call runs with gradients on: calls its code makes with them off
        are marked (:data:`~fxlrp.capture.GRADIENTS_OFF`)."""

    # -- values ----------------------------------------------------------------------------------

    def input(self, name: str, tensor: Tensor) -> None:
        """Add a placeholder for an input tensor of the run.

        Parameters
        ----------
        name : str
            The placeholder's name.
        tensor : Tensor
            The input.
        """
        self._keep(tensor, self.graph.placeholder(name), variable=True)

    def _keep(self, tensor: Tensor, node: fx.Node, variable: bool) -> None:
        self.values[id(tensor)] = (weakref.ref(tensor), node)
        if variable:
            self.variable.add(node)

    def node_of(self, tensor: Tensor) -> fx.Node:
        """The node that stands for ``tensor`` in the graph.

        Parameters
        ----------
        tensor : Tensor
            A tensor of the run, or a parameter, buffer or tensor attribute of the modules.

        Returns
        -------
        fx.Node
            Its node (a get_attr node, made on first use, for the module's tensors).

        Raises
        ------
        RecordingFailed
            If the tensor came from outside the module's inputs, parameters and buffers.
        """
        known = self.values.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return known[1]
        if self.attributes is None:
            # (made here, inside the run, which may hold detached twins of the parameters)
            self.attributes = {}
            for name, value in (*self.root.named_parameters(remove_duplicate=False),
                                *self.root.named_buffers(remove_duplicate=False)):
                self.attributes.setdefault(id(value), _joined(self.prefix, name))
        name = self.attributes.get(id(tensor)) or self._module_attribute(tensor)
        node = self.graph.get_attr(name)
        self._keep(tensor, node, variable=True)
        return node

    def _module_attribute(self, tensor: Tensor) -> str:
        """A plain tensor attribute of one of the modules (a table it keeps)."""
        for module in self.root.modules():
            if any(value is tensor for value in vars(module).values()):
                name = f"_recorded_constant{len(self.constants)}"
                self.constants[name] = tensor
                return name
        raise RecordingFailed(
            f"a tensor of shape {list(tensor.shape)} came from outside the module's inputs, parameters and "
            f"buffers, from code the recording did not see (at {innermost_user_frame() or 'an unknown line'})")

    def _argument(self, value: Tensor | nn.Module) -> fx.Node:
        if isinstance(value, Tensor):
            return self.node_of(value)
        # A module handed to a function (transformers' experts functions take the experts module):
        # a graph would hand it on with its own parameters, which carry gradients.
        raise RecordingFailed(f"it hands a {type(value).__name__} module to a function")

    def reads_variable(self, value: Any) -> bool:
        """Whether ``value`` holds a tensor whose values may differ between runs of one signature.

        Parameters
        ----------
        value : Any
            A call's arguments (any pytree).

        Returns
        -------
        bool
            True if a tensor in it was computed from the inputs or the module's tensors, or lies
            on storage such values were written into.
        """
        return any(self.node_of(leaf) in self.variable or _storage(leaf) in self.written
                   for leaf in pytree.tree_leaves(value) if isinstance(leaf, Tensor))

    def _result(self, node: fx.Node, value: Any, variable: bool) -> None:
        """Name the tensors of ``value`` (a call's result) by ``node`` and ``getitem`` nodes of it."""
        if isinstance(value, Tensor):
            known = self.values.get(id(value))
            if known is not None and known[0]() is value:
                # An in-place call returns its target: later uses read the target's node, which
                # canonicalisation redirects to the written value, as in a traced graph.
                return
            self._keep(value, node, variable)
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                if isinstance(item, (Tensor, tuple, list)):
                    self._result(self.graph.call_function(operator.getitem, (node, index)), item, variable)

    # -- calls -----------------------------------------------------------------------------------

    def record(self, kind: str, target: Any, args: tuple, kwargs: dict, value: Any) -> None:
        """Write one call into the graph.

        Parameters
        ----------
        kind : str
            The node's op (``"call_function"``, ``"call_method"``, ``"call_module"``).
        target : Any
            The node's target.
        args : tuple
            The call's positional arguments.
        kwargs : dict
            The call's keyword arguments.
        value : Any
            The call's result, whose tensors the node then stands for.
        """
        variable = self.reads_variable((args, kwargs))
        node = self.graph.create_node(kind, target, *pytree.tree_map(
            lambda value: self._argument(value) if isinstance(value, (Tensor, nn.Module)) else as_python_number(value),
            (args, kwargs)))
        node.meta["nn_module_stack"] = dict(self.module_stack)
        if self.gradients and not torch.is_grad_enabled():
            node.meta[GRADIENTS_OFF] = True
        trace = innermost_user_frame()
        if trace:
            node.stack_trace = trace
        self._result(node, value, variable)
        if variable and kind != "call_module" and may_write(node):
            written = kwargs.get("out", args[0] if args else None)
            if isinstance(written, Tensor):
                self.written.add(_storage(written))
                self.written_tensors.append(written)

    def __torch_function__(self, function, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:  # (a mode acts on the thread that entered it only)
            return function(*args, **kwargs)
        name = _name(function)
        if name in METADATA:
            return function(*args, **kwargs)
        if name in RANDOM:
            raise RecordingFailed(f"it calls {name}, whose results differ from run to run")
        if name in VALUE_SHAPED and self.reads_variable(_deciding_shape(name, args, kwargs)):
            raise RecordingFailed(f"{name} makes a tensor whose shape depends on values of the run")
        if name == "__getitem__" and self.reads_variable(args[1:]) and any(
                isinstance(leaf, Tensor) and leaf.dtype == torch.bool for leaf in pytree.tree_leaves(args[1:])):
            raise RecordingFailed("a boolean mask selects elements by values of the run")
        module = getattr(function, "__module__", None) or ""
        if module.startswith("torch._ops") or type(function).__module__.startswith("torch._ops"):
            raise RecordingFailed(f"it calls the extension operation {function}")
        value = function(*args, **kwargs)
        if value is not None and not any(isinstance(leaf, Tensor) for leaf in pytree.tree_leaves(value)):
            if self.reads_variable((args, kwargs)):
                raise RecordingFailed(f"Python reads values of the run ({name}) at "
                                      f"{innermost_user_frame() or 'an unknown line'}")
            return value  # read from constants and shapes: a constant of the signature
        if name in OPERATORS and _is_method(function, name):
            target, reflected = OPERATORS[name]
            self.record("call_function", target, (args[1], args[0], *args[2:]) if reflected else args, kwargs, value)
        elif name in AUGMENTED_ASSIGNMENTS and _is_method(function, name):
            # as torch.fx records ``x += y``: canonicalisation makes both out of place alike
            self.record("call_function", AUGMENTED_ASSIGNMENTS[name].in_place_operator, args, kwargs, value)
        elif _is_property(function):
            self.record("call_function", getattr, (args[0], name), {}, value)
        elif _is_method(function, name):
            self.record("call_method", name, args, kwargs, value)
        else:
            self.record("call_function", function, args, kwargs, value)
        return value

    @contextmanager
    def paused_recording(self) -> Iterator[None]:
        """Record nothing while active (inside a call recorded as one node).

        Yields
        ------
        None
        """
        paused, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = paused

    # -- modules and library functions -----------------------------------------------------------

    def module_call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``nn.Module.__call__`` while recording: a leaf module's call is one node.

        Parameters
        ----------
        call : callable
            The original ``nn.Module.__call__``.

        Returns
        -------
        callable
            The replacement, which also notes the module stack of each node.
        """
        recorder = self

        def recorded_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            name = recorder.module_names.get(id(module))
            if recorder.paused or threading.get_ident() != recorder.thread or name is None:
                return call(module, *args, **kwargs)
            if name != recorder.prefix and recorder.is_leaf_module(module, name):
                with recorder.paused_recording():
                    value = call(module, *args, **kwargs)
                recorder.record("call_module", name, args, kwargs, value)
                return value
            recorder.module_stack[name or "self"] = (name, type(module))
            try:
                return call(module, *args, **kwargs)
            finally:
                recorder.module_stack.pop(name or "self", None)

        return recorded_call

    def leaf_function(self, function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
        """A library function fxlrp explains as a whole (PyG's ``scatter``): one node.

        Parameters
        ----------
        function : Any
            The library function.
        args : tuple
            Its positional arguments.
        kwargs : dict
            Its keyword arguments.
        original : callable
            Runs the function's own code.

        Returns
        -------
        Any
            The function's result.
        """
        if self.paused:  # (intercepted calls reach the handler on its own thread only)
            return original(*args, **kwargs)
        with self.paused_recording():
            value = original(*args, **kwargs)
        self.record("call_function", function, args, kwargs, value)
        return value


def _refuse_custom_function(function: Any, args: tuple, kwargs: dict, own: Callable[..., Any]) -> Any:
    raise RecordingFailed(f"it applies the custom autograd Function {function.__name__}")


def _refuse_checkpoint(function: Any, args: tuple, kwargs: dict, original: Callable[..., Any]) -> Any:
    """A checkpointed call with gradients on: a recorded graph would keep what the checkpoint's
    user asked to recompute, so the run is explained eagerly, where checkpoints are honoured."""
    checkpointed, inputs, keywords, _ = checkpointed_call(args, kwargs)
    if not torch.is_grad_enabled():
        return checkpointed(*inputs, **keywords)
    named = getattr(checkpointed, "func", checkpointed)  # (transformers checkpoints a partial of a layer's forward)
    raise RecordingFailed(f"it checkpoints {getattr(named, '__qualname__', 'a function')} "
                          "(activation checkpointing is honoured where the run is explained eagerly)")


CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.Size, type(Ellipsis))


@dataclass
class Recording:
    """A recorded run: its graph, and how to rebuild the result from the graph's output."""

    graph: fx.Graph
    """Placeholders: the tensors of the call's arguments in pytree order; output: the list of the
    result's tensors."""
    root: nn.Module
    """The recorded module's modules, parameters and buffers the graph names, at their paths."""
    output_spec: pytree.TreeSpec
    """The structure of the result."""
    output_constants: list[Any]
    """The result's leaves: the non-tensor ones, and :data:`TENSOR` where a tensor goes."""

    def rebuild(self, tensors: list[Tensor]) -> Any:
        """The result of a run whose graph returned ``tensors``.

        Parameters
        ----------
        tensors : list of Tensor
            The graph's output.

        Returns
        -------
        Any
            The result, built as the recorded run's was.
        """
        supply = iter(tensors)
        leaves = []
        for constant in self.output_constants:
            if constant is TENSOR:
                leaves.append(next(supply))
            elif isinstance(constant, HeldTensors):
                leaves.append(constant.rebuilt([next(supply) for _ in constant.tensors]))
            else:
                leaves.append(constant)
        return pytree.tree_unflatten(leaves, self.output_spec)


@dataclass
class HeldTensors:
    """An object of the result that holds tensors of the run in its attributes (a cache of keys and values).

    It is rebuilt as a copy of the recorded object with the new run's tensors in their places.
    """

    template: Any
    """The recorded object."""
    tensors: list[Tensor]
    """The run's tensors it holds."""

    def rebuilt(self, tensors: list[Tensor]) -> Any:
        """A copy of the recorded object with ``tensors`` in the places of the recorded ones.

        Parameters
        ----------
        tensors : list of Tensor
            The new run's tensors, in the order of :attr:`tensors`.

        Returns
        -------
        Any
            The copy.
        """
        memo: dict[int, Any] = {id(old): new for old, new in zip(self.tensors, tensors, strict=True)}
        return copy.deepcopy(self.template, memo)


def _slot_values(value: Any) -> list[Any]:
    """The values of ``value``'s ``__slots__`` attributes (of every class it derives from)."""
    found = []
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                found.append(getattr(value, name))
    return found


def _tensors_held(value: Any, depth: int = 0) -> list[Tensor]:
    """The tensors in ``value``'s attributes, lists, tuples and dicts (a few levels deep)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, CONSTANT_TYPES):
        return []
    if depth > 4 or isinstance(value, (nn.Module, type)) or callable(value):
        raise RecordingFailed(f"its output holds a {type(value).__name__}, which a recording cannot rebuild")
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    elif hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
        if any(isinstance(item, Tensor) for cls in type(value).__mro__ for item in vars(cls).values()):
            # (a class made by the run, with the run's tensor in a class attribute: a copy of the
            # object would hand back the recorded run's tensor, and relevance would not reach it)
            raise RecordingFailed(f"its output's class {type(value).__name__} holds a tensor, which a recording "
                                  "cannot rebuild")
        items = [*getattr(value, "__dict__", {}).values(), *_slot_values(value)]
    else:
        raise RecordingFailed(f"its output holds a {type(value).__name__}, which a recording cannot rebuild")
    return [tensor for item in items for tensor in _tensors_held(item, depth + 1)]


TENSOR = object()
"""Where a tensor of the graph's output goes among a result's leaves."""


def record(module: nn.Module, prefix: str, is_leaf_module: Callable[[nn.Module, str], bool],
           leaf_functions: tuple[Callable[..., Any], ...], run: Callable[..., Any], args: tuple,
           kwargs: dict) -> Recording:
    """Record ``run(*args, **kwargs)``, a call of ``module``, on copies of the tensors of the arguments.

    Parameters
    ----------
    module : nn.Module
        The recorded module.
    prefix : str
        Its qualified name in the model.
    is_leaf_module : callable
        ``is_leaf_module(module, name)``: modules whose calls are single nodes.
    leaf_functions : tuple of callable
        Library functions whose calls are single nodes.
    run : callable
        Runs the module (a :class:`~fxlrp.eager.runner.LayerRunner`).
    args : tuple
        Positional arguments.
    kwargs : dict
        Keyword arguments.

    Returns
    -------
    Recording
        The recorded graph and how to rebuild the result.

    Raises
    ------
    RecordingFailed
        Saying why the run cannot be recorded.
    """
    recorder = Recorder(module, prefix, is_leaf_module)
    leaves, input_spec = pytree.tree_flatten((args, kwargs))
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, Tensor):
            # a copy: code that writes into its input must not write into the caller's tensor
            leaves[index] = copy = leaf.detach().requires_grad_(leaf.requires_grad).clone()
            recorder.input(f"input_{index}", copy)
    args, kwargs = pytree.tree_unflatten(leaves, input_spec)
    with ExitStack() as stack:
        # One recording at a time in the process: the patch of ``nn.Module.__call__`` is global,
        # and two recordings restoring each other's would leave one in place.
        stack.enter_context(MODEL_WRITES)
        call = nn.Module.__call__
        stack.callback(setattr, nn.Module, "__call__", call)
        nn.Module.__call__ = recorder.module_call(call)
        stack.enter_context(intercepted_calls(leaf_functions, recorder.leaf_function))
        stack.enter_context(intercepted_calls((CHECKPOINT,), _refuse_checkpoint))
        stack.enter_context(intercepted_applications(_refuse_custom_function))
        stack.enter_context(recorder)
        value = run(*args, **kwargs)
    outputs, output_spec = pytree.tree_flatten(value)
    constants: list[Any] = []
    returned: list[Tensor] = []
    for leaf in outputs:
        if isinstance(leaf, Tensor):
            constants.append(TENSOR)
            returned.append(leaf)
        elif isinstance(leaf, CONSTANT_TYPES):
            constants.append(leaf)
        else:
            held = _tensors_held(leaf)
            constants.append(HeldTensors(leaf, held))
            returned.extend(held)
    recorder.graph.output([recorder.node_of(tensor) for tensor in returned])
    _eliminate_dead_code(recorder.graph)
    root = nn.Module()
    for node in recorder.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            value = recorder.constants[node.target] if node.target in recorder.constants else \
                operator.attrgetter(node.target[len(prefix) + 1:] if prefix else node.target)(module)
            _place(root, node.target, value)
    return Recording(recorder.graph, root, output_spec, constants)


def _place(root: nn.Module, target: str, value: Any) -> None:
    """Put ``value`` at the dotted path ``target`` under ``root`` (empty modules on the way)."""
    *path, name = target.split(".")
    for part in path:
        if not hasattr(root, part):
            root.add_module(part, nn.Module())
        root = getattr(root, part)
    if isinstance(value, nn.Module):
        root.add_module(name, value)
    elif isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
        root.register_buffer(name, value, persistent=False)
    else:
        setattr(root, name, value)


def _storage(tensor: Tensor) -> int:
    """The address of ``tensor``'s storage (read past the recorder: not a call of the run)."""
    with torch._C.DisableTorchFunction():
        return tensor.untyped_storage().data_ptr()


def _eliminate_dead_code(graph: fx.Graph) -> None:
    """Remove calls whose results nothing uses: values the code computed to read in Python (a mask
    it checked) or did not use. Writes and module calls stay."""
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "call_method", "get_attr") and not node.users and not may_write(node):
            graph.erase_node(node)
