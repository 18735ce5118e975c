"""``cwviz app``: start the dashboard (``streamlit run app.py`` with the shipped settings)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    parser = sub.add_parser(
        "app",
        help="start the dashboard in the browser",
        description="Start the Streamlit dashboard. Options after the command go to `streamlit run`, "
        "e.g. `cwviz app --server.port 8502 --server.headless true`.",
    )
    parser.add_argument("streamlit_args", nargs=argparse.REMAINDER, help="options for streamlit run")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..app.launch import run as launch

    return launch(list(args.streamlit_args))
