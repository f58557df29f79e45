"""Tests of fxlrp's parts: rules, the relevance engine, operations, the registry, capture, graph
passes, the eager path, properties and robustness, on small models written for each test."""
