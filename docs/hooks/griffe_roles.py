"""A griffe extension of the API pages (``mkdocs.yml``: the python handler's ``extensions``): cwviz's docstrings
cross-reference in Sphinx roles (``:class:`~cwviz.core.util.errors.InputError```), which Markdown would show as they are
typed; each role becomes inline code of its target (``~`` keeps the last name, as Sphinx does)."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|meth|func|attr|data|exc|obj|const):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx cross-reference role written as inline code."""
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
