"""Operation is made of typed parts (issue 56): a variant of how relevance propagates declares only
the facts that mean something for it, so a contradiction cannot be written."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fxlrp.registry import REGISTRY, Affine, Decomposed, Kind, Native, Pass, Propagation, Routed, Spelling, ValueFlow
from fxlrp.rules import Epsilon


def _relevance(call, function, *args, **kwargs):
    return function(*args, **kwargs)


_FACTS = ("weighted", "default_rule", "factors", "output_free_backward", "gradient_native", "source", "holds_layers")
_VARIANTS = {Affine: (_relevance,), Pass: (_relevance,), Native: (), Routed: (_relevance,), Decomposed: (_relevance,)}


@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_a_fact_a_variant_does_not_declare_cannot_be_given_and_reads_as_the_default(variant) -> None:
    declared = {field.name for field in dataclasses.fields(variant)}
    made = variant(*_VARIANTS[variant])
    for fact in _FACTS:
        if fact in declared:
            continue
        with pytest.raises(TypeError):
            variant(*_VARIANTS[variant], **{fact: True})
        if fact not in vars(variant):  # (a variant may fix one: a Decomposed holds layers)
            assert getattr(made, fact) == getattr(Propagation, fact), fact


@pytest.mark.parametrize("variant", [Affine, Pass, Routed, Decomposed])
def test_a_variant_that_runs_a_relevance_function_needs_one(variant) -> None:
    with pytest.raises(TypeError):
        variant()
    assert Native().relevance is None


def test_the_kind_follows_the_variant() -> None:
    assert [variant(*_VARIANTS[variant]).kind for variant in (Affine, Pass, Native, Routed)] == [
        Kind.AFFINE, Kind.PASS, Kind.NATIVE, Kind.NATIVE]
    assert Decomposed(_relevance).kind is Kind.NATIVE and Decomposed(_relevance, weighted=True).kind is Kind.AFFINE
    assert Decomposed(_relevance).holds_layers and not Affine(_relevance, weighted=True).holds_layers


def test_a_fact_of_some_spellings_holds_for_those_only() -> None:
    flow = ValueFlow(index_arguments={"gather": (2,)}, aliasing=frozenset({"view", torch.reshape}),
                     keeps_rank=frozenset({torch.nn.Identity}))
    assert flow.index_positions("gather") == (2,) and flow.index_positions("clone") == ()
    assert flow.may_alias("view") and flow.may_alias(torch.reshape) and not flow.may_alias(torch.clone)
    assert flow.keeps_rank_of(torch.nn.Identity) and not flow.keeps_rank_of(torch.nn.Flatten)
    assert ValueFlow(index_arguments=(1,)).index_positions("anything") == (1,)


def test_the_registry_answers_which_calls_squash_functions_and_methods_alike() -> None:
    import fxlrp.explain.loader  # noqa: F401  (registers the operations)

    squashing = REGISTRY.callables_where(lambda operation: operation.flow.saturates)
    assert {torch.softmax, torch.sigmoid, torch.nn.functional.softmax, torch.Tensor.softmax,
            torch.Tensor.sigmoid} <= squashing
    assert torch.tanh not in squashing and torch.Tensor.relu not in squashing


def test_a_consistent_operation_is_made() -> None:
    from fxlrp.registry import Operation

    operation = Operation("scaled", Spelling(functions=(torch.mul,)),
                          Affine(_relevance, factors=lambda args, kwargs: args[:2], default_rule=Epsilon))
    assert operation.propagation.factors is not None and operation.flow == ValueFlow()


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
