"""``cwviz app``: start the dashboard (``streamlit run app.py`` with the shipped settings)."""

from __future__ import annotations

import argparse

from ..app import launch


def run(args: argparse.Namespace) -> int:
    return launch.run(list(args.streamlit_args))
