"""What people read: listing, readiness and admin resources, the dashboard, OpenAPI."""
