"""Workflow commands (`::error file=…,line=…,col=…,title=RULE::message`) for Actions runners."""

from __future__ import annotations

from typing import TextIO

from llmgw.findings import Finding


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def report(findings: list[Finding], stream: TextIO, *, color: bool = False) -> None:
    for f in findings:
        props = (
            f"file={_escape_property(f.file)},line={f.line},col={f.column},title={_escape_property(f.rule)}"
        )
        stream.write(f"::{f.severity} {props}::{_escape_data(f.message)}\n")
