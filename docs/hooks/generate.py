"""mkdocs hook: the parts of the docs written from the code at every build, so they
cannot drift from it.

- ``<!-- cli-reference -->`` (docs/reference/cli.md) becomes ``hooktrace --help`` and each
  verb's ``--help``, as ``hooktrace.cli.build_parser()`` prints them now;
  tests/unit/test_docs.py checks that every verb and every flag is on the built page.
- ``<!-- docstring: PATH -->`` becomes the module docstring of the repository file PATH
  (read with ``ast``, nothing imported; up to its ``Example:``) as a text block: the file layouts that
  hooktrace/format/ documents where it reads them (docs/format.md).

The docstrings are written for ``help()`` and use a few Sphinx roles (``:class:`X```);
mkdocstrings renders them as Markdown, so ``on_page_content`` drops the role names
(``:class:<code>X</code>`` becomes ``<code>X</code>``, ``~a.b.X`` becomes ``X``) and
``Example::`` reads ``Example:``.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
DOCSTRING = re.compile(r"<!-- docstring: (\S+) -->")
ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(?=<code>)")
LITERAL_COLON = re.compile(r"::(?=</p>)")
SHORT_NAME = re.compile(r"<code>~(?:[\w.]+\.)?(\w+)</code>")
ROOT = Path(__file__).resolve().parents[2]
WIDTH = "80"  # argparse wraps to $COLUMNS: fixed, so the page is the same everywhere


def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each verb's parser, in the order ``hooktrace --help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def reference() -> str:
    from hooktrace.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parser.prog = "hooktrace"
        out = ["## hooktrace", "", "```text", parser.format_help().rstrip(), "```", ""]
        helps = {a.dest: a.help for a in _choices_actions(parser)}
        for name, sub in verbs(parser).items():
            out += [f"## hooktrace {name}", "", helps.get(name) or "", "",
                    "```text", sub.format_help().rstrip(), "```", ""]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(out)


def _choices_actions(parser: argparse.ArgumentParser) -> list[Any]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action._choices_actions)
    return []


def docstring(path: str) -> str:
    """The module docstring of ``path`` (relative to the repository) as a text block."""
    text = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8")))
    if not text:
        raise ValueError(f"{path}: no module docstring to include in the docs")
    text = re.split(r"^Examples?:$", text, maxsplit=1, flags=re.M)[0]  # doctests stay there
    return "\n".join(["```text", text.rstrip(), "```"])


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference())
    return DOCSTRING.sub(lambda m: docstring(m.group(1)), markdown)


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    return SHORT_NAME.sub(r"<code>\1</code>", LITERAL_COLON.sub(":", ROLE.sub("", html)))
