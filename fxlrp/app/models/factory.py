"""``--model package.module:FACTORY`` (and ``--data package.module:FACTORY``): an object a module
holds, or what calling it returns."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from fxlrp.app.cli_options import InputError


def imported_object(spec: str, kind: type, what: str) -> Any:
    """``package.module:NAME``: the object NAME if it is a ``kind``, else what calling it returns
    (a class or factory function); a one-line :class:`InputError` if it cannot be imported."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(f"cannot import {module_name!r} for {what} {spec!r}: {error}") from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise InputError(f"{module_name!r} has no attribute {attribute!r} ({what} spec {spec!r})")
    return factory if isinstance(factory, kind) else factory()


def factory_model(spec: str) -> nn.Module:
    """The ``nn.Module`` a ``package.module:FACTORY`` spec names (:func:`imported_object`)."""
    model = imported_object(spec, nn.Module, "model")
    if not isinstance(model, nn.Module):
        raise InputError(f"{spec!r} gives a {type(model).__name__}, not a torch.nn.Module")
    return model
