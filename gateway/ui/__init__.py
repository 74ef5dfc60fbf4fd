"""The operator console at /ui: static files from this package, a session cookie, the admin API behind it."""
