"""Every report's Markdown table goes through `regen.display.figures.markdown_table`."""

from __future__ import annotations

from regen.display.figures import markdown_table


def test_header_rule_and_rows_with_numeric_columns_right_aligned() -> None:
    lines = markdown_table(["server", "tok/s"], [("s0", "1,230"), ("s1", 7)], numeric={"tok/s"})
    assert lines == ["| server | tok/s |", "| --- | --: |", "| s0 | 1,230 |", "| s1 | 7 |"]


def test_a_pipe_or_newline_in_a_cell_cannot_break_the_table() -> None:
    """A server's error text or a node's problem is free text: one row stays one row."""
    lines = markdown_table(["node", "problem"], [("n1", "exit 1 | see log\nline two")])
    assert lines[2] == "| n1 | exit 1 \\| see log line two |"
    assert lines[2].count(" | ") == 1
