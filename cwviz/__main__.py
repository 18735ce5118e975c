"""``python -m cwviz``: see :mod:`cwviz.cli`.

A Ctrl-C while the command line's own modules import, before :func:`cwviz.cli.main.main` runs to handle it, ends
the same way as one during a command's imports: one ``interrupted`` line and status 130, no traceback. (These are
plain Python imports, so the KeyboardInterrupt unwinds; torch's, which it could not, happen later under main's guard.)
"""

import sys

try:
    from .cli import main
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None

raise SystemExit(main())
