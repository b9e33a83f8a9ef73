"""A Griffe extension for the API reference: public names under their public paths.

``ultimat3.jobs`` exports the decorator ``job`` from its private module of the same name,
``ultimat3/jobs/job.py``. Python gives the package attribute to the function (the import
runs after the submodule is loaded); Griffe, which can hold one member per name, keeps the
submodule, so ``::: ultimat3.jobs.job`` would render the private module. Once the package is
loaded, this extension resolves every alias that points into a shadowed submodule (so that
``ultimat3.jobs.JobContext`` still finds ``ultimat3.jobs.job.JobContext``), then gives the
package's name to the exported object, as Python does.

It also reads the ``#:`` comments above an attribute as its docstring (Sphinx's convention,
used across the package for dataclass fields and constants), and reads reST's literal-block
marker in docstrings as Markdown does not: a paragraph
ending in ``::`` ends in ``:``, and a lone ``::`` goes, the indented block after it staying
a code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_LONE_MARKER = re.compile(r"(?m)^[ \t]*::[ \t]*\n(?:[ \t]*\n)?")
_TRAILING_MARKER = re.compile(r"(?m)(\S)::[ \t]*$")

#: package path -> names in its ``__all__`` that are both a submodule and the exported object.
SHADOWED = {"ultimat3.jobs": ("job",)}


def _markdown(obj: griffe.Object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if obj.docstring is not None:
        text = _LONE_MARKER.sub("", obj.docstring.value)
        obj.docstring.value = _TRAILING_MARKER.sub(r"\1:", text)
    for member in obj.members.values():
        if not member.is_alias:
            _markdown(member, seen)  # type: ignore[arg-type]


def _walk(obj: griffe.Object, seen: set[int]) -> Any:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for member in list(obj.members.values()):
        if member.is_alias:
            yield member
            continue
        yield from _walk(member, seen)  # type: ignore[arg-type]


class PublicPaths(griffe.Extension):
    """Give a shadowed name of a package's ``__all__`` to the object it exports."""

    def on_attribute(
        self, *, attr: griffe.Attribute, loader: griffe.GriffeLoader, **kwargs: Any
    ) -> None:
        if attr.docstring is not None or attr.lineno is None or attr.filepath is None:
            return
        lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
        comment: list[str] = []
        at = attr.lineno - 2
        while at >= 0 and lines[at].lstrip().startswith("#:"):
            comment.insert(0, lines[at].lstrip()[2:].strip())
            at -= 1
        if comment:
            attr.docstring = griffe.Docstring(
                " ".join(comment),
                lineno=at + 2,
                endlineno=attr.lineno - 1,
                parent=attr,
                parser=loader.docstring_parser,
                parser_options=loader.docstring_options,
            )

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        _markdown(pkg, set())
        for package_path, names in SHADOWED.items():
            if not package_path.startswith(pkg.path):
                continue
            package = loader.modules_collection.get_member(package_path)
            for name in names:
                submodule = package.members[name]
                if not submodule.is_module:
                    continue
                exported = submodule.members[name]
                prefix = f"{submodule.path}."
                for alias in _walk(loader.modules_collection.get_member(pkg.path), set()):
                    if alias.target_path.startswith(prefix):
                        try:
                            alias.resolve_target()
                        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                            pass
                package.set_member(name, griffe.Alias(name, exported, parent=package))
