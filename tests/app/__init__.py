"""The command, data sets, pictures and text, the examples and the demo."""
