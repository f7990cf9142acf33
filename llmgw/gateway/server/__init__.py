"""The gateway process: gunicorn, its worker, the app factory."""
