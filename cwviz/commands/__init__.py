"""CLI commands; each module has ``register(subparsers)``. Add a command by listing its module here."""

from . import analyze, faithfulness, sinks

COMMANDS = [analyze, faithfulness, sinks]
