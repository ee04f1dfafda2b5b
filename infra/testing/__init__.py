"""duly's pytest plugin (`pytest_plugin`), registered as the `pytest11` entry point."""
