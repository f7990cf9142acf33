"""One request's path: access, body checks, routing, on-demand starts, retries, relay,
upstream, limits, usage."""
