"""The command line: ``cwviz <command> ...`` (or ``python -m cwviz``); see :mod:`cwviz.cli.main`."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
