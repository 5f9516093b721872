"""Code more than one benchmark runs: clients, timing, the serving-overhead paths, the papers' scenarios and the
perfmodel checks."""
