"""One request's path: access, body checks, the prompt's prefix key, an on-demand engine's
lease, retries, relay, limits, usage."""
