"""The core's util wing (see cwviz/core/__init__.py)."""
