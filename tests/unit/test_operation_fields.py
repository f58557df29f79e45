"""How Operation's fields depend on each other is checked when an operation is made."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fxlrp.registry import REGISTRY, Kind, Operation
from fxlrp.rules import Epsilon


def _relevance(call, function, *args, **kwargs):
    return function(*args, **kwargs)


@pytest.mark.parametrize(("fields", "names"), [
    ({"kind": Kind.PASS, "weighted": True}, "weighted=True needs kind=Kind.AFFINE"),
    ({"kind": Kind.NATIVE, "default_rule": Epsilon}, "default_rule needs kind=Kind.AFFINE"),
    ({"kind": Kind.PASS, "factors": lambda args, kwargs: args[:2]}, "factors needs kind=Kind.AFFINE"),
    ({"kind": Kind.NATIVE, "subclasses": True}, "give modules=(...)"),
    ({"kind": Kind.NATIVE, "source": True}, "give relevance=..."),
    ({"kind": Kind.NATIVE, "holds_layers": True}, "give relevance=..."),
    ({"kind": Kind.NATIVE, "relevance": _relevance, "moves_values": True, "shares_role": True}, "choose one"),
    ({"kind": Kind.NATIVE, "relevance": _relevance, "role": "gate", "moves_values": True}, "choose one"),
])
def test_an_operation_whose_fields_contradict_each_other_is_refused(fields, names) -> None:
    with pytest.raises(ValueError, match=r"operation 'made up': .*" + names.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        Operation("made up", **fields)


def test_every_registered_operation_keeps_the_rules() -> None:
    import fxlrp.explain.loader  # noqa: F401  (registers the operations)

    assert len(REGISTRY.operations) > 50
    for operation in REGISTRY.operations.values():
        dataclasses.replace(operation)  # (made again: checked again)


def test_a_consistent_operation_is_made() -> None:
    operation = Operation("scaled", Kind.AFFINE, functions=(torch.mul,), relevance=_relevance,
                          factors=lambda args, kwargs: args[:2], default_rule=Epsilon)
    assert operation.factors is not None


def test_the_registry_loads_nothing_and_the_loader_fills_it() -> None:
    """The registry only holds what is registered (issue 56): importing it registers no operation,
    and an extension of an operation not registered yet is refused; importing the loader registers
    the core's operations, which a lookup then finds."""
    import subprocess
    import sys

    code = ("import torch; from torch import nn; from fxlrp.registry import REGISTRY; "
            "assert not REGISTRY.operations, sorted(REGISTRY.operations); "
            "assert REGISTRY.for_module(nn.ReLU()) is None, 'module'\n"
            "try:\n    REGISTRY.extend('view', functions=(torch.positive,))\n"
            "except ValueError as error:\n    print(error)\n"
            "import fxlrp.explain.loader\n"
            "assert REGISTRY.for_module(nn.ReLU()).name == 'relu', 'module'; "
            "assert REGISTRY.for_function(torch.index_select).name == 'view', 'function'; "
            "REGISTRY.extend('view', functions=(torch.positive,)); print(len(REGISTRY.operations))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    refusal, count = done.stdout.strip().splitlines()
    assert refusal.startswith("no operation 'view' is registered") and int(count) > 50
