"""Code the tests share: references computed without fxlrp, small models, model zoos, PyG
networks, data-set factories and a stand-in plug-in library. Imported as ``support.*``
(``tests`` is on the path: pyproject.toml's ``pythonpath``); no test module imports another."""
