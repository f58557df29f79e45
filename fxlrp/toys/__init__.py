"""Toy tasks that train in seconds on a CPU, for the demo, the examples and the tests.

- :mod:`fxlrp.toys.digits`: scikit-learn's bundled 8x8 digits and a small CNN.
- :mod:`fxlrp.toys.infection`: generated "infection" graphs (which nodes get sick, who infects
  whom) and a scatter-based graph network.

Nothing here is downloaded: the digits ship with scikit-learn, the graphs are generated.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_thread() -> Iterator[None]:
    """Run with one intra-op thread, restoring the setting after.

    The toy models are so small that several threads only add synchronisation; on a machine
    whose cores are busy, threads that wait for each other can make a small training run many
    times slower than one thread.

    Yields
    ------
    None
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
