"""Text functions of the docs hooks (generate.py, method_pages.py): Markdown-safe prose and code spans for generated
tables, and a docstring's first sentence."""

from __future__ import annotations

import re


def escape(text: str) -> str:
    """Markdown-safe prose for a table cell or a paragraph: `&`, `<`, `>`, `*`, brackets and `|` escaped outside
    code spans; a code span holding `|` becomes HTML (a table would split it, and `\\|` shows inside code)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
            part = part.replace("[", r"\[").replace("]", r"\]").replace("|", r"\|")
        elif "|" in part:
            part = code_span(part[1:-1])
        out.append(part)
    return "".join(out)


def code_span(text: str) -> str:
    """An inline code span, as HTML where it holds `|` or a backtick (safe in a table cell)."""
    if "|" in text or "`" in text:
        inner = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
        return f"<code>{inner}</code>"
    return f"`{text}`"


def first_sentence(doc: str | None) -> str:
    if not doc:
        return ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "`")
    match = re.match(r"(.+?[.])\s+(?=[A-Z])", paragraph)
    return match.group(1) if match else paragraph


__all__ = ["code_span", "escape", "first_sentence"]
