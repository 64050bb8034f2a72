"""griffe extension: Sphinx roles in the docstrings shown as code, not as role syntax.

gpufeed's docstrings are Google style but name other objects with Sphinx roles
(``:class:`Batcher```, ``:func:`~gpufeed.models.load_model```), which Markdown would print as
they are, colons and all. This turns each into a code span of the name (the last component for
a ``~`` reference, as Sphinx shows it), so the API reference reads as the source means it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``:role:`name``` -> ```name```; ``:role:`~a.b.c``` -> ```c```."""
    return _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring's Sphinx roles as code spans when griffe creates its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Each object as griffe creates it: its docstring, if any, without role syntax."""
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
