"""The core's method wing (see cwviz/core/__init__.py)."""
