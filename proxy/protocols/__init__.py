"""Other APIs translated to and from chat completions (pure functions, no I/O)."""
