"""What several test modules share: models, seeded inputs, parameter grids, reference checks,
the lowering helper, damaged-file sweeps, tiny model configs. Plain code, no fixtures: those
live in tests/conftest.py. The `pythonpath` option in pyproject.toml puts tests/ on the path."""
