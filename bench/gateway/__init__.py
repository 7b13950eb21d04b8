"""Gateway overhead benchmark (``python -m bench.gateway``; see ``__main__``'s docstring)."""
