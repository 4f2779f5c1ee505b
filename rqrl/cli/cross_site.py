"""rq-dashboard's actions refused when another site sends them: the dashboard's answer to cross-site request forgery.

rq-dashboard 0.9's buttons (requeue, delete, empty, compact) post to its URLs with no CSRF token, and its
requeue-all answers GET too: a page that the operator's browser opens could send them to the dashboard, with
the login (HTTP Basic Auth) the browser holds. Browsers say where a request comes from: ``Sec-Fetch-Site``
(every current browser) and ``Origin`` (on every POST). A request that would change something is refused
(403) unless it comes from the dashboard's own pages, or from a client that is no browser and says nothing
(curl, a script: it holds no browser's login to abuse). Pages and their data stay open to links from
anywhere: reading them changes nothing.
"""

from __future__ import annotations

import urllib.parse

from flask import Response, request

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CHANGING_GET_ENDPOINTS = frozenset({"requeue_all"})
"""rq-dashboard's views that change something on a GET too."""
OWN_SITES = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` of the dashboard's own pages, and of a request the operator made (typed, bookmarked)."""

__all__ = ["refuse_cross_site_actions"]


def refuse_cross_site_actions() -> Response | None:
    """Flask's ``before_request``: a 403 for a request that would change something and comes from another site;
    None (carry on) for everything else."""
    endpoint = (request.endpoint or "").rsplit(".", 1)[-1]
    if request.method in SAFE_METHODS and endpoint not in CHANGING_GET_ENDPOINTS:
        return None
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if site is not None:
        if site in OWN_SITES:
            return None
    elif origin is None or urllib.parse.urlsplit(origin).netloc == request.host:
        return None
    sender = origin or f"a {site} page"
    message = (f"rqrl dashboard refused {request.method} {request.path} sent by {sender}: its actions carry no "
               f"CSRF token, so only its own pages may send them; use the dashboard's buttons, or curl")
    return Response(message, status=403, mimetype="text/plain")
