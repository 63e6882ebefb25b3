"""Reports of a :class:`anpred.judge.CheckReport`: terminal text, versioned JSON, HTML with plots."""

from anpred.report.html import write_html
from anpred.report.json import read_json, write_json
from anpred.report.text import format_text

__all__ = ["format_text", "write_json", "read_json", "write_html"]
