"""Toy tasks that train in seconds on a CPU, for the demo, the examples and the tests.

- :mod:`fxlrp.toys.digits`: scikit-learn's bundled 8x8 digits and a small CNN.
- :mod:`fxlrp.toys.infection`: generated "infection" graphs (which nodes get sick, who infects
  whom) and a scatter-based graph network.

Nothing here is downloaded: the digits ship with scikit-learn, the graphs are generated.
"""
