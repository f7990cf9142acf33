"""The gateway process: gunicorn, its worker, settings, the app factory."""
