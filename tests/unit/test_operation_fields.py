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
    REGISTRY.complete()
    assert len(REGISTRY.operations) > 50
    for operation in REGISTRY.operations.values():
        dataclasses.replace(operation)  # (made again: checked again)


def test_a_consistent_operation_is_made() -> None:
    operation = Operation("scaled", Kind.AFFINE, functions=(torch.mul,), relevance=_relevance,
                          factors=lambda args, kwargs: args[:2], default_rule=Epsilon)
    assert operation.factors is not None


def test_the_registry_is_whole_before_anything_converts() -> None:
    """``import fxlrp`` loads no operations; a lookup or an extension made first finds them all."""
    import subprocess
    import sys

    code = ("import torch; from torch import nn; from fxlrp.registry import REGISTRY; "
            "assert REGISTRY.for_module(nn.ReLU()).name == 'relu', 'module'; "
            "assert REGISTRY.for_function(torch.index_select).name == 'view', 'function'; "
            "REGISTRY.extend('view', functions=(torch.positive,)); print(len(REGISTRY.operations))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 50


def test_torchs_own_functions_are_registered_when_a_library_imported_first_wrapped_them() -> None:
    """PyG puts a wrapper in the place of ``torch.index_select`` when it is imported; imported
    before fxlrp's operations, torch's own function must still be found (a model traced with it)."""
    import subprocess
    import sys

    code = ("import torch, torch_geometric; from fxlrp.registry import REGISTRY; "
            "assert torch.index_select is not torch._C._VariableFunctions.index_select, 'not wrapped'; "
            "print(REGISTRY.for_function(torch._C._VariableFunctions.index_select).name)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "view"
