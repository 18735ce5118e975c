"""The core's loading wing (see cwviz/core/__init__.py)."""
