"""rqrl/cli/dashboard_pages.py against the rq-dashboard templates installed here: after the rewrite no
underscore template interpolates unescaped, nothing is escaped twice, every inline script block takes the
response's nonce, and a value Jinja writes into a script is a JSON string. An rq-dashboard upgrade that the
rewrite no longer fits fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import rq_dashboard

from rqrl.cli.dashboard_pages import NONCE_ATTRIBUTE, EscapingLoader, content_security_policy, rewrite_template

TEMPLATES = Path(rq_dashboard.__file__).parent / "templates"
INSTALLED = jinja2.FileSystemLoader(TEMPLATES)
JS_QUEUE = "q')}});document.title='xss';$('x').on('y',function(){if(1){$(this).val('</script>\\"


def installed(name: str) -> str:
    """The source of rq-dashboard's template ``name`` as installed."""
    return INSTALLED.get_source(jinja2.Environment(), name)[0]


def rewritten() -> dict[str, str]:
    """Every installed rq-dashboard template, rewritten, by name."""
    return {name: rewrite_template(name, installed(name)) for name in INSTALLED.list_templates()}


def test_every_underscore_interpolation_escapes_and_none_escapes_twice():
    before = "".join(installed(name) for name in INSTALLED.list_templates())
    after = "".join(rewritten().values())
    assert before.count("<%=") >= 30, "rq-dashboard's templates interpolate with <%= %>: the rewrite has work"
    assert "<%=" not in after
    assert after.count("<%-") == before.count("<%=") + before.count("<%-")
    assert "$('<div/>').text(" in before and "$('<div/>').text(" not in after
    assert "<%- d.description %>" in rewritten()["rq_dashboard/jobs.html"]


def test_the_one_inline_script_of_the_base_page_gets_the_nonce_and_no_other_script_does():
    tags = {name: re.findall(r"<script\b[^>]*>", source) for name, source in rewritten().items()}
    nonced = [(name, tag) for name, found in tags.items() for tag in found if "nonce" in tag]
    assert nonced == [("rq_dashboard/base.html", f'<script{NONCE_ATTRIBUTE} type="text/javascript">')]
    for name, found in tags.items():
        for tag in found:
            assert "nonce" in tag or "src=" in tag or "text/template" in tag, (name, tag)


def test_a_queue_name_in_the_jobs_pages_script_stays_a_string():
    environment = jinja2.Environment(loader=EscapingLoader(INSTALLED), autoescape=False)
    script = environment.get_template("rq_dashboard/scripts/jobs.js").render(
        queue={"name": JS_QUEUE}, registry_name="failed", per_page=8, order="asc", page=1)

    literals = re.findall(r'\$\(this\)\.val\(("(?:[^"\\\n]|\\.)+")\);', script)  # the mouseleave handler's
    assert [json.loads(literal) for literal in literals] == [JS_QUEUE], script
    assert "</script>" not in script and "'xss'" not in script


def test_the_script_policy_runs_no_inline_script_and_allows_no_framing():
    directives = {part.split()[0]: part.split()[1:] for part in content_security_policy("n0nce").split("; ")}

    assert directives["default-src"] == ["'none'"]
    assert directives["script-src"] == ["'self'", "'nonce-n0nce'", "'unsafe-eval'"]
    assert directives["frame-ancestors"] == ["'none'"] and directives["base-uri"] == ["'none'"]
