"""`llmgw lint --format markdown`: the findings table for a job summary and the comment."""

from __future__ import annotations

import io

from llmgw.findings import Finding
from llmgw.gitops.report import REPORTERS
from llmgw.gitops.report.markdown import MAX_ROWS, code, findings_markdown
from tests.conftest import run_llmgw, write_catalog


def finding(severity: str = "warning", message: str = "no description") -> Finding:
    return Finding("catalog/m.yaml", 3, 1, "description-missing", severity, message)  # type: ignore[arg-type]


def test_markdown_is_a_registered_lint_format() -> None:
    out = io.StringIO()
    REPORTERS["markdown"]([finding()], out, color=False)
    assert out.getvalue().startswith("### Lint: 0 errors, 1 warning\n")


def test_each_finding_is_a_row_naming_where_what_and_rule() -> None:
    md = findings_markdown([finding("error", "bad | pipe")])
    assert "| **error** | `catalog/m.yaml:3:1` | `description-missing` | bad \\| pipe |" in md
    assert "Errors block the merge" in md


def test_no_findings_says_so() -> None:
    assert findings_markdown([]).startswith("### Lint: no findings\n")


def test_a_flood_of_findings_is_cut_with_a_pointer() -> None:
    md = findings_markdown([finding() for _ in range(MAX_ROWS + 5)])
    assert "5 more finding(s) not shown" in md


def test_inline_code_survives_backticks() -> None:
    assert code("a`b") == "``a`b``"


def test_cli_lint_format_markdown_on_the_bundled_catalogue() -> None:
    result = run_llmgw("lint", "catalog", "--fleet", "fleet.yaml", "--format", "markdown")
    assert result.code == 0, result
    assert result.stdout.startswith("### Lint:"), result


def test_cli_lint_format_markdown_reports_an_error_and_exits_1(tmp_path) -> None:
    catalog, fleet = write_catalog(
        tmp_path,
        {"m.yaml": "name: m\ndescription: ''\nsource: hf://a/b\ncontext_length: 8\nprofiles: []\n"},
    )
    result = run_llmgw("lint", catalog, "--fleet", fleet, "--format", "markdown")
    assert result.code == 1, result
    assert "| **error** |" in result.stdout, result


def test_html_in_a_finding_is_shown_as_text_not_rendered() -> None:
    # A catalogue key named `<!--` once went into the comment verbatim and hid what followed.
    md = findings_markdown([finding("error", "unknown field '<!--' & <script>x</script>")])
    assert "unknown field '&lt;!--' &amp; &lt;script&gt;x&lt;/script&gt;" in md, md
    assert "<!--" not in md and "<script>" not in md, md


def test_backticks_in_a_finding_form_no_code_span_where_entities_would_show() -> None:
    md = findings_markdown([finding("error", "key `<x>` unknown")])
    assert "key \\`&lt;x&gt;\\` unknown" in md, md


def test_a_line_break_in_a_finding_stays_in_its_row() -> None:
    md = findings_markdown([finding("error", "one\r\ntwo\nthree")])
    assert "| one<br>two<br>three |" in md, md


def test_a_pipe_in_inline_code_is_escaped_the_way_gfm_tables_read_it() -> None:
    # GFM shows an entity inside a code span as its characters, so `&#124;` read as "&#124;".
    assert code("a|b") == "`a\\|b`"


def test_html_in_inline_code_is_left_to_the_code_span() -> None:
    assert code("catalog/<x>&.yaml") == "`catalog/<x>&.yaml`"


def test_a_line_break_in_inline_code_does_not_end_the_table_row() -> None:
    assert code("catalog/a\nb.yaml") == "`catalog/a b.yaml`"
