"""The composites the command line names (``--composite``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxlrp import rules
from fxlrp.app.cli_options import COMPOSITE_NAMES, InputError
from fxlrp.app.preprocessing import Preprocessing
from fxlrp.rules import composites


def _composite_factories() -> dict[str, Callable[[Preprocessing], Any]]:
    """The composite for each name of :data:`COMPOSITE_NAMES`; EpsilonGammaBox gets the input's bounds."""
    return {
        "epsilon": lambda _: rules.Epsilon(1e-6),
        "lrp0": lambda _: rules.Epsilon(0.0),
        "epsilon_plus": lambda _: composites.EpsilonPlus(),
        "epsilon_plus_flat": lambda _: composites.EpsilonPlusFlat(),
        "epsilon_alpha2_beta1": lambda _: composites.EpsilonAlpha2Beta1(),
        "epsilon_alpha2_beta1_flat": lambda _: composites.EpsilonAlpha2Beta1Flat(),
        "epsilon_gamma_box": lambda preprocessing: composites.EpsilonGammaBox(*preprocessing.input_bounds()),
        "attnlrp": lambda _: composites.AttnLRP(),
        "cplrp": lambda _: composites.CPLRP(),
    }


def composite_names() -> list[str]:
    """The composite names the command line accepts.

    Returns
    -------
    list of str
        The names its ``--help`` lists, each known to :func:`composite_by_name`.
    """
    return list(COMPOSITE_NAMES)


def composite_by_name(name: str, preprocessing: Preprocessing) -> Any:
    """The composite (or single rule) for a command-line name such as ``epsilon_plus_flat``."""
    factories = _composite_factories()
    key = name.lower().replace("-", "_")
    if key not in factories:
        raise InputError(f"unknown composite {name!r}; choose one of {', '.join(factories)}")
    return factories[key](preprocessing)
