"""Every process-wide patch of fxlrp.capture.interception is undone on exit (also when the body
raises), acts on the entering thread only, and nests."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch import nn
from torch.autograd.function import Function

from fxlrp.capture import interception


def library_function(x, scale=2, *, shift=1):
    return x * scale + shift


class Doubling(Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def function_state(function):
    return function.__code__, function.__defaults__, function.__kwdefaults__, dict(function.__globals__)


def global_module_hooks():
    from torch.nn.modules import module
    return (len(module._global_forward_pre_hooks), len(module._global_forward_hooks))


def in_other_thread(call):
    results = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join()
    return results[0]


@pytest.mark.parametrize("raises", [False, True])
def test_intercepted_calls_hand_calls_to_the_handler_and_give_the_function_back(raises):
    before = function_state(library_function)
    seen = []

    def handler(function, args, kwargs, original):
        seen.append((function, args, kwargs))
        return original(*args, **kwargs) + 100

    with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
        with interception.intercepted_calls([library_function], handler):
            assert library_function(1) == 103  # handler on this thread, with the defaults kept
            assert library_function(1, 3, shift=0) == 103
            assert in_other_thread(lambda: library_function(1)) == 3  # another thread: as it is
            with interception.intercepted_calls([library_function], lambda f, a, k, o: -1):
                assert library_function(1) == -1  # the innermost handler
            assert library_function(1) == 103
            if raises:
                raise RuntimeError("the body failed")
    assert function_state(library_function) == before
    assert library_function(1) == 3
    assert [call[0] for call in seen] == [library_function] * 3


@pytest.mark.parametrize("raises", [False, True])
def test_intercepted_applications_give_function_apply_back(raises):
    own_apply = Function.__dict__["apply"]
    x = torch.ones(2)

    def handler(function, args, kwargs, own):
        return own(*args, **kwargs) + 1

    with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
        with interception.intercepted_applications(handler):
            assert torch.equal(Doubling.apply(x), 2 * x + 1)
            assert torch.equal(in_other_thread(lambda: Doubling.apply(x)), 2 * x)
            if raises:
                raise RuntimeError("the body failed")
    assert Function.__dict__["apply"] is own_apply
    assert torch.equal(Doubling.apply(x), 2 * x)


@pytest.mark.parametrize("raises", [False, True])
def test_module_calls_followed_see_this_threads_calls_and_remove_their_hooks(raises):
    before = global_module_hooks()
    layer, calls = nn.Linear(2, 2), []
    with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
        with interception.module_calls_followed(lambda module, args: calls.append(("before", module)),
                                                lambda module, args, output: calls.append(("after", module))):
            layer(torch.ones(1, 2))
            in_other_thread(lambda: layer(torch.ones(1, 2)))
            if raises:
                raise RuntimeError("the body failed")
    assert calls == [("before", layer), ("after", layer)]
    assert global_module_hooks() == before
    layer(torch.ones(1, 2))
    assert len(calls) == 2


def test_checkpoints_run_their_function_as_written_and_are_given_back():
    checkpoint = interception.CHECKPOINT
    before = function_state(checkpoint)
    layer = nn.Linear(2, 2)
    with interception.checkpoints_run_their_function():
        result = torch.utils.checkpoint.checkpoint(layer, torch.ones(1, 2), use_reentrant=False)
        assert result.grad_fn.name() == "AddmmBackward0"  # the layer's own graph, not a recomputation
    assert function_state(checkpoint) == before

