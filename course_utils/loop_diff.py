"""Two functions compared line by line: the code lines they differ by, and a side-by-side table (lessons 1 and 5).

Lesson 1 shows that the Accelerate loop is the plain loop with a few lines
changed; lesson 5 shows each feature loop as lesson 1's Accelerate loop plus its
block. :func:`loop_changes` lists the changed code lines (what the drift tests
assert), :func:`loop_diff_html` shows them side by side, and :func:`code_lines`
gives a function's code lines alone, without docstring, comments or blank lines.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap

from course_utils.loops import train_accelerate, train_plain
from course_utils.validation import check_python_function


def code_lines(function):
    """Return the lines of ``function``'s source without its docstring, comment-only lines and blank lines.

    Lines keep their indentation, relative to the ``def`` line.
    """
    return [line for line in _source_without_docstring(function) if line.strip() and not line.strip().startswith("#")]


def loop_changes(before=train_plain, after=train_accelerate):
    """Return ``(removed, added)``: the code lines (stripped) that only ``before``, or only ``after``, has.

    Comments, blank lines and docstrings are left out, as in Accelerate's own
    check of its examples; the lines are compared in order (``difflib``).
    """
    before_lines = [line.strip() for line in code_lines(before)]
    after_lines = [line.strip() for line in code_lines(after)]
    removed, added = [], []
    for line in difflib.ndiff(before_lines, after_lines):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


class _WordWrappingHtmlDiff(difflib.HtmlDiff):
    """difflib's side-by-side table, wrapping long lines between words instead of at a fixed column.

    difflib cuts a long line at exactly ``wrapcolumn`` characters, often in the
    middle of an identifier (``lr_sche`` / ``duler``); this cuts at the last
    space before that column, when the line has one after its indentation.
    """

    def _split_line(self, data_list, line_num, text):
        limit = self._wrapcolumn
        # difflib marks changes with "\0+", "\0-", "\0^" (start) and "\1" (end), which take no column.
        if not line_num or len(text) - 3 * text.count("\0") <= limit:
            data_list.append((line_num, text))
            return
        i = column = 0
        mark, seen_text, cut = "", False, None
        while column < limit and i < len(text):
            if text[i] == "\0":
                mark, i = text[i + 1], i + 2
            elif text[i] == "\1":
                mark, i = "", i + 1
            else:
                if text[i] == " " and seen_text:
                    cut = (i + 1, mark)  # after the space: the next line starts with a word
                seen_text = seen_text or text[i] != " "
                i, column = i + 1, column + 1
        if cut is not None and i < len(text) and text[i] not in " \0\1":
            i, mark = cut  # the column falls inside a word: cut at the last space instead
        line1, line2 = text[:i], text[i:]
        if mark:  # the cut falls inside a change: close it on this line, reopen it on the next
            line1, line2 = line1 + "\1", "\0" + mark + line2
        data_list.append((line_num, line1))
        self._split_line(data_list, ">", line2)


def loop_diff_html(before=train_plain, after=train_accelerate):
    """Return an HTML table showing two functions side by side, the changed lines highlighted."""
    diff = _WordWrappingHtmlDiff(tabsize=4, wrapcolumn=76)
    before_lines = _source_without_docstring(before)
    after_lines = _source_without_docstring(after)
    table = diff.make_table(before_lines, after_lines, fromdesc=before.__name__, todesc=after.__name__)
    # make_table comes without difflib's colours, and JupyterLab's own table style
    # right-aligns cells in a proportional font: restore both, so code keeps its indentation.
    style = (
        "<style>" + diff._styles
        + "table.diff td {text-align: left; font-family: monospace; white-space: pre; font-size: 11px;}</style>"
    )
    return style + table


def _source_without_docstring(function):
    """Return ``function``'s source lines, comments included, without the docstring (the twins' differ)."""
    check_python_function(function, "function")
    source = textwrap.dedent(inspect.getsource(function))
    lines = source.splitlines()
    first = ast.parse(source).body[0].body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = lines[: first.lineno - 1] + lines[first.end_lineno:]
    return [line.rstrip() for line in lines]

