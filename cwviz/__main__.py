"""``python -m cwviz``: see :mod:`cwviz.cli`."""

from .cli import main

raise SystemExit(main())
