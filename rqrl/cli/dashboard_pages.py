"""What rq-dashboard's pages may run, and how they show what Redis holds: as text, never as markup.

rq-dashboard 0.9 draws its tables in the browser with underscore templates that interpolate the JSON it
serves with ``<%= %>`` (no escaping), so a queue name, worker name, job description, origin, traceback or
metadata that a Redis writer chose would run as script in the origin that holds the requeue and delete
actions. Its jobs page also writes the queue name from the URL into a JavaScript string unescaped (Flask
escapes ``.html`` templates only).

rqrl rewrites rq-dashboard's own templates as Jinja loads them (:func:`rewrite_template`) rather than shipping
copies: every ``<%= %>`` becomes underscore's escaping ``<%- %>`` (the two places that already escape through
jQuery keep one escape), Jinja escapes its ``.js`` templates and quotes values in them with ``tojson``, and the
one inline script block of each page carries this response's nonce. Each response then carries a
Content-Security-Policy (:func:`content_security_policy`) that runs only rq-dashboard's own files and that
nonced block, so markup that slipped through would still run nothing. If an rq-dashboard upgrade changes its
pages so that the nonce no longer lands, the policy blocks its script and the pages stop working rather than
opening up; tests/unit/test_dashboard_pages.py checks the rewrite against the installed templates.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

import jinja2
from flask import Response, g

NONCE_ATTRIBUTE = ' nonce="{{ csp_nonce() }}"'
"""What each inline script block gains: the nonce of the response that renders it (see :func:`csp_nonce`)."""

_PRE_ESCAPED = re.compile(r"<%=\s*\$\('<div/>'\)\.text\((?P<value>[^%]+?)\)\.html\(\)\s*%>")
_QUOTED_JINJA = re.compile(r"'\{\{\s*(?P<value>[^{}|]+?)\s*\}\}'")
_INLINE_SCRIPT = re.compile(r"<script\b(?P<attributes>(?![^>]*\b(?:src|nonce)\s*=)(?![^>]*text/template)[^>]*)>")


def rewrite_template(name: str, source: str) -> str:
    """rq-dashboard's template ``name`` with every Redis-fed value escaped and its inline script nonced."""
    source = _PRE_ESCAPED.sub(r"<%- \g<value> %>", source)  # escaped by jQuery already: escape once, not twice
    source = source.replace("<%=", "<%-")
    source = _INLINE_SCRIPT.sub(lambda found: f"<script{NONCE_ATTRIBUTE}{found['attributes']}>", source)
    if not name.endswith((".html", ".htm")):  # scripts included into an inline <script>: Flask escapes none
        source = _QUOTED_JINJA.sub(r"{{ \g<value> | tojson }}", source)
        source = "{% autoescape true %}" + source + "{% endautoescape %}"
    return source


class EscapingLoader(jinja2.BaseLoader):
    """A Jinja loader that hands out another loader's templates rewritten by :func:`rewrite_template`."""

    def __init__(self, upstream: jinja2.BaseLoader) -> None:
        self.upstream = upstream

    def get_source(self, environment: jinja2.Environment,
                   template: str) -> tuple[str, str | None, Callable[[], bool] | None]:
        source, filename, uptodate = self.upstream.get_source(environment, template)
        return rewrite_template(template, source), filename, uptodate

    def list_templates(self) -> list[str]:
        return self.upstream.list_templates()


def escaping(loader: Any) -> Any:
    """``loader`` wrapped in an EscapingLoader (once); None stays None."""
    if loader is None or isinstance(loader, EscapingLoader):
        return loader
    return EscapingLoader(loader)


def csp_nonce() -> str:
    """This response's script nonce, made on first use: unguessable, so planted markup cannot carry it."""
    if "rqrl_csp_nonce" not in g:
        g.rqrl_csp_nonce = secrets.token_urlsafe(18)
    nonce: str = g.rqrl_csp_nonce
    return nonce


def content_security_policy(nonce: str) -> str:
    """The policy of every dashboard response: scripts only from the dashboard's files and its nonced block."""
    return "; ".join([
        "default-src 'none'",
        # no 'unsafe-inline': planted handlers (onerror=) and <script> blocks never run. 'unsafe-eval' because
        # underscore's _.template compiles rq-dashboard's row templates with new Function; their source is the
        # page's, and Redis text reaches them only as escaped data
        f"script-src 'self' 'nonce-{nonce}' 'unsafe-eval'",
        "style-src 'self' 'unsafe-inline'",  # style="..." attributes in rq-dashboard's markup; no script
        "img-src 'self' data:",  # Bootstrap's stylesheet draws its form controls as data: SVGs
        "font-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ])


def add_security_headers(response: Response) -> Response:
    """Every response: the script policy, no framing, and no guessing a JSON reply into a script."""
    response.headers["Content-Security-Policy"] = content_security_policy(csp_nonce())
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
